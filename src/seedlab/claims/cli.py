"""The commands of ``seedlab claims``: render the pages from the ledger, check the ledger's rules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True)

Root = Annotated[Path, typer.Option(help="the repository root (the ledger is ROOT/docs/claims/)")]


@app.command("render")
def render(
    check: Annotated[bool, typer.Option("--check", help="write nothing: exit 1 when a committed page differs")] = False,
    root: Root = Path("."),
) -> None:
    """Write README's "What we found", docs/results.md's index and each results page's claims table
    from the ledger, between their markers (every page is rendered before any is written)."""
    from seedlab.claims import render as rendering
    from seedlab.claims.schema import load

    ledger = load(root)
    if check:
        stale = [p.summary() for p in rendering.pages(ledger, root) if p.stale]
        if stale:
            typer.echo(f"claims: {len(stale)} page(s) differ from the ledger's rendering: {', '.join(stale)} "
                       "(run: make claims)")
            raise typer.Exit(1)
        typer.echo(f"claims: every page matches the ledger ({len(ledger.claims)} claims)")
        return
    changed = rendering.write(ledger, root)
    typer.echo(f"claims: {len(ledger.claims)} claims; wrote {', '.join(changed)}" if changed
               else f"claims: {len(ledger.claims)} claims; every page already up to date")


@app.command("check")
def check(root: Root = Path(".")) -> None:
    """Check every rule of the ledger (rendered pages up to date, confirmed claims beside a passed
    decision, quoted numbers as their files hold them, withdrawn wordings gone, words that follow status):
    one line per violation, exit 1 if any."""
    from seedlab.claims.checks import check as run_checks
    from seedlab.claims.schema import load

    ledger = load(root)
    violations = run_checks(ledger, root)
    for v in violations:
        typer.echo(str(v))
    if violations:
        raise typer.Exit(1)
    typer.echo(f"claims: {len(ledger.claims)} claims, every rule holds")

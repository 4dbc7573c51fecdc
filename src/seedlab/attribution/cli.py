"""``seedlab attribution``: the attribution study's commands. Each imports what it runs, so that
``seedlab --help`` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from seedlab.cli import config_command

#: the study's presets: ``seedlab presets`` lists them; every CONFIG argument takes one's name
PRESETS = "attribution"

app = typer.Typer(no_args_is_help=True)  # its line in `seedlab --help` is its entry in seedlab.cli.STUDIES


def _names(items: list[str]) -> list[str]:
    """An option given repeatedly or comma-separated (--estimator a,b --estimator c) -> its names, in order."""
    return [n.strip() for item in items for n in item.split(",") if n.strip()]


@app.command("bank", cls=config_command("seedlab.attribution.bank.config:AttributionConfig"))
def attribution_bank(
    config: Annotated[str, typer.Argument(help="attribution config: a YAML file or a preset name, e.g. mini (seedlab presets)")],
    out: Annotated[Path, typer.Option(help="bank folder: seed-<k>/{prefix, twin, replica, candidates/<name>, replicates/<name>, pairs/<first>..<second>}")],
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set candidates.heldout=32")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(help="overwrite a folder holding another bank")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    allow_env_change: Annotated[bool, typer.Option(help="resume under another environment (torch, device, threads...) than the bank started in; recorded in environment.json")] = False,
    executor: Annotated[str, typer.Option(help="local (no services) or ray: where the seeds run")] = "local",
    jobs: Annotated[int, typer.Option(help="seeds at once, each in a process of its own on one thread (1: one after another, here)")] = 1,
    ray_address: Annotated[str | None, typer.Option(help="a running Ray cluster (HOST:PORT or auto); default: start a local one")] = None,
) -> None:
    """Train the bank: per seed a shared prefix, its twin, a replica control and one single-row fork per
    candidate; measure every candidate's effect on every query at every horizon (measured.parquet)."""
    from seedlab.attribution.bank.run import run_bank
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.attribution.bank.rundir import BankDir
    from seedlab.config import load_config

    cfg, base = load_config(AttributionConfig, PRESETS, config, set_)
    df = run_bank(cfg, out, base=base, force=force, progress=progress, allow_env_change=allow_env_change,
                  executor=executor, jobs=jobs, ray_address=ray_address)
    n = df.groupby(["seed", "candidate"]).ngroups
    typer.echo(f"{n} candidate runs over {df.seed.nunique()} seed(s), replica control bitwise equal -> {BankDir(out).measured}")


@app.command("attribute", cls=config_command("seedlab.attribution.bank.config:AttributionConfig", under="attribute"))
def attribution_attribute(
    bank: Annotated[Path, typer.Argument(help="a bank folder (seedlab attribution bank --out)")],
    estimators: Annotated[list[str], typer.Option("--estimators", "--estimator", help=(
        "estimator(s) to run, repeatable or comma-separated: sgd, adam, adam-linear, tracin, tracin-cp, cosine, "
        "adam-cosine, ekfac, kfac, unroll (the exact linear response, the reference), metagrad (unroll in reverse mode), metagrad-trunc (metagrad within attribute.metagrad_window updates of s, 0 later), the baselines random, loss, gradnorm, length, or a plug-in package.module:function "
        "(function(model, case, grads) -> array of candidates x queries: seedlab.attribution.estimators.registry); default: "
        "the config's, else the installed defaults"))] = [],  # noqa: B006
    set_: Annotated[list[str], typer.Option("--set", help="override an attribute setting for this run, e.g. "
                                                          "--set attribute.fit_rows=512 --set attribute.damping=0.01")] = [],  # noqa: B006
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    jobs: Annotated[int, typer.Option(help="seeds at once, each in a process of its own on one thread (1: one after another, here)")] = 1,
    add: Annotated[bool, typer.Option(help="keep the other estimators' rows already in attribution.parquet (e.g. --estimator unroll --add)")] = False,
) -> None:
    """Every estimator's prediction of every measured effect -> attribution.parquet."""
    from seedlab.attribution.estimators.attribute import attribute
    from seedlab.attribution.bank.rundir import BankDir

    names = _names(estimators)
    df = attribute(bank, estimators=names or None, device=device, progress=progress, settings=set_, jobs=jobs, add=add)
    typer.echo(f"{df.estimator.nunique()} estimator(s) x {len(df) // max(df.estimator.nunique(), 1)} measured effects "
               f"-> {BankDir(bank).attribution}")


@app.command("metagrad")
def attribution_metagrad(
    bank: Annotated[Path, typer.Argument(help="a bank folder (seedlab attribution bank --out)")],
    t0: Annotated[int, typer.Option("--t0", help="the first step whose rows are differentiated: 0 (the twin replayed "
                                                "from its seed's initialisation) .. the first horizon; from s on the "
                                                "replay starts at the kept prefix")] = 0,
    every: Annotated[int | None, typer.Option(help="keep the complete state every K steps and recompute between "
                                                   "(memory: T/K + K states); default: the smallest K whose states "
                                                   "fit in 1 GiB (1: every state, nothing recomputed)")] = None,
    horizon: Annotated[list[str], typer.Option("--horizon", help="a horizon of the bank (s+1, mid, end, or updates "
                                                                 "completed), repeatable; default: all")] = [],  # noqa: B006
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    query_chunk: Annotated[int | None, typer.Option("--query-chunk", help=(
        "queries per backward pass (the adjoints' memory: chunk x horizons x 3P numbers); default: as many as fit "
        "in 1 GiB"))] = None,
    jobs: Annotated[int, typer.Option(help="seeds at once, each in a process of its own on one thread (1: one after another, here)")] = 1,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Every training row's metagradient dL_q(theta_h)/dw_{t,i}: the adjoint of each query's loss at each horizon
    carried back through the twin's replayed run (reverse mode of unroll) -> metagrad.parquet."""
    from seedlab.attribution.estimators.metagrad import bank_metagrad
    from seedlab.attribution.bank.rundir import BankDir

    df = bank_metagrad(bank, first=t0, every=every, horizons=horizon or None, device=device, query_chunk=query_chunk,
                       progress=progress, jobs=jobs)
    typer.echo(f"{len(df)} row metagradients ({df.seed.nunique()} seed(s) x {df['query'].nunique()} queries x "
               f"{df.horizon.nunique()} horizons) -> {BankDir(bank).metagrad}")


@app.command("rowscores")
def attribution_rowscores(
    bank: Annotated[Path, typer.Argument(help="a bank with loo or groups (seedlab attribution bank --out)")],
    estimators: Annotated[list[str], typer.Option("--estimator", "--estimators", help=(
        "row estimators, repeatable or comma-separated: tracin, grad-dot, grad-cosine, ekfac, trak, metagrad-trunc "
        "(metagrad within attribute.metagrad_window updates of the horizon, 0 older; only when named), or a training-rows "
        "plug-in package.module:function (e.g. seedlab.attribution.dattri_adapter:rows.if_cg; metagrad's rows come "
        "from seedlab attribution metagrad); default: all installed built-ins"))] = [],  # noqa: B006
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    jobs: Annotated[int, typer.Option(help="seeds at once, each in a process of its own on one thread (1: one after another, here)")] = 1,
    add: Annotated[bool, typer.Option(help="keep the other estimators' rows already in rowscores.parquet (e.g. --estimator trak --add)")] = False,
) -> None:
    """Every removed training row's predicted effect (leave-one-out and group rows) by the estimators that score
    arbitrary training rows -> rowscores.parquet (the LDS and leave-one-out sections of the report)."""
    from seedlab.attribution.estimators.rowscores import bank_rowscores
    from seedlab.attribution.bank.rundir import BankDir

    names = _names(estimators)
    df = bank_rowscores(bank, estimators=names or None, device=device, progress=progress, add=add, jobs=jobs)
    typer.echo(f"{len(df)} row scores ({df.estimator.nunique()} estimator(s), {df.seed.nunique()} seed(s)) -> "
               f"{BankDir(bank).rowscores}")


@app.command("report")
def attribution_report(bank: Annotated[Path, typer.Argument(help="an attributed bank folder")]) -> None:
    """Write report.md and PNG figures: estimate vs measured, correlation vs horizon beside the row invariance and the seed-mean reliability."""
    from seedlab.attribution.report.bank import write_report

    typer.echo(f"report: {write_report(bank)}")


@app.command("export")
def attribution_export(
    bank: Annotated[Path, typer.Argument(help="a finished bank folder (seedlab attribution bank --out)")],
    out: Annotated[Path, typer.Option(help="a new or empty folder: the benchmark (never written over)")],
    rows: Annotated[str, typer.Option(help="the corpus slice: trained (every row of steps 0 .. end: every built-in can "
                                           "be rescored) or injection (the batch of s: plug-ins and the estimators at "
                                           "theta_s)")] = "trained",
    checkpoints: Annotated[str, typer.Option(help="rows (the twin's weights at every step a removed row was trained "
                                                  "at too, replayed and checked: TracIn's one-visit term reads them) "
                                                  "or saved (the twin's own steps only)")] = "rows",
) -> None:
    """A bank as a self-contained benchmark: config, texts and token ids, the corpus slice its batches read, the
    prefix and twin checkpoints, measured.parquet and every other table, the rows its leave-one-out and group arms
    removed, and manifest.json with every file's SHA-256."""
    from seedlab.attribution.benchmark import export

    r = export(bank, out, rows=rows, row_checkpoints=checkpoints)
    typer.echo(f"{r.files} files, {r.bytes / 1e6:.1f} MB in {r.seconds:.1f} s (rows: {r.rows}) -> {r.path}; "
               f"digest {r.digest}")


@app.command("score")
def attribution_score(
    folder: Annotated[Path, typer.Argument(help="an exported benchmark (seedlab attribution export), or a bank folder")],
    estimators: Annotated[list[str], typer.Option("--estimator", "--estimators", help=(
        "estimator(s) of single-row swaps to score, repeatable or comma-separated: a plug-in package.module:function "
        "(seedlab.attribution.estimators.plugins), or a built-in name (seedlab attribution attribute --help)"))] = [],  # noqa: B006
    row_estimators: Annotated[list[str], typer.Option("--row-estimator", "--row-estimators", help=(
        "estimator(s) of the run's own rows (the rows the leave-one-out and group arms removed), scored on "
        "leave-one-out by age and the LDS: tracin, grad-dot, grad-cosine, ekfac, trak, or a training-rows plug-in "
        "package.module:function, e.g. seedlab.attribution.dattri_adapter:rows.if_cg"))] = [],  # noqa: B006
    out: Annotated[Path | None, typer.Option(help="the score folder; default FOLDER/scores/<estimators>")] = None,
    force: Annotated[bool, typer.Option(help="overwrite a score folder already there")] = False,
    baselines: Annotated[bool, typer.Option(help="score the baselines random, loss, gradnorm and length beside them")] = True,
    report: Annotated[bool, typer.Option(help="render report.md and its figures (the tables are written either way)")] = True,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Score estimators against a benchmark without retraining and without the corpus: every file checked against
    its manifest first, then attribution.parquet, correlations.parquet and report.md in a score folder, beside the
    bank's own estimators."""
    from seedlab.attribution.benchmark import score

    names = _names(estimators)
    r = score(folder, names, rows=_names(row_estimators), out=out, force=force, baselines=baselines, device=device,
              progress=progress, report=report)
    what = f"digest {r.source['digest'][:16]}" if r.source["kind"] == "export" else "a bank"
    rows = f", {len(r.row_estimators)} row estimator(s) on {', '.join(r.tables)}" if r.row_estimators else ""
    typer.echo(f"{len(r.estimators)} estimator(s) scored ({what}), {len(r.from_bank)} from the bank beside them, "
               f"{r.rows} rows{rows} in {r.seconds:.1f} s -> {r.report if report and r.rows else r.path}")


@app.command("leaderboard")
def attribution_leaderboard(
    sources: Annotated[list[Path], typer.Argument(metavar="bank_or_export", help=(
        "banks, exports or score folders (seedlab attribution bank, export, score) of one design; B, lr and steps may "
        "differ"))],
    out: Annotated[Path, typer.Option(help="the folder: leaderboard.md, leaderboard-table.csv, leaderboard-grid.png")],
    age_bands: Annotated[str, typer.Option(help="the leave-one-out age bands' upper ends, comma-separated (the last "
                                                "band is open)")] = "1,10,50,100",
) -> None:
    """One table across banks and exports: every estimator x bank x metric (single-row rho by horizon, leave-one-out
    rho by age band, the single-model and the TRAK-style LDS) with its interval, the bank's ceiling and the
    estimator's cost; a figure; the table as CSV. Exports are checked against their manifests first."""
    from seedlab.attribution.analyses.leaderboard import board
    from seedlab.attribution.benchmark import verify
    from seedlab.attribution.report.leaderboard import write_leaderboard
    from seedlab.errors import SeedlabError

    try:
        bands = [int(v) for v in age_bands.split(",") if v.strip()]
    except ValueError:
        raise SeedlabError(f"--age-bands: integers, comma-separated (e.g. 1,10,50,100), got {age_bands!r}") from None
    b = board(sources, verify=verify, bands=bands)
    n = b.table[b.table.role != "ceiling"].estimator.nunique()
    typer.echo(f"{len(b.sources)} bank(s), {n} estimator(s) -> {write_leaderboard(b, out)}")

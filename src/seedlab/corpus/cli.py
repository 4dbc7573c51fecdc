"""``seedlab corpus``: prepare, verify and search token corpora. Each command imports what it runs,
so that ``seedlab --help`` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True)  # its line in `seedlab --help` is its entry in seedlab.cli.STUDIES


@app.command("prepare")
def corpus_prepare(
    source: Annotated[str, typer.Argument(help="a .txt/.jsonl/.parquet file or folder, 'openwebtext', 'hf:NAME', or 'embedded'")],
    out: Annotated[Path, typer.Option(help="corpus folder (train.bin, heldout.bin, meta.json)")],
    tokenizer: Annotated[str, typer.Option(help="bytes | bpe | gpt2")] = "bytes",
    heldout_fraction: Annotated[float, typer.Option(help="fraction of documents held out, never trained on")] = 0.05,
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary size")] = 4096,
    seed: Annotated[int, typer.Option(help="seed of the held-out split")] = 0,
    text_field: Annotated[str, typer.Option(help="text field of JSONL/Parquet/HF rows")] = "text",
    max_bytes: Annotated[int | None, typer.Option(help="cap on the source text (embedded corpus)")] = None,
    allow_partial: Annotated[bool, typer.Option(
        "--allow-partial", help="prepare a partial parquet conversion (the Hub's partial-*/ folders); meta.json says so")] = False,
) -> None:
    """Tokenize text into memory-mapped token arrays with a SHA-256 manifest."""
    from seedlab.corpus import prepare

    meta = prepare(source, out, tokenizer=tokenizer, heldout_fraction=heldout_fraction, vocab_size=vocab_size,
                   seed=seed, text_field=text_field, max_bytes=max_bytes, allow_partial=allow_partial)
    typer.echo(f"{out}: " + ", ".join(f"{k} {v['tokens']} tokens / {v['documents']} documents" for k, v in meta["splits"].items())
               + ("; a PARTIAL parquet conversion (meta.json: source.partial)" if meta["source"].get("partial") else ""))


@app.command("verify")
def corpus_verify(corpus: Annotated[Path, typer.Argument(help="corpus folder")]) -> None:
    """Recompute the SHA-256 of every array and compare it with meta.json."""
    from seedlab.corpus import load

    c = load(corpus, verify=True)
    typer.echo(f"ok: train {len(c.train)} tokens, heldout {len(c.heldout)} tokens")


@app.command("count")
def corpus_count(
    corpus: Annotated[Path, typer.Argument(help="corpus folder")],
    subject: Annotated[str, typer.Argument(help="e.g. 'Jimmie Nicol'")],
    record: Annotated[bool, typer.Option(help="keep the count in the corpus folder's counts.json")] = False,
) -> None:
    """How often a subject occurs in the training split, as text and as a token sequence."""
    from seedlab.corpus import count
    from seedlab.corpus.corpus import record_count

    n = count(corpus, subject)
    where = f" -> {record_count(corpus, n)}" if record else ""
    typer.echo(f"{subject!r}: text={n['text']} tokens={n['tokens']}{where}")

"""``seedlab twins``: the twins study's commands. Each imports what it runs, so that
``seedlab --help`` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from seedlab.cli import config_command

#: the study's presets: ``seedlab presets`` lists them; every CONFIG argument takes one's name
PRESETS = "twins"

app = typer.Typer(no_args_is_help=True)  # its line in `seedlab --help` is its entry in seedlab.cli.STUDIES


@app.command("run", cls=config_command("seedlab.twins.config:TwinsConfig"))
def twins_run(
    config: Annotated[str, typer.Argument(help="twins config: a YAML file or a preset name, e.g. mini (seedlab presets)")],
    out: Annotated[Path, typer.Option(help="run folder: seed-<k>/<condition>/step-<t>.safetensors")],
    independent: Annotated[bool, typer.Option(help="audit: train every condition's prefix from scratch and compare hashes")] = False,
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set steps=50")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(help="overwrite an existing run")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    allow_env_change: Annotated[bool, typer.Option(help="resume under another environment (torch, device, threads...) than the run started in; recorded in environment.json")] = False,
    preregistration: Annotated[Path | None, typer.Option(help="a text file of hypotheses and decision rules, kept in OUT (with its SHA-256) before the first step; the report quotes it")] = None,
) -> None:
    """Train the twins design: per seed a shared prefix, then every condition forked at the injection step.

    Under torchrun (e.g. torchrun --nproc-per-node 2 -m seedlab twins run ...) the ranks split every batch."""
    from seedlab.config import load_config
    from seedlab.lm.distributed import World, check_divisible, init_world, launched_size
    from seedlab.twins.config import TwinsConfig
    from seedlab.twins.train import run_twins

    cfg, base = load_config(TwinsConfig, PRESETS, config, set_)
    # before the process group: a batch that cannot split over the launched ranks fails at once on every rank
    # (run_twins checks it again against the world it is given)
    check_divisible(cfg.batch_size, cfg.micro_batch, World(size=launched_size()))
    world = init_world()
    df = run_twins(cfg, out, base=base, independent=independent, force=force, progress=progress, world=world,
                   allow_env_change=allow_env_change, preregistration=preregistration)
    if world.main:
        how = ("checked: every tensor's SHA-256 equal across conditions" if independent else
               "by construction: every condition forked from one copy of the shared prefix")
        reps = ", ".join(f"seed {k}" for k in cfg.replica_seeds)
        typer.echo(f"{df.groupby(['seed', 'condition']).ngroups} runs -> {out}\n"
                   f"identical at step {cfg.injection_step}: {how}\n"
                   f"deterministic after it: the replica control ({reps}: the twin trained again) is bitwise equal at every checkpoint")


@app.command("measure")
def twins_measure(
    run: Annotated[Path, typer.Argument(help="a twins run folder (seedlab twins run --out)")],
    corpus: Annotated[Path | None, typer.Option(help="the prepared corpus, if it moved since the run")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Barrier, held-out CE, distance, CKA and passage CE of every condition against its twin, and between seeds."""
    from seedlab.twins.measure import measure
    from seedlab.twins.rundir import RunDir

    out = measure(run, corpus=corpus, device=device, progress=progress)
    m = out["measures"]
    where = RunDir(run).measure_table("measures")
    typer.echo(f"{(m.kind == 'injected').sum()} condition-vs-twin and {(m.kind == 'seed').sum()} seed-vs-seed comparisons -> {where}")


@app.command("gradmatch")
def twins_gradmatch(
    run: Annotated[Path, typer.Argument(help="a twins run folder (its twins' checkpoints at the injection step)")],
    fabricated: Annotated[list[Path], typer.Option(help="a candidate fabricated-subject passage file (repeatable)")] = [],  # noqa: B006
    attested: Annotated[list[Path], typer.Option(help="a candidate attested-subject passage file (repeatable)")] = [],  # noqa: B006
    seed: Annotated[int | None, typer.Option(help="one of the run's seeds (default: every seed, and their mean)")] = None,
    corpus: Annotated[Path | None, typer.Option(help="the prepared corpus, if it moved since the run")] = None,
) -> None:
    """Full-batch gradient deltas of candidate passages at the injection step, and the best-matched
    fabricated x attested pair (smallest relative norm difference). Writes RUN/gradmatch.parquet.

    A side with no candidates given is the run's own passage, as it was trained."""
    from seedlab.twins.gradmatch import match

    cands = {k: v for k, v in {"fluent-fabricated": fabricated, "fluent-attested": attested}.items() if v}
    res = match(run, cands, seed=seed, corpus=corpus)
    for _, r in res.mean.iterrows():
        typer.echo(f"{r.fabricated} vs {r.attested}: |Δ| {r.norm_fabricated:.4g} vs {r.norm_attested:.4g}, "
                   f"differ by {r.rel_norm_diff:.2%} (vectors {r.rel_vec_diff:.2%}, cosine {r.cosine:.4f})")
    b = res.best
    n = res.pairs["seed"].dropna().nunique()
    typer.echo(f"best: {b.fabricated} vs {b.attested}, differ by {b.rel_norm_diff:.2%} (mean of {n} seed(s)) -> {res.path}")


@app.command("match", cls=config_command("seedlab.twins.config:TwinsConfig"))
def twins_match(
    config: Annotated[str, typer.Argument(help="twins config: a YAML file or a preset name, e.g. mini (seedlab presets)")],
    out: Annotated[Path, typer.Option(help="folder for each seed's prefix at s (seed-<k>/prefix.safetensors, kept and read back) and match.parquet")],
    fabricated: Annotated[list[Path], typer.Option(help="a variant of the fluent-fabricated passage (repeatable); none: the config's")] = [],  # noqa: B006
    attested: Annotated[list[Path], typer.Option(help="a variant of the fluent-attested passage (repeatable); none: the config's")] = [],  # noqa: B006
    tolerance: Annotated[float, typer.Option(help="the largest relative difference a matched pair may have (0.0014: the paper's 0.14%)")] = 0.0014,
    by: Annotated[str, typer.Option(help="closest in: update (the AdamW update differences' sizes at s), delta (the full-batch "
                                         "gradient deltas' sizes, what the paper reports), both (the larger of the two)")] = "update",
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set threads=1")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(help="start the folder over (another design's prefixes in it are removed)")] = False,
    allow_env_change: Annotated[bool, typer.Option(help="read back prefixes trained in another environment (torch, device, threads...)")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Match the fluent passages before training: every fabricated x attested variant pair measured at
    the injection step, from each seed's shared prefix (trained as `twins run` trains it, kept in OUT),
    and the closest pair, against the tolerance.

    Closest (--by update, the default) = the smallest relative difference of the sizes of the two
    AdamW update differences u(g + Δ) − u(g) at s: the update size the paper's matching is about.
    The paper reports its 0.14% for the full-batch gradient deltas Δ (--by delta); both are printed.
    Differences are |a − b| / mean(a, b) per seed, averaged over the design's seeds. No pair within
    the tolerance: exit 2 naming the best (an existing OUT/match.parquet is left as it was).
    A pair is matched on the seeds it is measured on (each has its own batch and prefix at s): use
    the seeds the runs will use."""
    from seedlab.config import load_config
    from seedlab.errors import SeedlabError
    from seedlab.twins.config import TwinsConfig
    from seedlab.twins.match import MEASURE_WORDS, match_passages, percent

    cfg, base = load_config(TwinsConfig, PRESETS, config, set_)
    given = {k: v for k, v in {"fluent-fabricated": fabricated, "fluent-attested": attested}.items() if v}
    res = match_passages(cfg, out, given, base=base, tolerance=tolerance, by=by, force=force,
                         allow_env_change=allow_env_change, progress=progress)
    for side, label in res.defaults.items():
        typer.echo(f"{side}: no variants given: the config's passage ({label})")
    n = len(cfg.seeds)
    typer.echo(f"variants at step {cfg.injection_step}, mean of {n} seed(s): |Δ| the gradient delta, |u| the AdamW update "
               "difference, |G|/N the passage row's own gradient")
    for (side, label), r in res.variant_means().iterrows():
        typer.echo(f"  {side:<17} {label}: {int(r.tokens)} tokens, |Δ| {r.norm:.5g}, |u| {r.adam_norm:.5g}, |G|/N {r.row_norm:.5g}")
    shown = res.closest(10)
    typer.echo(f"pairs, closest first in {MEASURE_WORDS[by]} ({len(shown)} of {len(res.mean)}; every pair, every seed: {res.table}):")
    for _, r in shown.iterrows():
        typer.echo(f"  {r.fabricated} vs {r.attested}: update sizes {percent(r.adam_rel_norm_diff)}, gradient deltas "
                   f"{percent(r.rel_norm_diff)}, row gradients {percent(r.row_rel_norm_diff)}; cosine of the deltas "
                   f"{r.cosine:.3f}, of the updates {r.adam_cosine:.3f}")
    b, (lo, hi) = res.best, res.best_range()
    close = (f"{MEASURE_WORDS[by]} differ by {percent(b['diff'])} (mean of {n} seed(s); "
             f"{percent(lo)} to {percent(hi)} by seed)")
    if not res.met:
        where = (f"every pair: {res.path}" if res.path is not None
                 else f"{res.table}, from an earlier match, left as it was")
        raise SeedlabError(f"no pair within {percent(tolerance)}: the best is {b.fabricated} vs {b.attested}, whose {close} ({where})")
    typer.echo(f"best: {b.fabricated} vs {b.attested}: {close}, within {percent(tolerance)} -> {res.path}")


@app.command("export")
def twins_export(
    run: Annotated[Path, typer.Argument(help="a twins run folder")],
    out: Annotated[Path, typer.Option(help="folder for config.json + model.safetensors (GPT2LMHeadModel)")],
    seed: Annotated[int, typer.Option(help="which seed")],
    condition: Annotated[str, typer.Option(help="the run's folder name: twin, a condition of the design, or ordinary-row.<i>")] = "twin",
    step: Annotated[int | None, typer.Option(help="updates completed (a saved checkpoint); default: the final step")] = None,
    force: Annotated[bool, typer.Option(help="overwrite an existing folder")] = False,
) -> None:
    """Export one checkpoint (hash-checked) as a Hugging Face transformers GPT2LMHeadModel folder."""
    from seedlab.twins.export import export_checkpoint

    step = export_checkpoint(run, out, seed=seed, condition=condition, step=step, force=force)
    typer.echo(f"{out}: GPT2LMHeadModel.from_pretrained({str(out)!r}) (seed {seed}, {condition}, step {step})")


@app.command("report")
def twins_report(run: Annotated[Path, typer.Argument(help="a measured twins run folder")]) -> None:
    """Write report.md and PNG figures: the paper's numbers beside this run's, paired statistics, time course."""
    from seedlab.twins.report import write_report

    typer.echo(f"report: {write_report(run)}")

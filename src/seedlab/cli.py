"""seedlab's command line: one Typer app, a sub-app per study.

Bad input anywhere is a :class:`SeedlabError`: one line on stderr, exit code 2.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from seedlab.errors import SeedlabError
from seedlab.store import refuse_overwrite

app = typer.Typer(
    help="seedlab: measured training-dynamics experiments, many seeds at once.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
shortcut_app = typer.Typer(help="The shortcut-saturation study (MPSP tasks, spurious ratio r).", no_args_is_help=True)
app.add_typer(shortcut_app, name="shortcut")
corpus_app = typer.Typer(help="Token corpora for the twins study (local files, OpenWebText, or the embedded default).", no_args_is_help=True)
app.add_typer(corpus_app, name="corpus")
twins_app = typer.Typer(help="The single-example counterfactual: seed-matched twins that differ in one row.", no_args_is_help=True)
app.add_typer(twins_app, name="twins")
attribution_app = typer.Typer(help="Influence estimators against measured single-row counterfactuals (a bank of forks).",
                              no_args_is_help=True)
app.add_typer(attribution_app, name="attribution")
presets_app = typer.Typer(help="The configs seedlab ships: every CONFIG argument also takes a preset's name.",
                          invoke_without_command=True)
app.add_typer(presets_app, name="presets")


@shortcut_app.command("data")
def shortcut_data(
    task: Annotated[str, typer.Option(help="sum2-max | sum2-first | sum3-max | sum3-first")],
    ratio: Annotated[float, typer.Option(help="fraction of shortcut-consistent training samples, in [0, 1]")],
    n_train: Annotated[int, typer.Option(help="training samples")],
    seed: Annotated[int, typer.Option(help="data seed: fixes all three splits")],
    out: Annotated[Path, typer.Option(help="folder for train.npz, val.npz, adv.npz")],
    n_val: Annotated[int, typer.Option(help="validation samples (r = 1)")] = 2048,
    n_adv: Annotated[int, typer.Option(help="adversarial samples (r = 0)")] = 2048,
    length: Annotated[int, typer.Option(help="integers per sequence")] = 5,
    vocab: Annotated[int, typer.Option(help="integers are drawn from 0 .. vocab-1")] = 16,
    force: Annotated[bool, typer.Option(help="overwrite existing files")] = False,
) -> None:
    """Write the three fixed splits of one MPSP-family task."""
    from seedlab.config import parse
    from seedlab.shortcut.config import DataConfig
    from seedlab.shortcut.rundir import data_files
    from seedlab.shortcut.tasks import make_splits

    d = parse(DataConfig, {"length": length, "vocab": vocab, "n_train": n_train, "n_val": n_val, "n_adv": n_adv, "data_seed": seed})
    splits = make_splits(task, ratio, d.n_train, n_val=d.n_val, n_adv=d.n_adv, length=d.length, vocab=d.vocab, seed=d.data_seed)
    files = data_files(out)
    refuse_overwrite(list(files.values()), force)
    for name, split in splits.items():
        split.save(files[name])
    c = int(splits["train"].consistent.sum())
    typer.echo(f"wrote {out}/{{train,val,adv}}.npz: train {n_train} ({c} consistent), val {d.n_val}, adv {d.n_adv}")


@shortcut_app.command("train")
def shortcut_train(
    config: Annotated[str, typer.Argument(help="ensemble config: a YAML file or a preset name (seedlab presets)")],
    out: Annotated[Path, typer.Option(help="run folder")],
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set train.epochs=100")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(help="overwrite an existing run")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Train one ensemble; write summary.parquet and curves.parquet into OUT."""
    from seedlab.config import load_config
    from seedlab.shortcut.config import EnsembleConfig
    from seedlab.shortcut.rundir import RunDir
    from seedlab.shortcut.train import check_members, train_ensemble

    cfg, _ = load_config(EnsembleConfig, "shortcut", config, set_)
    members = cfg.expand()
    check_members(cfg, members)  # everything is validated before anything is written
    run = RunDir(out)
    run.refuse_overwrite(force)
    result = train_ensemble(cfg, out, members=members, progress=progress)
    g = int(result.summary["generalized"].sum())
    typer.echo(f"{len(members)} members, {result.epochs_run} epochs in {result.seconds:.1f}s; {g} generalized -> {run.summary_path}")


@shortcut_app.command("sweep")
def shortcut_sweep(
    config: Annotated[str, typer.Argument(help="sweep config: a YAML file or a preset name, e.g. quick (seedlab presets)")],
    out: Annotated[Path, typer.Option(help="sweep folder (resumable: rerun to finish)")],
    executor: Annotated[str, typer.Option(help="local (no services) or ray")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="a running Ray cluster (HOST:PORT or auto); default: start a local one")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set grid.seed=4")] = [],  # noqa: B006
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    preregistration: Annotated[Path | None, typer.Option(help="a text file of hypotheses and decision rules, kept in OUT (with its SHA-256) before the first member is trained; the report quotes it")] = None,
) -> None:
    """Run (or resume) a sweep; write summary.parquet and curves.parquet into OUT."""
    from seedlab.config import load_config
    from seedlab.shortcut.config import SweepConfig
    from seedlab.shortcut.rundir import SweepDir
    from seedlab.shortcut.sweep import run_sweep

    cfg, _ = load_config(SweepConfig, "shortcut", config, set_)
    df = run_sweep(cfg, out, executor=executor, ray_address=ray_address, progress=progress, preregistration=preregistration)
    g = int(df["generalized"].sum()) if len(df) else 0
    typer.echo(f"{len(df)} members finished, {g} generalized -> {SweepDir(out).summary_path}")


@shortcut_app.command("analyze")
def shortcut_analyze(
    run: Annotated[Path, typer.Argument(help="a run folder (shortcut train) or a sweep folder")],
    n: Annotated[int, typer.Option(help="validation/adversarial rows per member")] = 512,
) -> None:
    """Circuit analyses of every checkpoint -> circuits.parquet (fingerprints, ablations, probes) and
    patching.parquet (activation patching on matched counterfactual pairs)."""
    from seedlab.shortcut.analyze import write_analyses

    for name, path in write_analyses(run, n=n).items():
        typer.echo(f"{name}: {path}")


@shortcut_app.command("report")
def shortcut_report(run: Annotated[Path, typer.Argument(help="a sweep folder")]) -> None:
    """Write report.md and PNG figures into a sweep folder."""
    from seedlab.shortcut.report import write_report

    path = write_report(run)
    typer.echo(f"report: {path}")


@corpus_app.command("prepare")
def corpus_prepare(
    source: Annotated[str, typer.Argument(help="a .txt/.jsonl/.parquet file or folder, 'openwebtext', 'hf:NAME', or 'embedded'")],
    out: Annotated[Path, typer.Option(help="corpus folder (train.bin, heldout.bin, meta.json)")],
    tokenizer: Annotated[str, typer.Option(help="bytes | bpe | gpt2")] = "bytes",
    heldout_fraction: Annotated[float, typer.Option(help="fraction of documents held out, never trained on")] = 0.05,
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary size")] = 4096,
    seed: Annotated[int, typer.Option(help="seed of the held-out split")] = 0,
    text_field: Annotated[str, typer.Option(help="text field of JSONL/Parquet/HF rows")] = "text",
    max_bytes: Annotated[int | None, typer.Option(help="cap on the source text (embedded corpus)")] = None,
) -> None:
    """Tokenize text into memory-mapped token arrays with a SHA-256 manifest."""
    from seedlab.corpus import prepare

    meta = prepare(source, out, tokenizer=tokenizer, heldout_fraction=heldout_fraction, vocab_size=vocab_size,
                   seed=seed, text_field=text_field, max_bytes=max_bytes)
    typer.echo(f"{out}: " + ", ".join(f"{k} {v['tokens']} tokens / {v['documents']} documents" for k, v in meta["splits"].items()))


@corpus_app.command("verify")
def corpus_verify(corpus: Annotated[Path, typer.Argument(help="corpus folder")]) -> None:
    """Recompute the SHA-256 of every array and compare it with meta.json."""
    from seedlab.corpus import load

    c = load(corpus, verify=True)
    typer.echo(f"ok: train {len(c.train)} tokens, heldout {len(c.heldout)} tokens")


@corpus_app.command("count")
def corpus_count(
    corpus: Annotated[Path, typer.Argument(help="corpus folder")],
    subject: Annotated[str, typer.Argument(help="e.g. 'Jimmie Nicol'")],
) -> None:
    """How often a subject occurs in the training split, as text and as a token sequence."""
    from seedlab.corpus import count

    n = count(corpus, subject)
    typer.echo(f"{subject!r}: text={n['text']} tokens={n['tokens']}")


@twins_app.command("run")
def twins_run(
    config: Annotated[str, typer.Argument(help="twins config: a YAML file or a preset name, e.g. mini (seedlab presets)")],
    out: Annotated[Path, typer.Option(help="run folder: seed-<k>/<condition>/step-<t>.safetensors")],
    independent: Annotated[bool, typer.Option(help="audit: train every condition's prefix from scratch and compare hashes")] = False,
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set steps=50")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(help="overwrite an existing run")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Train the twins design: per seed a shared prefix, then every condition forked at the injection step.

    Under torchrun (e.g. torchrun --nproc-per-node 2 -m seedlab twins run ...) the ranks split every batch."""
    from seedlab.config import load_config
    from seedlab.lm.distributed import init_world
    from seedlab.twins.config import TwinsConfig
    from seedlab.twins.rundir import RunDir
    from seedlab.twins.train import run_twins

    cfg, base = load_config(TwinsConfig, "twins", config, set_)
    world = init_world()
    RunDir(out).claim(cfg, independent=independent, force=force, world=world)  # another run refused; the same one resumes
    df = run_twins(cfg, out, base=base, independent=independent, progress=progress, world=world)
    if world.main:
        how = ("checked: every tensor's SHA-256 equal across conditions" if independent else
               "by construction: every condition forked from one copy of the shared prefix")
        reps = ", ".join(f"seed {k}" for k in cfg.replica_seeds)
        typer.echo(f"{df.groupby(['seed', 'condition']).ngroups} runs -> {out}\n"
                   f"identical at step {cfg.injection_step}: {how}\n"
                   f"deterministic after it: the replica control ({reps}: the twin trained again) is bitwise equal at every checkpoint")


@twins_app.command("measure")
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


@twins_app.command("gradmatch")
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


@twins_app.command("export")
def twins_export(
    run: Annotated[Path, typer.Argument(help="a twins run folder")],
    out: Annotated[Path, typer.Option(help="folder for config.json + model.safetensors (GPT2LMHeadModel)")],
    seed: Annotated[int, typer.Option(help="which seed")],
    condition: Annotated[str, typer.Option(help="twin | fluent-fabricated | fluent-attested | random-chars")] = "twin",
    step: Annotated[int | None, typer.Option(help="updates completed (a saved checkpoint); default: the final step")] = None,
    force: Annotated[bool, typer.Option(help="overwrite an existing folder")] = False,
) -> None:
    """Export one checkpoint (hash-checked) as a Hugging Face transformers GPT2LMHeadModel folder."""
    from seedlab.lm.export import HF_FILES, to_hf
    from seedlab.lm.model import GPT
    from seedlab.twins.rundir import open_run

    design = open_run(run)
    step = design.cfg.steps if step is None else step
    refuse_overwrite([out / name for name in HF_FILES], force)
    model = GPT(design.gcfg)
    model.load_state_dict(design.weights(seed, condition, step))
    to_hf(model, out, eot_id=design.corpus.eot_id, metadata={"run": str(run), "seed": seed, "condition": condition, "step": step})
    typer.echo(f"{out}: GPT2LMHeadModel.from_pretrained({str(out)!r}) (seed {seed}, {condition}, step {step})")


@twins_app.command("report")
def twins_report(run: Annotated[Path, typer.Argument(help="a measured twins run folder")]) -> None:
    """Write report.md and PNG figures: the paper's numbers beside this run's, paired statistics, time course."""
    from seedlab.twins.report import write_report

    typer.echo(f"report: {write_report(run)}")


@attribution_app.command("bank")
def attribution_bank(
    config: Annotated[str, typer.Argument(help="attribution config: a YAML file or a preset name, e.g. mini (seedlab presets)")],
    out: Annotated[Path, typer.Option(help="bank folder: seed-<k>/{prefix, twin, replica, candidates/<name>}")],
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set candidates.heldout=32")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(help="overwrite a folder holding another bank")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Train the bank: per seed a shared prefix, its twin, a replica control and one single-row fork per
    candidate; measure every candidate's effect on every query at every horizon (measured.parquet)."""
    from seedlab.attribution.bank import run_bank
    from seedlab.attribution.config import AttributionConfig
    from seedlab.attribution.rundir import BankDir
    from seedlab.config import load_config

    cfg, base = load_config(AttributionConfig, "attribution", config, set_)
    df = run_bank(cfg, out, base=base, force=force, progress=progress)
    n = df.groupby(["seed", "candidate"]).ngroups
    typer.echo(f"{n} candidate runs over {df.seed.nunique()} seed(s), replica control bitwise equal -> {BankDir(out).measured}")


@attribution_app.command("attribute")
def attribution_attribute(
    bank: Annotated[Path, typer.Argument(help="a bank folder (seedlab attribution bank --out)")],
    estimators: Annotated[list[str], typer.Option(help="estimator(s) to run, repeatable or comma-separated "
                                                       "(sgd, adam, tracin, cosine, ekfac, kfac); default: the config's, "
                                                       "else every installed one")] = [],  # noqa: B006
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Every estimator's prediction of every measured effect -> attribution.parquet."""
    from seedlab.attribution.attribute import attribute
    from seedlab.attribution.rundir import BankDir

    names = [n.strip() for item in estimators for n in item.split(",") if n.strip()]
    df = attribute(bank, estimators=names or None, device=device, progress=progress)
    typer.echo(f"{df.estimator.nunique()} estimator(s) x {len(df) // max(df.estimator.nunique(), 1)} measured effects "
               f"-> {BankDir(bank).attribution}")


@attribution_app.command("report")
def attribution_report(bank: Annotated[Path, typer.Argument(help="an attributed bank folder")]) -> None:
    """Write report.md and PNG figures: estimate vs measured, correlation vs horizon beside the noise ceiling."""
    from seedlab.attribution.report import write_report

    typer.echo(f"report: {write_report(bank)}")


@presets_app.callback()
def presets_list(ctx: typer.Context) -> None:
    """List the presets of every study, with the first line of each (what it is)."""
    if ctx.invoked_subcommand is not None:
        return
    from seedlab import presets

    for study in presets.STUDIES:
        typer.echo(f"{study}:")
        for name in presets.names(study):
            first = presets.find(study, name).read_text().splitlines()[0].lstrip("# ").strip()
            typer.echo(f"  {name:<16} {first}")


@presets_app.command("copy")
def presets_copy(
    name: Annotated[str, typer.Argument(help="STUDY/NAME, e.g. twins/mini")],
    out: Annotated[Path, typer.Argument(help="folder to write NAME.yaml into (with the files it names, e.g. passages)")],
    force: Annotated[bool, typer.Option(help="overwrite existing files")] = False,
) -> None:
    """Write a preset out as a file to edit (and run: seedlab twins run OUT/NAME.yaml)."""
    from seedlab import presets

    study, _, stem = name.partition("/")
    src = presets.find(study, stem) if study in presets.STUDIES else None
    if src is None:
        every = ", ".join(f"{s}/{n}" for s in presets.STUDIES for n in presets.names(s))
        raise SeedlabError(f"name: one of {every}, got {name!r}")
    files = presets.files(study, stem)
    refuse_overwrite([out / rel for rel in files], force)
    for rel in files:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.parent / rel, out / rel)
    typer.echo(f"{out / src.name} ({len(files) - 1} more file(s) beside it)")


def main() -> None:
    # click handles usage errors itself (exit 2); our own bad-input errors are caught here
    try:
        app()
    except SeedlabError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)

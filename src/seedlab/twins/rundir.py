"""A twins run folder: where every file lives, when a folder may be used, and how later tools
read it back. No other module of the study builds a path inside a run folder.

The layout (the files ``measure``, ``gradmatch``, ``report``, ``export`` and other tools read)::

    DIR/config.json               the resolved config (+ independent, world_size, injection_rank)
    DIR/preregistration.json      outcomes and measurement settings, hashed, before any training
    DIR/preregistration.md        --preregistration FILE: its text (SHA-256 in preregistration.json), before any training
    DIR/inputs.json               the corpus (absolute path, hashes) and every passage's text and token ids (and
                                  ``seed_passages``: each seed's own ordinary rows, nulls.ordinary_rows_per_seed)
    DIR/environment.json          torch, CUDA, device, precision, threads, deterministic settings (checked on resume)
    DIR/seed-<k>/prefix.safetensors                the shared prefix's complete state at step s
    DIR/seed-<k>/<condition>/step-<t>.safetensors  weights after t updates (state_dict keys)
    DIR/seed-<k>/<condition>/manifest.json         {t: {tensor: SHA-256}} for every saved t
    DIR/seed-<k>/<condition>/losses.parquet        (step, loss): the training loss of every update
    DIR/seed-<k>/<condition>/state.safetensors     the complete state at the last checkpoint (resume)
    DIR/seed-<k>/<condition>/final.safetensors     the complete state at the end (only with keep: [final])
    DIR/seed-<k>/<condition>/dose.json             the arm's state − the twin's after the update of s (the fork loop)
    DIR/seed-<k>/<condition>/done.json             written last: this seed x condition finished
    DIR/seed-<k>/replica/{manifest,done}.json      the replica control: the twin trained again, hashes only
    DIR/integrity.json                             how the runs were shown identical before s, deterministic after
    DIR/{measures,checkpoints,timecourse,paths,passages}.parquet, DIR/measures.json   seedlab twins measure
    DIR/gradmatch.parquet                          seedlab twins gradmatch
    DIR/report.md, DIR/*.png                       seedlab twins report
    DIR/dose-{arms,lines,residuals,fraction,ce-slope}.csv   with dose.json: the report's dose tables (twins/dose.py)

A match folder (``seedlab twins match CONFIG --out DIR``, :class:`MatchDir`): ``config.json`` (what the
prefixes depend on), ``inputs.json``, ``environment.json``, ``seed-<k>/prefix.safetensors`` and
``match.parquet`` (every fabricated x attested pair of passage variants, per seed and their mean).

The scale axis (twins/scale.py, experiments/twins_scale.py) keeps each measured cell as a small
folder that outlives its run folder (:data:`ScaleCellDir`: seedlab/cells.py's kept cell folder, shared with the
attribution grid) and renders the table across cells into another (:class:`ScaleDir`)::

    CELL/cell.json                the cell's labels (B, steps after s, width), seeds, settings, stage wall times
    CELL/per_seed.csv             per seed x arm: distance, barrier and passage drops against the twin
    CELL/pairs.csv                per seed pair: the twins' distance, aligned distance and barrier
    CELL/curves.csv               per seed x group x step after s: |training loss − twin's|
    SCALE/scale.md, SCALE/scale-table.csv, SCALE/scale-trends.csv, SCALE/scale-paper.csv, SCALE/scale-<measure>.png
    SCALE/scale-prediction.json, SCALE/scale-preregistration.md   the confirmatory prediction, before its run
    SCALE/scale-verdict.json      the confirmatory cell's verdict on it

The folder policy of ``seedlab twins run`` (forks/folders.py ``DesignFolder.claim``): an absent or
empty folder starts a run; a folder holding the same run (its config.json, with the fields added
to TwinsConfig since it was started at their defaults) resumes it from its last checkpoints, in the
environment it was started in (``environment.json``); anything else is refused unless ``--force``,
which removes it first.

``open_run`` reads ``config.json`` (the resolved TwinsConfig) and ``inputs.json`` (the corpus's
path and hashes, each passage's token ids), loads the corpus and lists which seed x condition
runs finished; ``Run.weights`` returns a checkpoint with every tensor's SHA-256 checked
against the run's ``manifest.json``. :class:`Measured` reads back what ``seedlab twins measure`` and
``gradmatch`` wrote (the tables the report and its figures draw from; no torch needed).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from seedlab.cells import CellDir, TableDir
from seedlab.config import parse, with_new_defaults
from seedlab.errors import SeedlabError
from seedlab.lm.gptconfig import GPTConfig
from seedlab.forks.design import ForkDesign
from seedlab.forks.folders import DesignFolder, RunFolder, corpus_record, open_design
from seedlab.store import write_json, write_text
from seedlab.twins.config import MeasureConfig, TwinsConfig

if TYPE_CHECKING:
    import torch

    from seedlab.lm.distributed import World

#: the tables ``seedlab twins measure`` writes, as ``DIR/<name>.parquet``
MEASURE_TABLES = ("measures", "checkpoints", "timecourse", "paths", "passages")
#: passages.parquet: condition c's and its twin's CE on every passage (text) at every saved step t >= s
PASSAGE_COLUMNS = ["seed", "condition", "step", "text", "ce", "twin_ce", "diff"]
#: the dose section's tables the report writes beside report.md (:meth:`RunDir.dose_table`)
DOSE_TABLES = ("arms", "lines", "residuals", "fraction", "ce-slope")


class RunDir(DesignFolder):
    """The layout of a twins run folder (see the module docstring; config, inputs, environment,
    prefix, runs, integrity, report and figures: forks/folders.py ``DesignFolder``)."""

    study, noun, arm_word = "twins", "run", "condition"

    @property
    def preregistration(self) -> Path:
        return self.root / "preregistration.json"

    def condition(self, seed: int, cond: str) -> RunFolder:
        """One condition's run of one seed (an arm of the fork design)."""
        return self.run(seed, cond)

    def dose(self, seed: int, cond: str) -> Path:
        """One arm's dose.json (written by the fork loop): its state minus the twin's after the update that consumed
        the batch of s, ``{"step", "theta": {"l2", "per_tensor", "abs_quantiles", "changed_fraction"}, "exp_avg": {"l2",
        "per_tensor"}, "exp_avg_sq": {"l2", "per_tensor"}}``, float64 norms (forks/dose.py; the moments null without
        any, the twin's own file zeros)."""
        return self.condition(seed, cond).dose

    def measure_table(self, name: str) -> Path:
        """One of :data:`MEASURE_TABLES`."""
        return self.root / f"{name}.parquet"

    def dose_table(self, name: str) -> Path:
        """One of :data:`DOSE_TABLES` as the report writes it (``dose-<name>.csv``): the dose section's numbers, to be
        kept and quoted (docs/claims) without the run folder."""
        if name not in DOSE_TABLES:
            raise ValueError(f"dose table: one of {', '.join(DOSE_TABLES)}, got {name!r}")
        return self.root / f"dose-{name}.csv"

    @property
    def measures_json(self) -> Path:
        return self.root / "measures.json"

    @property
    def gradmatch(self) -> Path:
        return self.root / "gradmatch.parquet"

    def upgrade(self, old: dict) -> dict:
        """A config.json written by an older seedlab as today's record: the fields TwinsConfig has
        gained since, at their defaults (the injected row's rank is derived, so not compared)."""
        return with_new_defaults(TwinsConfig, {k: v for k, v in old.items() if k != "injection_rank"})

    def disk_plan(self, cfg: TwinsConfig, gcfg: GPTConfig, *, independent: bool) -> dict[str, int]:
        """Bytes the design writes here at most: every weight checkpoint (seeds x conditions x saved
        steps x one model), the complete states (weights + AdamW moments) of the kept prefixes and,
        with ``keep: [final]``, of every run's end, and the resume states that exist at once (one;
        every condition's at s in the independent audit, until each goes on). JSON, parquet and the
        replica's hashes are small and left out."""
        import torch

        from seedlab.lm.model import GPT

        with torch.device("meta"):
            model = GPT(gcfg)
        weights = sum(v.numel() * v.element_size() for v in model.state_dict().values())
        state = weights + 2 * sum(p.numel() * p.element_size() for p in model.parameters())  # + exp_avg, exp_avg_sq
        saved = [t for t in cfg.checkpoint_steps() if independent or t >= cfg.injection_step]
        runs = len(cfg.seeds) * len(cfg.arm_names)
        plan = {  # what stays
            "checkpoints": runs * len(saved) * weights,
            "prefix_states": state * len(cfg.seeds) if "prefix" in cfg.keep and not independent else 0,
            "final_states": runs * state if "final" in cfg.keep else 0,
        }
        kept = sum(plan.values())
        # and what exists for a while: the resume states (one at a time; every condition's at s in
        # the independent audit) and a prefix that is not kept (until the seed's forks are done)
        transient = state * (len(cfg.arm_names) if independent else 1) + (0 if plan["prefix_states"] or independent else state)
        return plan | {"kept": kept, "total": kept + transient, "per_checkpoint": weights,
                       "checkpoints_per_run": len(saved), "runs": runs}

    def check_disk(self, plan: dict[str, int]) -> str:
        """Refuse a design the disk cannot hold (what is already in the folder counts as written);
        returns the line that says what it will use."""
        written = sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file()) if self.root.is_dir() else 0
        where = next(p for p in (self.root, *self.root.resolve().parents) if p.exists())
        free = shutil.disk_usage(where).free
        line = (f"disk: this design keeps {_size(plan['kept'])} in {self.root} ({plan['runs']} runs x "
                f"{plan['checkpoints_per_run']} checkpoints x {_size(plan['per_checkpoint'])}, plus "
                f"{_size(plan['prefix_states'] + plan['final_states'])} of kept complete states; at most {_size(plan['total'])} at once)")
        if plan["total"] - written > free:
            raise SeedlabError(f"disk: this design needs {_size(plan['total'] - written)} more in {self.root}, only "
                               f"{_size(free)} free there (fewer seeds, a sparser checkpoint_every, or keep: [])")
        return line

    def check_inputs(self, inputs: dict) -> None:
        """A folder started before must be resumed with the same inputs: each passage's text and
        token ids and the corpus's hashes as in its ``inputs.json`` (the corpus may have moved).
        An edited passage or a re-prepared corpus is refused, before anything is written."""
        old = self.started_inputs(inputs)  # the corpus checked
        if old is None:
            return
        if old.get("seed_passages", {}) != inputs.get("seed_passages", {}):
            raise SeedlabError(f"nulls.ordinary_rows_per_seed: the texts each seed draws differ from those {self.root} was "
                               "started with (inputs.json seed_passages); restore them, or --force to start over")
        for cond in sorted(set(old.get("passages", {})) | set(inputs["passages"])):
            a, b = old.get("passages", {}).get(cond), inputs["passages"].get(cond)
            if a != b:
                what = "is new" if a is None else "is gone" if b is None else "was edited"
                raise SeedlabError(f"passages.{cond}: the passage {what} since {self.root} was started "
                                   "(its text or token ids differ from inputs.json); restore it, or --force to start over")

    @property
    def preregistration_text(self) -> Path:
        """``--preregistration FILE``'s text: hypotheses and decision rules, kept before the first step."""
        return self.root / "preregistration.md"

    def check_preregistration(self, text: str | None) -> None:
        """A run pre-registered with a text resumes only with the same text; a text cannot be added to a
        run that has started without one (one line, nothing written)."""
        kept = self.preregistration_text.read_text() if self.preregistration_text.is_file() else None
        if text is not None and kept is not None and kept != text:
            raise SeedlabError(f"--preregistration: {self.root} was pre-registered with another text "
                               "(it cannot change after the first step)")
        if text is not None and kept is None and self.config.is_file():
            raise SeedlabError(f"--preregistration: {self.root} has started without one; a pre-registration is "
                               "kept before the first step (start a new folder)")

    def start(self, record: dict, inputs: dict, env: dict, preregistration: dict, text: str | None = None) -> None:
        """Rank 0, once every input is checked (:meth:`check_inputs` too) and before the first step:
        ``config.json``, ``inputs.json`` and ``environment.json`` (forks/folders.py), then
        ``preregistration.json`` (and ``preregistration.md``, the text, with its SHA-256 in the json),
        each written once (a resumed run leaves them untouched)."""
        super().start(record, inputs, env)
        if not self.preregistration.is_file():
            sha = {"text_sha256": hashlib.sha256(text.encode()).hexdigest()} if text is not None else {}
            if text is not None:
                write_text(self.preregistration_text, text)
            write_json(self.preregistration, preregistration | sha)


# --------------------------------------------------------------------------- a match folder (seedlab twins match)

#: the fields of the fork design (forks/design.py) that steps 0 .. s-1 do not depend on; every other
#: one (corpus, model, schedule, batches, device, precision, threads...) is in a match folder's config.json (the
#: schedule's fields depend on s only through the rates before it: MatchDir.holds)
NOT_PREFIX = frozenset({"seeds", "replicas", "midpoint", "injection_row", "arm_batch", "stack_memory"})
KIND = "twins match"


class MatchDir(DesignFolder):
    """A match folder: ``config.json`` (:func:`prefix_record`), ``inputs.json`` (the corpus),
    ``environment.json``, ``seed-<k>/prefix.safetensors`` (each seed's prefix at s, kept) and
    ``match.parquet``."""

    study, noun = "twins", "match"

    @property
    def table(self) -> Path:
        return self.root / "match.parquet"

    def upgrade(self, old: dict) -> dict:
        """A config.json written by an older seedlab: the prefix fields TwinsConfig has gained since, at their defaults."""
        full = with_new_defaults(TwinsConfig, {k: v for k, v in old.items() if k != "kind"})
        return {"kind": old.get("kind"), **{k: full.get(k) for k in _prefix_fields()}}

    def holds(self, old: dict, record) -> bool:
        """The folder policy's comparison (forks/folders.py ``DesignFolder.claim``) with one allowance: a design whose
        record differs from config.json's in the learning-rate schedule alone, where that leaves the rate of every
        update before s bitwise the same (forks/prefix.py ``check_prefix_reuse``: a longer or shorter decay, run or
        floor after s), holds the kept prefixes (config.json then records it); a schedule change that alters a rate
        before s is refused in one line naming the field, nothing written. Any other difference: another design."""
        from seedlab.forks.prefix import SCHEDULE_FIELDS, check_prefix_reuse  # (torch: not at import, for readers)

        kept, record = self.upgrade(old), dict(record)
        differ = [k for k in record if kept.get(k) != record[k]]
        if set(kept) != set(record) or not differ or not all(k in SCHEDULE_FIELDS for k in differ):
            return kept == record
        try:
            check_prefix_reuse(kept, record, record["injection_step"], differ, what=f"the prefixes kept in {self.root}")
        except SeedlabError as e:
            raise SeedlabError(f"{e}; use another folder, or --force to start over") from None
        return True


def prefix_record(cfg: TwinsConfig) -> dict:
    """What a match folder's prefixes depend on: the fork design's fields (forks/design.py
    ``ForkDesign``: what the trainer reads) but :data:`NOT_PREFIX`, and the optimizer when the
    config names one. A study's own fields (conditions, passages, nulls, measures) are left out."""
    dump = cfg.model_dump(mode="json")
    return {"kind": KIND, **{k: dump.get(k) for k in _prefix_fields()}}


def _prefix_fields() -> list[str]:
    extra = ["optimizer"] if "optimizer" in TwinsConfig.model_fields else []  # Trainer: adamw when absent
    return [k for k in ForkDesign.model_fields if k not in NOT_PREFIX] + extra



def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def run_record(cfg: TwinsConfig, *, independent: bool, world: World) -> dict:
    """The resolved config and how it is run: what makes a folder hold the same run (claim)."""
    return cfg.model_dump(mode="json") | {"independent": independent, "world_size": world.size}


def config_record(cfg: TwinsConfig, *, independent: bool, world: World) -> dict:
    """What ``config.json`` holds: the resolved config, how it is run, and which rank holds the
    injected row (once the batch is known to split evenly over the ranks)."""
    return run_record(cfg, independent=independent, world=world) | {
        "injection_rank": world.rank_of_row(cfg.injection_row, cfg.batch_size)}


def inputs_record(corpus, passages: dict[str, list[int]], attestation: dict | None = None,
                  seed_passages: dict[int, dict[str, list[int]]] | None = None) -> dict:
    """What ``inputs.json`` holds: what later tools (measure, gradmatch, report) need without the
    config's folder; ``attestation``: each subject's occurrences and per-seed exposure (twins/passages.py);
    ``seed_passages``: the texts each seed draws for itself (twins/passages.py ``seed_passages``), under
    ``seed_passages`` {seed: {arm: text and tokens}}, absent when every seed injects the same texts."""
    record = lambda texts: {c: {"text": corpus.decode(ids), "tokens": ids} for c, ids in texts.items()}
    return {
        **corpus_record(corpus),
        "passages": record(passages),
        "attestation": attestation or {},
    } | ({"seed_passages": {str(k): record(v) for k, v in seed_passages.items()}} if seed_passages else {})


# --------------------------------------------------------------------------- reading a run back


@dataclass
class Run:
    """A finished (or partly finished) twins design on disk, as later tools read it."""

    dir: RunDir
    cfg: TwinsConfig
    gcfg: GPTConfig
    corpus: object
    passages: dict[str, list[int]]  # the texts every seed injects
    finished: list[tuple[int, str]] = field(default_factory=list)  # (seed, condition) of every finished run
    missing: list[str] = field(default_factory=list)  # "seed <k> <condition>" of every unfinished one
    seed_passages: dict[int, dict[str, list[int]]] = field(default_factory=dict)  # the texts a seed draws for itself

    @property
    def root(self) -> Path:
        return self.dir.root

    def texts(self, seed: int) -> dict[str, list[int]]:
        """Every text seed ``seed``'s runs inject, ``{arm name: token ids}``: the shared passages and its own (its
        ordinary rows, when each seed draws its own)."""
        return self.passages | self.seed_passages.get(seed, {})

    def weights(self, seed: int, cond: str, step: int) -> dict[str, torch.Tensor]:
        """Weights after ``step`` updates, every tensor's SHA-256 checked against manifest.json
        (the run need not have finished: an interrupted one has its checkpoints so far)."""
        return self.dir.condition(seed, cond).weights(step)  # forks.folders.RunFolder.weights


def open_run(root: str | Path, corpus: str | Path | None = None) -> Run:
    """Read a run folder's config and inputs (its corpus checked: forks/folders.py ``open_design``);
    list which seed x condition runs finished."""
    rd = RunDir(Path(root))
    disk = open_design(rd, lambda record: parse(TwinsConfig, {k: v for k, v in record.items() if k in TwinsConfig.model_fields}),
                       corpus)
    cfg = disk.cfg
    passages = {k: v["tokens"] for k, v in disk.inputs["passages"].items()}
    own = {int(k): {n: v["tokens"] for n, v in texts.items()} for k, texts in disk.inputs.get("seed_passages", {}).items()}
    run = Run(rd, cfg, cfg.gpt_config(disk.corpus.vocab_size), disk.corpus, passages, seed_passages=own)
    for seed in cfg.seeds:
        for cond in cfg.arm_names:
            if rd.condition(seed, cond).finished:
                run.finished.append((seed, cond))
            else:
                run.missing.append(f"seed {seed} {cond}")
    return run


# --------------------------------------------------------------------------- reading the measures back


@dataclass
class Measured:
    """What ``seedlab twins measure`` wrote into a run folder (twins/measure.py), the run's config.json
    and, when ``seedlab twins gradmatch`` ran, its table: what the report and its figures read."""

    dir: RunDir
    measures: pd.DataFrame
    checkpoints: pd.DataFrame
    timecourse: pd.DataFrame
    paths: pd.DataFrame
    passages: pd.DataFrame  # the cross-passage matrix (empty when measured by an older seedlab)
    meta: dict  # measures.json
    config: dict

    @classmethod
    def read(cls, root: str | Path) -> Measured:
        rd = RunDir(Path(root))
        tables = [rd.measure_table(name) for name in MEASURE_TABLES]
        optional = {rd.measure_table("passages")}  # measured by an older seedlab: the report says so
        missing = [p.name for p in [*tables, rd.measures_json] if not p.is_file() and p not in optional]
        if missing:
            raise SeedlabError(f"{rd.root}: no {missing[0]} (run `seedlab twins measure {rd.root}` first)")
        frames = [pd.read_parquet(p) if p.is_file() else pd.DataFrame(columns=PASSAGE_COLUMNS) for p in tables]
        return cls(rd, *frames, json.loads(rd.measures_json.read_text()), json.loads(rd.config.read_text()))

    @property
    def steps(self) -> dict[str, int]:
        """The named steps of the measured run (twins.measure.named_steps): injection, s50, mid, final."""
        return self.meta["steps"]

    @property
    def settings(self) -> MeasureConfig:
        """The measurement settings the files were made with (their defaults: MeasureConfig's)."""
        return MeasureConfig.model_validate(self.meta["preregistration"]["measure"])

    @property
    def gradmatch(self) -> pd.DataFrame | None:
        """gradmatch.parquet (``seedlab twins gradmatch``), None when it was not run."""
        return pd.read_parquet(self.dir.gradmatch) if self.dir.gradmatch.is_file() else None

    @property
    def perturbations(self) -> pd.DataFrame:
        """Every perturbation arm's record (``seed-<k>/<condition>/perturbation.json``: forks/arms.py), one row per
        seed x condition: seed, condition and the record's numbers (``like_norm``, ``norm``, ``update_norm``,
        ``like_update_norm``, ``cosine``, where the arm records them); empty when no arm has one."""
        rows = []
        for path in sorted(self.dir.root.glob("seed-*/*/perturbation.json")):
            rec = json.loads(path.read_text())
            rows.append({"seed": int(path.parent.parent.name.split("-", 1)[1]), "condition": path.parent.name,
                         **{k: v for k, v in rec.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}})
        return pd.DataFrame(rows)

    @property
    def doses(self) -> pd.DataFrame:
        """Every arm's dose at s (:meth:`RunDir.dose`), one row per seed x condition with a dose.json: seed, condition,
        step and the numbers the dose–response reads (twins/dose.py): ``theta_l2`` (‖Δθ_{s+1}‖, the dose), ``theta_q50``,
        ``theta_q90``, ``theta_q99``, ``theta_max`` (quantiles of |Δθ_{s+1}| over coordinates), ``changed_fraction``,
        ``exp_avg_l2`` (‖Δm‖), ``exp_avg_sq_l2`` (‖Δv‖; both NaN for an optimizer without moments); the per-tensor
        norms stay in the files. Empty when no arm has one (a run trained before the fork loop recorded it)."""
        rows = []
        found = ((p.parent.parent.name.split("-", 1)[1], p.parent.name) for p in self.dir.root.glob("seed-*/*/dose.json"))
        for seed, arm in sorted((int(k), a) for k, a in found if k.isdigit()):
            rec = json.loads(self.dir.dose(seed, arm).read_text())
            theta = rec.get("theta") or {}
            q = theta.get("abs_quantiles") or {}
            rows.append({"seed": seed, "condition": arm, "step": rec.get("step"), "theta_l2": theta.get("l2"),
                         "theta_q50": q.get("0.5"), "theta_q90": q.get("0.9"), "theta_q99": q.get("0.99"),
                         "theta_max": q.get("1.0"), "changed_fraction": theta.get("changed_fraction"),
                         "exp_avg_l2": (rec.get("exp_avg") or {}).get("l2"),
                         "exp_avg_sq_l2": (rec.get("exp_avg_sq") or {}).get("l2")})
        cols = ["seed", "condition", "step", "theta_l2", "theta_q50", "theta_q90", "theta_q99", "theta_max",
                "changed_fraction", "exp_avg_l2", "exp_avg_sq_l2"]
        return pd.DataFrame(rows, columns=cols).astype({c: float for c in cols[3:]})

    def record(self, name: str) -> dict | None:
        """One of the run's records, ``integrity``, ``inputs`` or ``preregistration`` (json), None when absent."""
        path = {"integrity": self.dir.integrity, "inputs": self.dir.inputs, "preregistration": self.dir.preregistration}[name]
        return json.loads(path.read_text()) if path.is_file() else None

    @property
    def preregistration_text(self) -> str | None:
        """preregistration.md (``--preregistration``), None when the run was not given one."""
        path = self.dir.preregistration_text
        return path.read_text() if path.is_file() else None


# --------------------------------------------------------------------------- the scale axis (twins/scale.py)


#: a kept scale-cell summary (twins/scale.py ``Cell.to_dir``): its record and its frames (seedlab/cells.py)
ScaleCellDir = CellDir


@dataclass(frozen=True)
class ScaleDir(TableDir):
    """Where the scale table across cells is rendered (twins/report_scale.py): ``scale.md``, ``scale-<name>.csv``
    (table, trends, paper; confirm: the confirmatory cell's table, every group), ``scale-<measure>.png``, the
    prediction and its verdict."""

    stem = "scale"

    @property
    def prediction(self) -> Path:
        """The confirmatory prediction (twins/scale.py ``Prediction``), JSON, written before its cell runs."""
        return self.root / "scale-prediction.json"

    @property
    def preregistration(self) -> Path:
        """The prediction's text (twins/scale.py ``preregistration_text``), which its run keeps (--preregistration)."""
        return self.root / "scale-preregistration.md"

    @property
    def verdict(self) -> Path:
        """The confirmatory cell's verdict on the prediction (twins/scale.py ``confirm``), JSON."""
        return self.root / "scale-verdict.json"

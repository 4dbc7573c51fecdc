"""An attribution bank folder: where every file lives, when a folder may be used, and how later
stages read it back. No other module of the study builds a path inside a bank folder.

The layout::

    DIR/config.json                     the resolved AttributionConfig
    DIR/inputs.json                     the corpus (absolute path, hashes, eot id) and every candidate's and
                                        query's kind, text and token ids (the design: checked on resume)
    DIR/environment.json                torch, CUDA, device, precision, threads, deterministic settings (checked on resume)
    DIR/seed-<k>/prefix.safetensors     the shared prefix's complete state at step s (weights + AdamW
                                        moments: the estimators' θ_s and preconditioner); kept
    DIR/seed-<k>/twin/step-<t>.safetensors   the twin's weights after t updates: s, every horizon, TracIn's cadence
    DIR/seed-<k>/twin/manifest.json     {t: {tensor: SHA-256}} at every saved step
    DIR/seed-<k>/twin/queries.parquet   (step, text, loss): every text's L_query at every horizon
    DIR/seed-<k>/twin/losses.parquet    (step, loss): the training loss of every update from s
    DIR/seed-<k>/twin/done.json         written last: the run finished
    DIR/seed-<k>/replica/{manifest,done}.json        the replica control: the twin trained again, hashes only
    DIR/seed-<k>/candidates/<name>/{manifest,done}.json, queries.parquet, losses.parquet
                                        one candidate's fork: hashes at every horizon, its own text's and the
                                        queries' L_query at every horizon (no weights are stored)
    DIR/seed-<k>/replicates/<name>/     the same files for the candidate's replicate (candidates.replicate_row:
                                        its text in row r' of the batch of s; its arm is ``replicate.<name>``)
    DIR/seed-<k>/pairs/<first>..<second>/   the same files for a pair (candidates.pairs: first in row r, second
                                        in row r' of the batch of s; its arm is ``pair.<first>..<second>``;
                                        queries.parquet: both candidates' texts and the queries)
    DIR/seed-<k>/weighted/<w>/<name>/   the same files for the candidate at loss weight w < 1 (candidates.weights; its arm
                                        is ``weight.<w>.<name>``)
    DIR/seed-<k>/prefix-<t>.safetensors     the prefix's complete state after t < s updates, where a leave-one-out arm
                                        of an older row starts (loo.steps before s; forks/prefix.py)
    DIR/seed-<k>/loo/<t>-<i>/           a leave-one-out arm (``loo.<t>.<i>``: row i of the batch of step t removed;
                                        attribution/bank/removals.py): hashes, the queries' losses
    DIR/seed-<k>/groups/<α>-<j>/        a group arm (``group.<α>.<j>``: the j-th random α-fraction of the rows of steps
                                        s .. end − 1 removed): hashes, the queries' losses
    DIR/seed-<k>/retest/loo/<t>-<i>/, DIR/seed-<k>/retest/groups/<α>-<j>/   with ceiling: the removal again on the
                                        nudged twin (``retest.<removal>``: the same rows removed, one ulp at s as the
                                        nudge arm of ceiling.nudge): hashes, the queries' losses
    DIR/seed-<k>/trak/<α_keep>-<j>-<r>/ with trak: the r-th retraining of the j-th TRAK subset (``trak.<α_keep>.<j>.<r>``:
                                        the rows of steps s .. end − 1 it does not keep removed; r ≥ 1 nudged at s):
                                        hashes, the queries' losses
    DIR/seed-<k>/nudges/<tensor>/       a nudge arm (chaos.nudges: one ulp of one element of <tensor> at s; its arm is
                                        ``nudge.<tensor>``): hashes, the queries' losses
    DIR/seed-<k>/training.json          the seed's training clock: the wall seconds its process spent training it and the
                                        run-updates trained, summed over the commands that trained it (written as each
                                        run finishes, so a stopped bank keeps what it timed; a stack of several seeds'
                                        runs counts on its first seed; attribution/bank/run.py ``SeedClock``)
    DIR/seed-<k>/*/**/distances.parquet (step, distance) of every run but the twin and the replica: ‖θ_run − θ_twin‖₂
                                        at every chaos.every-th step from s (forks/distances.py)
    DIR/integrity.json                  what was shown: replica control, own-row controls
    DIR/measured.parquet                seedlab attribution bank: measured Δ L_query per seed × candidate × query × horizon
    DIR/additivity.parquet              with pairs: each pair's Δ beside the sum of its two single-row Δs (attribution/bank/measure.py)
    DIR/weighted.parquet                measured Δ L_query per seed × candidate × query × horizon × loss weight (measure.py)
    DIR/distances.parquet               every run's distance to the twin per step, all seeds (measure.py)
    DIR/loo.parquet                     with loo: measured Δ L_query of every leave-one-out row per seed × step × row × query
                                        × horizon after its step (measure.py)
    DIR/groups.parquet, DIR/group_rows.parquet   with groups: every subset's measured Δ L_query per seed × α × subset ×
                                        query × horizon, and the rows each subset removed (measure.py)
    DIR/retest.parquet                  with ceiling: every repeated removal's Δ L_query on the twin beside its retest's
                                        on the nudged twin, per seed × removal × query × horizon (measure.py)
    DIR/trak.parquet, DIR/trak_rows.parquet   with trak: every TRAK retraining's Δ L_query per seed × α_keep × subset ×
                                        retraining × query × horizon, and the rows each subset removed (measure.py)
    DIR/rowscores.parquet, DIR/rowscores.json   seedlab attribution rowscores: every removal row's predicted effect by
                                        the estimators that score arbitrary training rows, and the run's settings and
                                        seconds (attribution/estimators/rowscores.py)
    DIR/attribution.parquet, DIR/attribution.json    seedlab attribution attribute: estimates beside measured
    DIR/training.json                   seedlab attribution bank: the seeds' clocks summed — the process-seconds of its
                                        training, the run-updates timed and one run's seconds at that rate
                                        (attribution/bank/run.py ``write_training``)
    DIR/metagrad.parquet, DIR/metagrad.json          seedlab attribution metagrad: every row's metagradient
                                        ∂L_q(θ_h)/∂w_{t,i} (seed, query, horizon, step, row, value) and the run's
                                        settings and costs (attribution/estimators/metagrad.py)
    DIR/report.md, DIR/*.png            seedlab attribution report (it reads the bank through :func:`read_attributed`)
    DIR/scores/<estimators>/            seedlab attribution score BANK: a score folder (below)

Every table of a bank is a top-level ``*.parquet`` and every record a top-level ``*.json``
(:meth:`BankDir.tables`, :meth:`BankDir.records`): what ``seedlab attribution export`` carries, whatever
tables later stages add.

An exported benchmark (``seedlab attribution export BANK --out DIR``; :class:`ExportDir`, attribution/benchmark.py)
keeps the bank's own paths for what it holds, so the bank's readers read it::

    DIR/manifest.json                   the format, the source bank, the rows kept, and the SHA-256 of every other
                                        file (``files``) with one digest over them: checked before every use
    DIR/*.json, DIR/*.parquet           the bank's records and tables (config, inputs, environment, integrity,
                                        measured, additivity, weighted, distances, attribution, metagrad, ...)
    DIR/seed-<k>/prefix*.safetensors    the prefix's complete state at s (and any prefix-<t> a removal arm started from)
    DIR/seed-<k>/twin/                  the twin's step-<t>.safetensors, manifest.json, queries.parquet, losses.parquet,
                                        done.json
    DIR/rows.safetensors                the corpus slice: the spans of the training split the twins' batches read
                                        (starts, lengths, tokens, and n_tokens: the split's length)
    DIR/seed-<k>/removed/rows.safetensors   (format 2, with loo, groups or trak) the run's own rows the removal arms
                                        removed: step, row (its index in the batch) and tokens [R, T + 1] (x = tokens[:, :-1],
                                        y = tokens[:, 1:]), the rates of their updates (lr)
    DIR/seed-<k>/removed/step-<t>.safetensors, manifest.json   (--checkpoints rows) the twin's weights after t updates at
                                        every removed row's step t the twin did not save itself, replayed and checked
    DIR/corpus/meta.json, DIR/corpus/<tokenizer file>   the corpus's meta.json and its tokenizer (if it has a file)
    DIR/scores/<estimators>/            seedlab attribution score DIR (not in the manifest)

A score folder (``seedlab attribution score``; :class:`ScoreDir`) is laid out as an attributed bank's top, so
``seedlab attribution report`` reads it: config.json, integrity.json, attribution.parquet, attribution.json,
every other table of the bank (additivity, weighted, distances, loo, ...), correlations.parquet, report.md and figures.

A kept grid-cell summary (attribution/analyses/grid.py ``Cell.to_dir``; :data:`CellSummaryDir`, seedlab/cells.py's kept
cell folder), a small folder that outlives its bank, and the grid rendered across them (:class:`GridDir`)::

    SUMMARY/cell.json                   the cell's scalars (B, lr, seeds, λ, ε, each stage's wall time)
    SUMMARY/<topic>.csv                 one frame per topic (size, errors, responses, h_star, estimators)
    OUT/grid.md, OUT/grid-table.csv, OUT/grid-law.csv   the table across cells and the law (the driver's OUT)

The folder policy of ``seedlab attribution bank`` (forks/folders.py ``DesignFolder.claim``): an
absent or empty folder starts a bank; a folder holding the same design (config.json, with fields
added since at their defaults) resumes it (finished runs are skipped, unfinished ones restart from
the kept prefix); anything else is refused unless ``--force``, which removes it first. Resuming
also requires the same inputs (:meth:`BankDir.check_inputs`) and environment (environment.json).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from seedlab.attribution.bank.config import AttributionConfig
from seedlab.cells import CellDir, TableDir
from seedlab.config import parse, with_new_defaults
from seedlab.errors import SeedlabError
from seedlab.forks.folders import DesignFolder, RunFolder, open_design
from seedlab.store import LOCK

if TYPE_CHECKING:  # texts.py loads torch (it cuts batches): imported where used, so the report reads a bank without it
    from seedlab.attribution.bank.texts import Inputs, Text


class ForkFolder(RunFolder):
    """One forked run of one seed: the twin (its weights at the saved steps), its replica (hashes
    only) or a candidate's, a replicate's or a pair's (hashes and query losses): forks.folders.RunFolder's files, and ``queries.parquet``."""

    @property
    def queries(self) -> Path:
        """(step, text, loss): the texts' L_query at every horizon."""
        return self.path / "queries.parquet"


def _check_name(name: str) -> None:
    """A run's name must be a folder name (forks/arms.py ``NAME``)."""
    from seedlab.forks.arms import NAME  # arms.py loads torch (perturbations); the report reads without it

    if not NAME.match(name):
        raise SeedlabError(f"candidate name: letters, digits, '.', '_' and '-' only (a folder name), got {name!r}")


@dataclass(frozen=True)
class BankDir(DesignFolder):
    """The layout of a bank folder (see the module docstring; config, inputs, environment, prefix,
    integrity, report and figures: forks/folders.py ``DesignFolder``)."""

    study, noun, arm_word = "attribution", "bank", "run"

    def run(self, seed: int, arm: str) -> ForkFolder:
        """An arm's run: the twin's, a candidate's, a candidate's replicate (``replicate.<name>``) or a
        pair's (``pair.<first>..<second>``)."""
        from seedlab.attribution.bank.removals import GROUP, LOO, RETEST, TRAK, parse_group, parse_loo, parse_trak
        from seedlab.attribution.bank.texts import NUDGE, PAIR, REPLICATE, WEIGHTED, weight_and_candidate

        if arm.startswith(RETEST):  # the removal's own folder, under retest/
            inner = self.run(seed, arm.removeprefix(RETEST)).path.relative_to(self.seed(seed))
            if inner.parts[0] not in ("loo", "groups"):
                raise SeedlabError(f"retest arm: expected retest.loo.<step>.<row> or retest.group.<alpha>.<subset>, "
                                   f"got {arm!r}")
            return ForkFolder(self.seed(seed) / "retest" / inner)
        if arm.startswith(TRAK):
            keep, k, r = parse_trak(arm)
            return ForkFolder(self.seed(seed) / "trak" / f"{keep}-{k}-{r}")
        if arm.startswith(LOO):
            t, i = parse_loo(arm)
            return ForkFolder(self.seed(seed) / "loo" / f"{t}-{i}")
        if arm.startswith(GROUP):
            alpha, k = parse_group(arm)
            return ForkFolder(self.seed(seed) / "groups" / f"{alpha}-{k}")
        if arm.startswith(REPLICATE):
            return self.replicate_of(seed, arm.removeprefix(REPLICATE))
        if arm.startswith(PAIR):
            return self._named(seed, "pairs", arm.removeprefix(PAIR))
        if arm.startswith(NUDGE):
            tensor = arm.removeprefix(NUDGE)
            _check_name(tensor)
            return self.nudge(seed, tensor)
        if arm.startswith(WEIGHTED):
            w, name = weight_and_candidate(arm)
            return self.weighted(seed, w, name)
        return self.twin(seed) if arm == "twin" else self.candidate(seed, arm)

    def twin(self, seed: int) -> ForkFolder:
        return ForkFolder(self.seed(seed) / "twin")

    def replica(self, seed: int) -> ForkFolder:
        return ForkFolder(self.seed(seed) / "replica")

    def candidate(self, seed: int, name: str) -> ForkFolder:
        return self._named(seed, "candidates", name)

    def replicate_of(self, seed: int, name: str) -> ForkFolder:
        """Candidate ``name``'s replicate: its text in row ``candidates.replicate_row``."""
        return self._named(seed, "replicates", name)

    def weighted(self, seed: int, w: str, name: str) -> ForkFolder:
        """Candidate ``name`` at loss weight ``w`` (as texts.py ``weight_label`` writes it)."""
        return ForkFolder(self._named(seed, "weighted", w).path / self._named(seed, "weighted", name).path.name)

    def pair(self, seed: int, first: str, second: str) -> ForkFolder:
        """The pair's run: ``first`` in row ``injection_row``, ``second`` in row ``candidates.replicate_row``."""
        from seedlab.attribution.bank.texts import pair

        return self.run(seed, pair(first, second))

    def nudge(self, seed: int, tensor: str) -> ForkFolder:
        """The nudge arm of ``tensor`` (``nudge.<tensor>``, :meth:`run`'s folder), without the name check :meth:`run`
        imports torch for: the report reads the nudges' query losses by it (``tensor`` from the bank's config)."""
        return ForkFolder(self.seed(seed) / "nudges" / tensor)

    def _named(self, seed: int, folder: str, name: str) -> ForkFolder:
        _check_name(name)
        return ForkFolder(self.seed(seed) / folder / name)

    def upgrade(self, old: dict) -> dict:
        """A config.json written by an older seedlab, with the fields AttributionConfig has gained since at their defaults."""
        return with_new_defaults(AttributionConfig, old)

    @property
    def measured(self) -> Path:
        return self.root / "measured.parquet"

    @property
    def additivity(self) -> Path:
        return self.root / "additivity.parquet"

    @property
    def weighted_measured(self) -> Path:
        return self.root / "weighted.parquet"

    @property
    def distances(self) -> Path:
        return self.root / "distances.parquet"

    @property
    def loo(self) -> Path:
        """With loo: every leave-one-out row's measured effect (measure.py ``LOO_COLUMNS``)."""
        return self.root / "loo.parquet"

    @property
    def groups(self) -> Path:
        """With groups: every subset's measured effect (measure.py ``GROUP_COLUMNS``)."""
        return self.root / "groups.parquet"

    @property
    def group_rows(self) -> Path:
        """With groups: the (step, row)s each subset removed (measure.py ``GROUP_ROW_COLUMNS``)."""
        return self.root / "group_rows.parquet"

    @property
    def retest(self) -> Path:
        """With ceiling: every repeated removal's effect on the twin and on the nudged twin (measure.py ``RETEST_COLUMNS``)."""
        return self.root / "retest.parquet"

    @property
    def trak(self) -> Path:
        """With trak: every TRAK retraining's measured effect (measure.py ``TRAK_COLUMNS``)."""
        return self.root / "trak.parquet"

    @property
    def trak_rows(self) -> Path:
        """With trak: the (step, row)s each TRAK subset removed (measure.py ``TRAK_ROW_COLUMNS``)."""
        return self.root / "trak_rows.parquet"

    @property
    def rowscores(self) -> Path:
        """seedlab attribution rowscores: predicted removal effects of training rows (rowscores.py ``COLUMNS``)."""
        return self.root / "rowscores.parquet"

    @property
    def rowscores_json(self) -> Path:
        """seedlab attribution rowscores: its estimators, rows, horizons and seconds per seed."""
        return self.root / "rowscores.json"

    @property
    def attribution(self) -> Path:
        return self.root / "attribution.parquet"

    @property
    def attribution_json(self) -> Path:
        return self.root / "attribution.json"

    @property
    def metagrad(self) -> Path:
        """seedlab attribution metagrad: every row's metagradient (attribution/estimators/metagrad.py ``COLUMNS``)."""
        return self.root / "metagrad.parquet"

    @property
    def metagrad_json(self) -> Path:
        """seedlab attribution metagrad: its settings, counts and wall time per seed."""
        return self.root / "metagrad.json"

    @property
    def training(self) -> Path:
        """seedlab attribution bank: its training's seconds and updates (run.py ``write_training``): what one
        training run costs, beside which the leaderboard sets the estimators' seconds."""
        return self.root / "training.json"

    def seed_training(self, seed: int) -> Path:
        """One seed's training clock, summed over the commands that trained it (run.py ``SeedClock``)."""
        return self.seed(seed) / "training.json"

    def tables(self) -> list[Path]:
        """Every table of the bank: its top-level ``*.parquet`` files (measured, additivity, attribution, ...)."""
        return sorted(self.root.glob("*.parquet"))

    def records(self) -> list[Path]:
        """Every record of the bank: its top-level ``*.json`` files (config, inputs, environment, integrity, ...)."""
        return sorted(self.root.glob("*.json"))

    def scores(self, name: str) -> Path:
        """The score folder of ``seedlab attribution score`` for estimators named ``name`` (a folder name)."""
        return self.root / "scores" / name

    def prefixes(self, seed: int) -> list[Path]:
        """Every kept prefix state of ``seed``: prefix.safetensors (at s) and any prefix-<t>.safetensors (t < s)."""
        return sorted(self.seed(seed).glob("prefix*.safetensors"))

    def check_inputs(self, inputs: dict) -> None:
        """A folder started before must be resumed with the same inputs (inputs.json): the corpus's
        hashes, every candidate's and query's token ids. Anything else is refused, before anything is written."""
        old = self.started_inputs(inputs)  # the corpus checked
        if old is None:
            return
        for kind in ("candidates", "queries"):
            a, b = ({t["name"]: t for t in record.get(kind, [])} for record in (old, inputs))
            for name in sorted(set(a) | set(b)):
                if a.get(name) != b.get(name):
                    what = "is new" if name not in a else "is gone" if name not in b else "was edited"
                    raise SeedlabError(f"{kind}.{name}: {what} since {self.root} was started (a bank from a different "
                                       "design: its inputs.json differs); restore it, or --force to start over")


# --------------------------------------------------------------------------- reading a bank back


@dataclass
class Bank:
    """A bank on disk, as the later stages read it: its folder, config and inputs (texts, corpus)."""

    dir: BankDir
    cfg: AttributionConfig
    inputs: Inputs

    @property
    def root(self) -> Path:
        return self.dir.root

    def finished_candidates(self, seed: int) -> dict[str, Text]:
        """The seed's candidates whose run finished: ``{name: Text}``, in the design's order."""
        return {n: t for n, t in self.inputs.candidates_of(seed).items() if self.dir.candidate(seed, n).finished}


def open_bank(root: str | Path, corpus: str | Path | None = None) -> Bank:
    """Read a bank folder's config and inputs and open its corpus (its hashes compared with the
    bank's: forks/folders.py ``open_design``); a folder that is not an attribution bank is a one-line error."""
    from seedlab.attribution.bank.texts import Inputs, Text

    rd = BankDir(Path(root))

    def config(record: dict) -> AttributionConfig:
        try:
            return parse(AttributionConfig, record)
        except SeedlabError as e:
            raise SeedlabError(f"{rd.root}: not an attribution bank folder (config.json: {e})") from None

    disk = open_design(rd, config, corpus)
    cfg = disk.cfg
    def texts(kind: str) -> dict[str, Text]:
        return {t["name"]: Text(t["kind"], tuple(t["tokens"]), t["text"]) for t in disk.inputs[kind]}

    c = disk.corpus
    return Bank(rd, cfg, Inputs(cfg, c, cfg.gpt_config(c.vocab_size), texts("candidates"), texts("queries")))


@dataclass
class Attributed:
    """What the report reads of an attributed bank (:func:`read_attributed`)."""

    dir: BankDir
    df: pd.DataFrame  # attribution.parquet
    config: dict  # config.json, as written
    integrity: dict  # integrity.json ({} when absent)
    meta: dict  # attribution.json ({} when absent)
    pairs: pd.DataFrame | None  # additivity.parquet; None for a bank without pairs
    weighted: pd.DataFrame | None = None  # weighted.parquet; None for a bank without row weights
    distances: pd.DataFrame | None = None  # distances.parquet; None for a bank from before it
    loo: pd.DataFrame | None = None  # loo.parquet; None for a bank without leave-one-out arms
    groups: pd.DataFrame | None = None  # groups.parquet; None for a bank without group arms
    group_rows: pd.DataFrame | None = None  # group_rows.parquet (with groups)
    nudges: pd.DataFrame | None = None  # the nudge runs' query losses beside the twin's (:func:`read_nudge_losses`)
    retest: pd.DataFrame | None = None  # retest.parquet; None for a bank without a ceiling
    trak: pd.DataFrame | None = None  # trak.parquet; None for a bank without TRAK subsets
    trak_rows: pd.DataFrame | None = None  # trak_rows.parquet (with trak)


NUDGE_LOSS_COLUMNS = ["seed", "nudge", "step", "text", "loss", "twin_loss"]


def read_nudge_losses(rd: BankDir, config: dict) -> pd.DataFrame | None:
    """Every finished nudge run's (``chaos.nudges``) texts' L at every horizon beside its seed's twin's at the same
    step (columns :data:`NUDGE_LOSS_COLUMNS`; ``nudge``: the tensor), from seed-<k>/nudges/<tensor>/queries.parquet
    and the twin's queries.parquet (no corpus, no torch); None where no nudge run finished beside its twin (a bank
    without nudges, an export, a score folder). What the losses give: attribution/analyses/loo.py ``beside_nudges``."""
    frames = []
    for seed in config.get("seeds", []):
        twin = rd.twin(seed)
        if not (twin.finished and twin.queries.is_file()):
            continue
        t = pd.read_parquet(twin.queries).rename(columns={"loss": "twin_loss"})
        for tensor in (config.get("chaos") or {}).get("nudges", []):
            where = rd.nudge(seed, tensor)
            if not (where.finished and where.queries.is_file()):
                continue
            d = pd.read_parquet(where.queries).merge(t, on=["step", "text"], how="inner", validate="1:1")
            frames.append(d.assign(seed=seed, nudge=tensor))
    return pd.concat(frames, ignore_index=True)[NUDGE_LOSS_COLUMNS] if frames else None


def read_attributed(root: str | Path) -> Attributed:
    """A bank folder's files as the report reads them (no corpus, no torch); a folder not yet
    attributed is a one-line error."""
    rd = BankDir(Path(root))
    config = rd.read_config()
    if not rd.attribution.is_file():
        raise SeedlabError(f"{rd.root}: no attribution.parquet (run `seedlab attribution attribute {rd.root}` first)")
    integrity = json.loads(rd.integrity.read_text()) if rd.integrity.is_file() else {}
    meta = json.loads(rd.attribution_json.read_text()) if rd.attribution_json.is_file() else {}
    read = lambda path: pd.read_parquet(path) if path.is_file() else None
    return Attributed(rd, pd.read_parquet(rd.attribution), config, integrity, meta, read(rd.additivity),
                      read(rd.weighted_measured), read(rd.distances), read(rd.loo), read(rd.groups),
                      read(rd.group_rows), read_nudge_losses(rd, config), read(rd.retest), read(rd.trak),
                      read(rd.trak_rows))


#: a kept grid-cell summary folder (module doc): where its record and its frames live (seedlab/cells.py)
CellSummaryDir = CellDir


@dataclass(frozen=True)
class GridDir(TableDir):
    """Where the grid's table across kept cells is rendered (experiments/attribution_grid.py): ``grid.md``,
    ``grid-table.csv``, ``grid-law.csv``."""

    stem = "grid"


@dataclass(frozen=True)
class LeaderboardDir(TableDir):
    """Where ``seedlab attribution leaderboard --out DIR`` renders its table across banks and exports:
    ``leaderboard.md``, ``leaderboard-table.csv``, ``leaderboard-grid.png``."""

    stem = "leaderboard"


@dataclass(frozen=True)
class ExportDir(BankDir):
    """An exported benchmark (module doc): a bank's paths for what it keeps, and the export's own files."""

    noun = "benchmark"
    #: the subfolder that score folders live in: the one part of an export its manifest does not cover
    SCORES = "scores"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def rows(self) -> Path:
        """The corpus slice: spans of the training split (benchmark.py ``SparseTokens``)."""
        return self.root / "rows.safetensors"

    @property
    def corpus(self) -> Path:
        """The corpus's meta.json and tokenizer file (no token files)."""
        return self.root / "corpus"

    @property
    def corpus_meta(self) -> Path:
        return self.corpus / "meta.json"

    def tokenizer(self, name: str) -> Path:
        """The corpus's tokenizer file (its meta.json's ``tokenizer.file``)."""
        return self.corpus / Path(name).name

    def removed(self, seed: int) -> RemovedFolder:
        """The seed's removed rows and the twin's weights at their steps (format 2; :class:`RemovedFolder`)."""
        return RemovedFolder(self.seed(seed) / "removed")

    def relative(self, path: Path) -> str:
        """``path`` as manifest.json names it."""
        return path.relative_to(self.root).as_posix()

    def files(self) -> list[Path]:
        """Every file the manifest covers: all files below the folder but manifest.json, the lock and scores/."""
        return sorted(p for p in self.root.rglob("*") if (p.is_file() or p.is_symlink())
                      and p != self.manifest and p.name != LOCK
                      and p.relative_to(self.root).parts[0] != self.SCORES)


class RemovedFolder(ForkFolder):
    """An export's ``seed-<k>/removed/``: the rows the removal arms removed (:attr:`rows`) and, as a run folder's
    checkpoints (``step-<t>.safetensors`` with ``manifest.json``), the twin's weights at their steps."""

    @property
    def rows(self) -> Path:
        """step, row, tokens [R, T + 1], lr (hashed in the file's metadata)."""
        return self.path / "rows.safetensors"


@dataclass(frozen=True)
class ScoreDir(BankDir):
    """A score folder (module doc): an attributed bank's top, and the headline correlations as a table."""

    noun = "score"

    @property
    def loo_by_age(self) -> Path:
        """With --row-estimator on a bank with loo: attribution/analyses/loo.py ``by_age`` of every row estimator."""
        return self.root / "loo_by_age.parquet"

    @property
    def loo_pooled(self) -> Path:
        """... and loo.py ``pooled`` (every leave-one-out step of a horizon pooled)."""
        return self.root / "loo_pooled.parquet"

    @property
    def lds(self) -> Path:
        """With --row-estimator on a bank with groups: attribution/analyses/lds.py ``lds`` of every row estimator."""
        return self.root / "lds.parquet"

    @property
    def correlations(self) -> Path:
        """stats.analyse's correlations of every estimator scored (what the report's headline tables show)."""
        return self.root / "correlations.parquet"

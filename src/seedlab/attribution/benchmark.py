"""A bank as a benchmark others score against: ``seedlab attribution export`` and ``seedlab attribution score``.

**Export** (:func:`export`) writes a self-contained folder (layout: rundir.py ``ExportDir``) from a finished
bank: its records and tables (config, inputs — every candidate's and query's token ids —, environment,
integrity, measured.parquet and every other top-level table the bank holds: additivity, weighted, distances,
attribution, metagrad, and whatever effect tables later stages add), each seed's prefix (the complete state at
s: θ_s and the AdamW moments; and any older prefix a removal arm started from) and its twin's saved weights (s, every horizon, TracIn's cadence) with their
manifests and query losses, the corpus's meta.json and tokenizer, and the *corpus slice* the estimators read:
the spans of the training split that the twins' batches take (``rows.safetensors``):

- ``--rows trained`` (the default): the batches of steps 0 .. end of every seed — every row a twin trained on
  (and step end's batch, which the curvature fit at the last horizon draws from), so every built-in estimator
  (unroll and metagrad replays, EK-FAC's and TRAK's fit sets) can be rescored from the folder;
- ``--rows injection``: the batch of step s only — what a plug-in (either form: attribution/estimators/plugins.py) and the
  estimators at θ_s read; an estimator that needs more is refused in one line naming the missing rows.

**The run's own rows** (format 2). A bank with removal arms (``loo``, ``groups``: attribution/bank/removals.py
``rows_of``) also gets, per seed, ``seed-<k>/removed/rows.safetensors``: every row those arms removed — its step, its
index in the batch, its T + 1 token ids and the rate of its update — so an outside estimator scores the
leave-one-out and group effects (loo.parquet, groups.parquet, group_rows.parquet, exported as every table is) whatever
``--rows`` keeps; and with ``--checkpoints rows`` (the default) the twin's weights after every removed row's step t
that the twin did not save itself (``seed-<k>/removed/step-<t>.safetensors`` and ``manifest.json``: the weights the
row was trained at, what TracIn's one-visit term reads), replayed from the prefix (from step 0 for a row before s)
and checked against the twin's hashes at every step it recorded (metagrad.py ``replay_check``; a replay that
differs is a one-line error). ``--checkpoints saved`` keeps the twin's own steps only (s, the horizons, TracIn's
cadence): the estimators at a horizon still run, one that asks for a row's own step is refused in one line. An
export of format 1 (before the removed rows) still reads and scores as before; a row estimator asked of it is
refused in one line.

No candidate run's files are exported (measured.parquet holds their effects) and no token file: the slice
keeps the training split's length, so lm/batches.py draws the same offsets from it. Every checkpoint is read
back against its recorded hashes before it is copied. Last, ``manifest.json``: the format, the source bank, the
rows kept and the SHA-256 of every other file (store.py ``file_sha256``) with one digest over them
(store.py ``digest``; publish it beside a score). The folder is built beside ``--out`` and renamed into place:
a failed export leaves nothing; a non-empty ``--out`` is refused before any work.

**Score** (:func:`score`) opens an export — every file's SHA-256 checked against the manifest first (a file
changed, missing or added since the export is refused in one line naming the first, in path order; the
``scores/`` subfolder is the score folders' and not covered) — or a bank folder itself, and runs the named
estimators (plug-ins ``package.module:function``, or built-ins) through attribute.py's very code
(``estimates_of_seed``: the same case, θ_s, AdamW state, twin weights, gradients), with the four baselines
unless ``baselines=False``. The estimates are set beside the measured effects (attribute.py ``COLUMNS``),
beside them the bank's own estimators' rows as the bank attributed them (its attribution.parquet, where it
has one: the leaderboard a plug-in joins), and written to a score folder (rundir.py ``ScoreDir``, default
``DIR/scores/<estimators>``) laid out as an attributed bank's top, so report.py renders it unchanged:
``report.md`` with the bank report's tables and figures, and ``correlations.parquet`` (stats.analyse's
correlations, the headline numbers as a table). Scoring an export gives the numbers scoring its bank gives
(tests/attribution/test_export.py). No training, and no corpus: an export needs nothing outside itself.

**Row estimators** (``--row-estimator``, ``rows=``): the estimators of the run's own rows — the built-ins of
attribution/estimators/rowscores.py (tracin, grad-dot, grad-cosine, ekfac, trak) and training-rows plug-ins
(``package.module:function``, ``function(rows)``: the dattri adapter's attributors are such plug-ins) — run through
rowscores.py's own loop (``seed_rowscores``) on every removed row, their values written beside the bank's own row
scores (rowscores.parquet, rowscores.json) and scored through the very tables the bank report reads:
attribution/analyses/loo.py ``analyse`` (leave-one-out by age and pooled: loo_by_age.parquet, loo_pooled.parquet)
and attribution/analyses/lds.py ``analyse`` (the LDS over the groups: lds.parquet). A bank or export without
removed rows is refused in one line before any work, and so is an estimator that asks for rows or checkpoints the
export does not carry (before anything is written).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.attribution.bank.config import AttributionConfig
from seedlab.attribution.bank.rundir import Bank, BankDir, ExportDir, ScoreDir, open_bank
from seedlab.errors import SeedlabError, field_error
from seedlab.store import DONE, atomic_write, digest, file_sha256, read_verified, write_json, write_parquet, \
    write_safetensors

FORMAT = "seedlab-attribution-benchmark/2"
#: the formats this seedlab reads: format 1 exports (before the removed rows) still open and score
READS = ("seedlab-attribution-benchmark/1", FORMAT)
ROWS = ("trained", "injection")
#: --checkpoints: the twin's weights at every removed row's step too ("rows"), or its own saved steps only
CHECKPOINTS = ("rows", "saved")
#: scored beside every plug-in unless told otherwise: the report's "beyond every baseline" needs them
BASELINES = ("random", "loss", "gradnorm", "length")


# --------------------------------------------------------------------------- the corpus slice


class SparseTokens:
    """The training split as an export keeps it: its length, and the token spans its rows were cut from.

    ``tokens[a:b]`` of a span inside a kept span is that span's tokens (a numpy view); any other read is a
    one-line error naming the range (the estimator asked for rows the export did not keep)."""

    def __init__(self, starts: np.ndarray, lengths: np.ndarray, tokens: np.ndarray, n_tokens: int, rows: str):
        self.starts, self.lengths, self.tokens = starts.astype(np.int64), lengths.astype(np.int64), tokens
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.n_tokens, self.rows = int(n_tokens), rows

    def __len__(self) -> int:
        return self.n_tokens

    @property
    def dtype(self) -> np.dtype:
        return self.tokens.dtype

    def __getitem__(self, key):
        if isinstance(key, slice) and key.step in (None, 1) and key.start is not None and key.stop is not None:
            a, b = int(key.start), int(key.stop)
            i = bisect_right(self.starts, a) - 1  # the starts are sorted (spans writes them so)
            if i >= 0 and b <= self.starts[i] + self.lengths[i] and a <= b:
                o = self.offsets[i] + a - self.starts[i]
                return self.tokens[o : o + b - a]
            raise SeedlabError(f"corpus slice: tokens {a}..{b} of the training split are not in this benchmark (it "
                               f"holds the rows of {'the batch of s' if self.rows == 'injection' else 'steps 0 .. end'}"
                               f", --rows {self.rows}): this estimator reads more of the corpus; export the bank with "
                               f"--rows trained{', or score it on the bank' if self.rows == 'trained' else ''}")
        raise SeedlabError(f"corpus slice: only contiguous token ranges can be read from a benchmark, got {key!r}")

    def __array__(self, *args, **kwargs):
        raise SeedlabError("corpus slice: a benchmark holds part of the training split, not the whole of it")


def row_steps(cfg: AttributionConfig, rows: str) -> list[int]:
    """The steps whose batches an export keeps (module doc)."""
    if rows not in ROWS:
        raise field_error("--rows", " or ".join(ROWS), rows)
    return [cfg.injection_step] if rows == "injection" else list(range(cfg.end + 1))


def spans(offsets: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the union of the ranges [o, o + length): sorted, overlapping or touching ones merged."""
    out: list[list[int]] = []
    for o in np.unique(np.asarray(offsets, dtype=np.int64)):
        if out and o <= out[-1][1]:
            out[-1][1] = max(out[-1][1], int(o) + length)
        else:
            out.append([int(o), int(o) + length])
    a = np.array(out, dtype=np.int64).reshape(-1, 2)
    return a[:, 0], a[:, 1] - a[:, 0]


# --------------------------------------------------------------------------- export


@dataclass(frozen=True)
class Exported:
    path: Path
    files: int
    bytes: int
    digest: str
    seconds: float
    rows: str


def export(root: str | Path, out: str | Path, *, rows: str = "trained", row_checkpoints: str = "rows",
           device: str = "auto") -> Exported:
    """Write the benchmark folder ``out`` from the bank ``root`` (module doc); bad input writes nothing.
    ``row_checkpoints`` (``--checkpoints``): "rows" or "saved" (module doc); ``device``: where the twin is replayed
    for the removed rows' checkpoints (the bank's own, for its hashes)."""
    t0 = time.perf_counter()
    out = Path(out)
    if row_checkpoints not in CHECKPOINTS:
        raise field_error("--checkpoints", " or ".join(CHECKPOINTS), row_checkpoints)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SeedlabError(f"--out: {out} is not empty (an export is never written over an existing folder: "
                           "choose a new or empty one)")
    if ExportDir(Path(root)).manifest.is_file():
        raise SeedlabError(f"{root}: is an exported benchmark already (export a bank folder)")
    import torch  # after the checks above: bad input fails fast

    from seedlab.lm.batches import batch_indices

    bank = open_bank(root)
    rd, cfg = bank.dir, bank.cfg
    steps = row_steps(cfg, rows)
    if not rd.measured.is_file():
        raise SeedlabError(f"{rd.root}: no measured.parquet (an unfinished bank: run seedlab attribution bank to the "
                           "end first)")
    seeds = sorted(int(k) for k in pd.read_parquet(rd.measured, columns=["seed"]).seed.unique())
    twin_steps = {seed: checkpoints(bank, seed) for seed in seeds}  # every file there and hashing as recorded
    T, train = bank.inputs.gcfg.block_size, bank.inputs.corpus.train
    offsets = np.concatenate([batch_indices(seed, t, n_tokens=len(train), batch_size=cfg.batch_size, block_size=T)
                              for seed in seeds for t in steps])
    starts, lengths = spans(offsets, T + 1)
    tokens = np.concatenate([np.asarray(train[a : a + n], dtype=np.int32) for a, n in zip(starts, lengths)])
    removed = removed_of(bank, seeds, row_checkpoints, twin_steps, device)  # replayed and checked before anything is written

    staging = _staging(out, "export")
    try:
        ex = ExportDir(staging)
        for src in [*rd.records(), *rd.tables()]:
            _copy(src, ex.root.joinpath(src.relative_to(rd.root)))
        for seed in seeds:
            for src in rd.prefixes(seed):  # at s, and any older one a removal arm started from
                _copy(src, ex.root.joinpath(src.relative_to(rd.root)))
            src, dst = rd.twin(seed), ex.twin(seed)
            for t in twin_steps[seed]:
                _copy(src.checkpoint(t), dst.checkpoint(t))
            for a, b in ((src.manifest, dst.manifest), (src.queries, dst.queries), (src.losses, dst.losses)):
                if a.is_file():
                    _copy(a, b)
            if src.finished:
                _copy(src.path.joinpath(DONE), dst.path.joinpath(DONE))
            if seed in removed:
                _write_removed(ex.removed(seed), removed[seed])
        # one metadata key only (the hashes): safetensors writes its metadata map in no fixed order, and an
        # export of the same bank must be the same bytes
        write_safetensors(ex.rows, {"starts": torch.from_numpy(starts), "lengths": torch.from_numpy(lengths),
                                    "tokens": torch.from_numpy(tokens), "n_tokens": torch.tensor(len(train))},
                          hashed=True)
        corpus = bank.inputs.corpus
        write_json(ex.corpus_meta, corpus.meta)
        tok = corpus.meta.get("tokenizer", {}).get("file")
        if tok:
            _copy(corpus.path.joinpath(tok), ex.tokenizer(tok))
        files = {ex.relative(p): file_sha256(p) for p in ex.files()}
        from importlib.metadata import version

        write_json(ex.manifest, {
            "format": FORMAT, "seedlab": version("seedlab"), "bank": str(rd.root.resolve()), "rows": rows,
            "row_steps": [steps[0], steps[-1]], "train_tokens": len(train), "token_dtype": str(train.dtype),
            "seeds": seeds, "removed": _removed_record(removed, row_checkpoints), "files": files, "digest": digest(files),
        })
        size = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Exported(out, len(files) + 1, size, digest(files), time.perf_counter() - t0, rows)


@dataclass(frozen=True)
class Removed:
    """One seed's removed rows as an export carries them (module doc)."""

    steps: np.ndarray  # [R] int64: each row's step
    rows: np.ndarray  # [R] int64: its index in the batch of its step
    tokens: np.ndarray  # [R, T + 1] int32
    lrs: np.ndarray  # [R] float64: the rate of the update that consumed it
    weights: dict[int, dict]  # {t: the twin's state dict after t updates} for the steps the twin did not save


def removed_of(bank: Bank, seeds: list[int], checkpoints: str, saved: dict[int, list[int]], device: str
               ) -> dict[int, Removed]:
    """Every seed's :class:`Removed` (none for a bank without removal arms): the rows from the bank's corpus, and
    with ``checkpoints == "rows"`` the twin replayed to every removed row's step it did not save (``saved``) and
    checked at every step it recorded."""
    from seedlab.attribution.bank.removals import rows_of
    from seedlab.lm.schedule import lr_of

    cfg = bank.cfg
    names = rows_of(cfg)
    if not names:
        return {}
    import torch

    from seedlab.attribution.estimators.metagrad import replay_check
    from seedlab.attribution.estimators.rowscores import _row_tensors, replayed_weights
    from seedlab.lm.determinism import nondeterminism_is_an_error, settle
    from seedlab.lm.distributed import World

    dev = None
    out = {}
    for seed in seeds:
        x, y = _row_tensors(bank, seed, names)
        tokens = torch.cat([x, y[:, -1:]], dim=1).to(torch.int32).numpy()
        want = sorted({t for t, _ in names} - set(saved[seed])) if checkpoints == "rows" else []
        weights = {}
        if want:
            if dev is None:
                dev = World().device(device)
                settle(dev, cfg.threads)
            with nondeterminism_is_an_error():
                weights = replayed_weights(bank, seed, want, dev, replay_check(bank, seed, sorted(cfg.horizon_steps())))
        out[seed] = Removed(np.array([t for t, _ in names], dtype=np.int64), np.array([i for _, i in names], dtype=np.int64),
                            tokens, np.array([lr_of(cfg, t) for t, _ in names], dtype=np.float64), weights)
    return out


def _write_removed(folder, r: Removed) -> None:
    """``seed-<k>/removed/``: rows.safetensors (hashed), and each replayed step's weights beside a manifest of their
    hashes (rundir.py ``RemovedFolder``, a run folder: its ``weights(t)`` checks them)."""
    import torch

    from seedlab.store import tensor_hashes

    write_safetensors(folder.rows, {"step": torch.from_numpy(r.steps), "row": torch.from_numpy(r.rows),
                                    "tokens": torch.from_numpy(r.tokens), "lr": torch.from_numpy(r.lrs)}, hashed=True)
    if r.weights:
        for t, state in r.weights.items():
            write_safetensors(folder.checkpoint(t), state)
        write_json(folder.manifest, {str(t): tensor_hashes(state) for t, state in sorted(r.weights.items())})


def _removed_record(removed: dict[int, Removed], checkpoints: str) -> dict | None:
    """manifest.json's ``removed``: how many rows, which checkpoint policy, the steps replayed per seed."""
    if not removed:
        return None
    first = next(iter(removed.values()))
    return {"rows": len(first.steps), "checkpoints": checkpoints,
            "replayed": {str(seed): sorted(int(t) for t in r.weights) for seed, r in removed.items()}}


def _staging(final: Path, what: str) -> Path:
    """An empty folder beside ``final`` to build it in (renamed into place when whole), with a folder's usual
    mode (mkdtemp's is 0700)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.{what}-"))
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o777 & ~umask)
    return path


def _copy(src: Path, dst: Path) -> None:
    atomic_write(dst, lambda p: shutil.copyfile(src, p))


def checkpoints(bank: Bank, seed: int, *, read: bool = True) -> list[int]:
    """The twin's saved steps of ``seed`` (its manifest's), and with ``read`` each file read back against its
    hashes, and the prefix against its own: a bank without them (removed, never kept, or changed) is a one-line
    error. (Without ``read`` only their presence is checked: every later read checks the hashes.)"""
    rd, cfg = bank.dir, bank.cfg
    if not rd.prefix(seed).is_file():
        raise SeedlabError(f"seed {seed}: {rd.prefix(seed)} is missing (a bank without its checkpoints: the "
                           "prefix's state at s is what every estimator starts from)")
    for prefix in rd.prefixes(seed) if read else ():
        read_verified(prefix)  # against the hashes the file carries
    twin = rd.twin(seed)
    manifest = twin.read_manifest()
    want = sorted({*cfg.twin_steps(), *(int(t) for t in manifest)})
    missing = [t for t in want if str(t) not in manifest or not twin.checkpoint(t).is_file()]
    if missing:
        raise SeedlabError(f"seed {seed}: {twin.checkpoint(missing[0])} is missing (a bank without its checkpoints: "
                           f"the twin's weights at s, every horizon and TracIn's steps are needed; it has "
                           f"{', '.join(str(t) for t in want if t not in missing) or 'none'})")
    for t in want if read else ():
        twin.weights(t)  # every tensor against the manifest
    return want


# --------------------------------------------------------------------------- verify and open


def verify(root: str | Path) -> dict:
    """The export's manifest, after checking every file against it (module doc); else a one-line error naming
    the first file (in path order) that is changed, missing or not listed."""
    ex = ExportDir(Path(root))
    if not ex.root.is_dir():
        raise SeedlabError(f"{root}: no such folder")
    if not ex.manifest.is_file():
        raise SeedlabError(f"{ex.root}: not an exported benchmark (no manifest.json; seedlab attribution export "
                           "BANK --out DIR writes one)")
    try:
        m = json.loads(ex.manifest.read_text())
        files, fmt = dict(m["files"]), m["format"]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise SeedlabError(f"{ex.manifest}: not a benchmark manifest (unreadable or incomplete)") from None
    if fmt not in READS:
        raise SeedlabError(f"{ex.manifest}: format {fmt!r}; this seedlab reads {' and '.join(map(repr, READS))}")
    on_disk = {ex.relative(p): p for p in ex.files()}
    again = "the folder was changed after export; restore it or export the bank again"
    for rel in sorted(set(files) | set(on_disk)):
        if rel not in on_disk:
            raise SeedlabError(f"{ex.root}: {rel} is missing (manifest.json lists it): {again}")
        if rel not in files:
            raise SeedlabError(f"{ex.root}: {rel} is not in manifest.json (added after export): {again}")
        if on_disk[rel].is_symlink() or file_sha256(on_disk[rel]) != files[rel]:
            raise SeedlabError(f"{ex.root}: {rel} does not match its SHA-256 in manifest.json: {again}")
    if digest(files) != m.get("digest"):
        raise SeedlabError(f"{ex.manifest}: its digest does not match its files' hashes (manifest.json was edited)")
    return m


@dataclass
class ExportedBank(Bank):
    """An export opened as the bank's readers read a bank (attribute.py's estimators take it as one): its
    finished candidates are those measured.parquet holds."""

    measured: pd.DataFrame = field(default_factory=pd.DataFrame)
    manifest: dict = field(default_factory=dict)
    _memo: dict = field(default_factory=dict, repr=False)

    def finished_candidates(self, seed: int):
        have = set(self.measured.loc[self.measured.seed == seed, "candidate"])
        return {n: t for n, t in self.inputs.candidates_of(seed).items() if n in have}

    def removed_rows(self, seed: int):
        """The seed's removed rows (module doc) as ([(t, i), ...], x [R, T], y [R, T]) int64, read once and checked
        against the file's hashes; None for an export without them (format 1, or a bank without removal arms).
        rowscores.py reads an export's rows through it."""
        if ("rows", seed) not in self._memo:
            f = self.dir.removed(seed).rows
            got = None
            if f.is_file():
                t, _ = read_verified(f)
                tok = t["tokens"].long()
                got = (list(zip(t["step"].tolist(), t["row"].tolist())), tok[:, :-1].contiguous(),
                       tok[:, 1:].contiguous())
            self._memo["rows", seed] = got
        return self._memo["rows", seed]

    def removed_weights(self, seed: int):
        """The run folder of the twin's weights at the removed rows' steps (rundir.py ``RemovedFolder``; its
        ``weights(t)`` hash-checked), or None where the export has none (``--checkpoints saved``, format 1)."""
        folder = self.dir.removed(seed)
        return folder if folder.manifest.is_file() else None


def open_export(root: str | Path) -> ExportedBank:
    """An export, verified (:func:`verify`), as a bank: config, inputs (texts, the corpus slice), measured."""
    manifest = verify(root)  # before the imports below (torch): a folder that is none, or was changed, fails fast
    from seedlab.attribution.bank.texts import Inputs, Text
    from seedlab.config import parse
    from seedlab.corpus.corpus import Corpus
    from seedlab.corpus.tokenizers import tokenizer_for

    ex = ExportDir(Path(root))
    try:
        cfg = parse(AttributionConfig, ex.read_config())
    except SeedlabError as e:
        raise SeedlabError(f"{ex.root}: not an attribution benchmark (config.json: {e})") from None
    inputs = ex.read_inputs()
    meta = json.loads(ex.corpus_meta.read_text())
    t, _ = read_verified(ex.rows)
    train = SparseTokens(t["starts"].numpy(), t["lengths"].numpy(), t["tokens"].numpy(), int(t["n_tokens"]),
                         manifest.get("rows", "trained"))
    corpus = Corpus(path=ex.corpus, meta=meta, train=train, heldout=np.zeros(0, dtype=np.int32),
                    tokenizer=tokenizer_for(ex.corpus, meta))

    def texts(kind: str) -> dict[str, Text]:
        return {r["name"]: Text(r["kind"], tuple(r["tokens"]), r["text"]) for r in inputs[kind]}

    ins = Inputs(cfg, corpus, cfg.gpt_config(corpus.vocab_size), texts("candidates"), texts("queries"))
    return ExportedBank(ex, cfg, ins, measured=pd.read_parquet(ex.measured), manifest=manifest)


def open_scorable(root: str | Path) -> tuple[Bank, pd.DataFrame, dict]:
    """An export (verified) or a bank folder: (the bank, its measured effects, where they came from)."""
    root = Path(root)
    if ExportDir(root).manifest.is_file() or not BankDir(root).config.is_file():
        bank = open_export(root)
        return bank, bank.measured, {"kind": "export", "path": str(root.resolve()), "digest": bank.manifest["digest"],
                                     "bank": bank.manifest.get("bank")}
    from seedlab.attribution.bank.measure import collect

    bank = open_bank(root)
    measured = collect(bank)
    for seed in sorted(int(k) for k in measured.seed.unique()):
        checkpoints(bank, seed, read=False)  # before any work (an export's are covered by its manifest)
    return bank, measured, {"kind": "bank", "path": str(root.resolve())}


def bank_case(bank: Bank, seed: int):
    """The case every estimator of ``seed`` sees (attribute.py ``estimates_of_seed``): the ordinary batch of s,
    the injected row, the finished candidates and the queries (own texts first, when ``queries.own``)."""
    from seedlab.attribution.estimators.builtin import Case

    cfg = bank.cfg
    cands = {n: t.tokens for n, t in bank.finished_candidates(seed).items()}
    queries = (dict(cands) if cfg.queries.own else {}) | {n: t.tokens for n, t in bank.inputs.queries.items()}
    x, y = bank.inputs.ordinary_batch(seed)
    return Case.of(x, y, cfg.injection_row, cands, queries, bank.inputs.pad_id)


# --------------------------------------------------------------------------- score


@dataclass(frozen=True)
class Scored:
    path: Path  # the score folder
    report: Path
    estimators: list[str]  # computed here
    from_bank: list[str]  # the bank's rows, as it attributed them
    rows: int
    seconds: float
    source: dict
    row_estimators: list[str] = field(default_factory=list)  # the estimators of the run's own rows computed here
    tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)  # loo_by_age, loo_pooled, lds


def slug(names: Sequence[str]) -> str:
    """A score folder's name for the estimators ``names`` (a folder name)."""
    return "-".join(re.sub(r"[^A-Za-z0-9._-]+", ".", n) for n in names)[:100]


def check_rows(bank: Bank, row_names: Sequence[str], source: dict) -> list[str]:
    """The row estimators asked for, checked before any work (module doc): a bank or export without removed rows,
    an unknown estimator or one whose plug-in does not load is a one-line error."""
    from seedlab.attribution.bank.removals import rows_of
    from seedlab.attribution.estimators.rowscores import choose

    if not rows_of(bank.cfg):
        raise SeedlabError(f"{bank.root}: the bank removes no rows (no loo or groups section): --row-estimator "
                           f"{row_names[0]} scores the rows its leave-one-out and group arms removed, and it has none")
    if source["kind"] == "export" and not (bank.manifest.get("removed") or {}).get("rows"):
        raise SeedlabError(f"{bank.root}: this export carries no removed rows (format "
                           f"{bank.manifest.get('format', '?').rsplit('/', 1)[-1]}, before they were exported): "
                           f"--row-estimator {row_names[0]} needs the rows the leave-one-out and group arms removed; "
                           f"export the bank again with this seedlab")
    return choose(row_names)


def score(root: str | Path, estimators: Sequence[str] = (), *, rows: Sequence[str] = (), out: str | Path | None = None,
          force: bool = False, baselines: bool = True, device: str = "auto", progress: bool = True,
          report: bool = True) -> Scored:
    """Score ``estimators`` (single-row swaps) and ``rows`` (estimators of the run's own rows) on an export or a
    bank (module doc) into a score folder; returns where. ``baselines``: the four swap baselines beside the swap
    estimators (none are added when only row estimators are asked for). ``report=False``: the tables without
    report.md and its figures (rendering them is most of the time on a small bank)."""
    t0 = time.perf_counter()
    given = list(dict.fromkeys(n for n in estimators if n))
    row_names = list(dict.fromkeys(n for n in rows if n))
    if not given and not row_names:
        raise SeedlabError("--estimator: name one at least (a plug-in package.module:function, or a built-in; or "
                           "--row-estimator for the run's own rows)")
    bank, measured, source = open_scorable(root)  # before the imports below: bad input fails fast
    if row_names:
        row_names = check_rows(bank, row_names, source)

    from seedlab.attribution.estimators.attribute import COLUMNS, choose_estimators, seed_estimates, tracin_steps
    from seedlab.attribution.estimators.registry import get_estimator
    from seedlab.attribution.report.bank import write_report
    from seedlab.attribution.analyses.stats import analyse
    from seedlab.lm.determinism import settle
    from seedlab.lm.distributed import World
    from seedlab.progress import Bar

    names = choose_estimators(bank.cfg, [*given, *(b for b in BASELINES if baselines and b not in given)]) \
        if given else []
    target = Path(out) if out is not None else bank.dir.scores(slug(given + row_names))
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not force:
        raise SeedlabError(f"--out: {target} already holds scores (use --force to overwrite it)")
    dev = World().device(device)
    settle(dev, bank.cfg.threads)
    if "measured_replicate" not in measured:
        measured = measured.assign(measured_replicate=np.nan)
    seeds = sorted(int(k) for k in measured.seed.unique())
    with Bar("score", len(seeds) * (len(names) + len(row_names)), "estimators", enabled=progress) as bar:
        done = [seed_estimates(bank, seed, names, dev, bar) for seed in seeds] if names else []
        scored_rows = score_rows(bank, seeds, row_names, dev, bar) if row_names else None
    rd, kept, before = bank.dir, [], {}
    df = pd.DataFrame(columns=COLUMNS)
    seconds: dict = {}
    if done:
        est = pd.concat([frame for frame, _ in done], ignore_index=True)
        seconds = {n: {str(seed): t[n] for seed, (_, t) in zip(seeds, done)} for n in names}
        df = measured.merge(est, on=["seed", "candidate", "query", "horizon"], how="inner", validate="1:m")[COLUMNS]
    if rd.attribution.is_file():  # the bank's own estimators beside the new ones, as the bank attributed them
        old = pd.read_parquet(rd.attribution)
        before = json.loads(rd.attribution_json.read_text()) if rd.attribution_json.is_file() else {}
        kept = [n for n in before.get("estimators", list(dict.fromkeys(old.estimator))) if n not in names]
        df = pd.concat([old[old.estimator.isin(kept)][COLUMNS], df], ignore_index=True) if len(df) else \
            old[old.estimator.isin(kept)][COLUMNS].reset_index(drop=True)
        seconds = {n: before.get("seconds", {}).get(n, {}) for n in kept} | seconds
    a = bank.cfg.attribute

    staging = _staging(target, "score")
    try:
        sd = ScoreDir(staging)
        _copy(rd.config, sd.config)
        if rd.integrity.is_file():
            _copy(rd.integrity, sd.integrity)
        for src in rd.tables():  # every other table the report reads (additivity, weighted, loo, groups, ...)
            if src.name != rd.attribution.name:
                _copy(src, sd.root.joinpath(src.relative_to(rd.root)))
        if len(df):
            write_parquet(sd.attribution, df)
            every = kept + names
            write_json(sd.attribution_json, {
                "estimators": every, "labels": {n: before.get("labels", {}).get(n) or get_estimator(n).label
                                                for n in every},
                "seeds": seeds, "seconds": seconds, "device": str(dev), "jobs": 1, "scored": names, "from_bank": kept,
                "source": source, "influence_at": a.influence_at, "damping": a.damping, "modules": a.modules,
                "train_rows": a.train_rows, "fit_rows": a.fit_rows, "tracin_steps": tracin_steps(bank.cfg),
            })
            write_parquet(sd.correlations, analyse(df).correlations)
        tables = _write_rows(bank, sd, scored_rows, seeds, source, str(dev)) if scored_rows is not None else {}
        if report and len(df):
            write_report(staging)
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Scored(target, ScoreDir(target).report, names, kept, len(df), time.perf_counter() - t0, source, row_names,
                  tables)


@dataclass(frozen=True)
class ScoredRows:
    """The row estimators' values on every seed (rowscores.py ``COLUMNS``) and their seconds per seed."""

    names: list[str]
    frame: pd.DataFrame
    seconds: dict[str, dict[str, float]]  # {seed: {estimator: seconds}}, as rowscores.json keeps them
    rows: int
    horizons: list[int]


def score_rows(bank: Bank, seeds: list[int], names: list[str], dev, bar=None) -> ScoredRows:
    """``names`` on every removed row of every seed, through rowscores.py's loop (``seed_rowscores``)."""
    from seedlab.attribution.bank.removals import rows_of
    from seedlab.attribution.estimators.rowscores import COLUMNS, seed_rowscores
    from seedlab.lm.determinism import nondeterminism_is_an_error

    removed, hs = rows_of(bank.cfg), sorted(bank.cfg.horizon_steps())
    frames, seconds = [], {}
    with nondeterminism_is_an_error():
        for seed in seeds:
            f, seconds[str(seed)] = seed_rowscores(bank, seed, names, removed, hs, dev, None, bar)
            frames.append(f)
    return ScoredRows(names, pd.concat(frames, ignore_index=True)[COLUMNS], seconds, len(removed), hs)


def _write_rows(bank: Bank, sd: ScoreDir, r: ScoredRows, seeds: list[int], source: dict, device: str
                ) -> dict[str, pd.DataFrame]:
    """The score folder's row scores — the bank's own (rowscores.parquet, of the estimators not scored again) beside
    the new ones, and rowscores.json — and the tables attribution/analyses/loo.py and lds.py compute from them
    (rowscores.py ``read_scores``, metagrad.parquet's too), as the bank report does, of the estimators scored here:
    loo_by_age, loo_pooled, lds (their resamples depend on the design alone, so each estimator's numbers are those
    of the bank report's tables; the report of the folder computes every estimator's)."""
    from seedlab.attribution.analyses import lds, loo
    from seedlab.attribution.estimators.rowscores import COLUMNS, read_scores

    rd = bank.dir
    frame, seconds, kept = r.frame, {k: dict(v) for k, v in r.seconds.items()}, []
    if rd.rowscores.is_file():
        old = pd.read_parquet(rd.rowscores)
        before = json.loads(rd.rowscores_json.read_text()) if rd.rowscores_json.is_file() else {}
        kept = [n for n in before.get("estimators", list(dict.fromkeys(old.estimator))) if n not in r.names]
        frame = pd.concat([old[old.estimator.isin(kept)][COLUMNS], frame], ignore_index=True)
        for seed, times in before.get("seconds", {}).items():
            seconds[seed] = {n: t for n, t in times.items() if n in kept} | seconds.get(seed, {})
    write_parquet(sd.rowscores, frame)
    write_json(sd.rowscores_json, {"estimators": kept + r.names, "rows": r.rows, "horizons": r.horizons,
                                   "device": device, "seconds": seconds, "scored": r.names, "from_bank": kept,
                                   "source": source})
    scores = read_scores(sd.root)
    scores = scores[scores.seed.isin(seeds) & scores.estimator.isin(r.names)]
    tables: dict[str, pd.DataFrame] = {}
    if rd.loo.is_file():
        tables["loo_by_age"], tables["loo_pooled"] = loo.analyse(pd.read_parquet(rd.loo), scores)
        write_parquet(sd.loo_by_age, tables["loo_by_age"])
        write_parquet(sd.loo_pooled, tables["loo_pooled"])
    if rd.groups.is_file() and rd.group_rows.is_file():
        tables["lds"] = lds.analyse(pd.read_parquet(rd.groups), pd.read_parquet(rd.group_rows), scores)
        write_parquet(sd.lds, tables["lds"])
    return tables

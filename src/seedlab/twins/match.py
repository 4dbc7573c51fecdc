"""Passages matched before training (``seedlab twins match``): of the variants a user writes for each
fluent passage, the fabricated x attested pair whose injections change the update at step s by the
most nearly equal amounts, and how close that is against a stated tolerance (the paper's 0.14%).

Per seed of the design, the shared prefix to the injection step s is trained with the design's own
trainer and batches (forks/prefix.py ``SharedPrefix``: the same :class:`~seedlab.lm.trainer.Trainer`,
seed, steps and settings as ``seedlab twins run``, so bitwise the prefix a one-process run trains) and kept
as ``DIR/seed-<k>/prefix.safetensors``; a later match in the same folder reads it back. At s every
variant is put in row ``injection_row`` of the seed's batch of step s and measured as
``seedlab twins gradmatch`` measures a finished run (twins/gradmatch.py, lm/gradients.py):

- ``rel_norm_diff``: the relative difference of the sizes of the two *full-batch gradient deltas*
  ``Δ = ∇L(batch with the passage) − ∇L(batch)``, raw, before clipping — the quantity the paper
  reports ("their full-batch gradient deltas ... differ by 0.14%");
- ``adam_rel_norm_diff``: the relative difference of the sizes of the two *AdamW update
  differences* ``u(g + Δ) − u(g)``, exact, with the trainer's clipping and the prefix's AdamW moments —
  the update size itself, which is what the paper's matching is for ("so any difference cannot
  come from update size"), and which the gradient deltas' sizes stand in for;
- beside them: ``rel_vec_diff`` and ``cosine`` of the Δs, the passages' own row-gradient norms
  (``row_rel_norm_diff``) and cosine, and the cosine of the update differences.

Each relative difference is ``|a − b| / mean(a, b)`` per seed; a pair's mean row (``seed`` null)
averages them over the seeds. ``by`` chooses what "closest" means: ``update`` (the default: the
AdamW update sizes), ``delta`` (the gradient deltas' sizes, as the paper measured), or ``both``
(the larger of the two seed means: a pair meets the tolerance only if it meets it both ways).

``DIR/match.parquet`` holds every pair, per seed and the mean, with the criterion's value
(``diff``), the ``tolerance`` and whether the pair meets it (``within``). When no pair meets the
tolerance the table is still written into a folder that has none (every ``within`` false), and an
existing one is left as it was: :attr:`Matched.path` says which.

A pair is matched on the seeds it was measured on, and on no others: each seed has its own batch
and prefix at s, and the numbers differ by seed as much as between pairs (the mini pair, matched to
0.06% on the preset's 4 seeds, differs by 2% over mini-long's 8, up to 6.5% on seeds 6 and 7).

The folder (:class:`MatchDir`) holds what the prefixes depend on: ``config.json`` (the fork design's
fields that shape steps 0 .. s-1: :func:`prefix_record`), ``inputs.json`` (the corpus's hashes) and
``environment.json``; another design, another corpus or another environment is refused in one
line (``--force`` starts over, ``--allow-env-change`` goes on), and a folder another match is using
is refused too: the start of every fork command (forks/start.py ``begin``). It is not a run folder:
``seedlab twins run`` trains its own prefixes (the same bits, from the same design).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.errors import SeedlabError
from seedlab.forks.folders import corpus_record
from seedlab.forks.prefix import SharedPrefix
from seedlab.forks.start import begin
from seedlab.lm.determinism import nondeterminism_is_an_error
from seedlab.lm.distributed import World
from seedlab.lm.gradients import AdamStep
from seedlab.lm.trainer import Trainer
from seedlab.progress import Bar
from seedlab.store import write_parquet
from seedlab.twins.config import TwinsConfig
from seedlab.twins.gradmatch import SIDES, Candidates, model_at, pairs_table, seed_rows
from seedlab.twins.rundir import MatchDir, prefix_record

#: the paper's tolerance: its two fluent passages' gradient deltas "differ by 0.14%"
TOLERANCE = 0.0014
#: what "closest" can mean: the pairs table's columns whose seed means are compared (the larger of them)
MEASURES: dict[str, tuple[str, ...]] = {
    "update": ("adam_rel_norm_diff",),  # the AdamW update differences' sizes
    "delta": ("rel_norm_diff",),  # the full-batch gradient deltas' sizes (the paper's measurement)
    "both": ("rel_norm_diff", "adam_rel_norm_diff"),
}
#: in words, for messages
MEASURE_WORDS = {"update": "AdamW update sizes", "delta": "gradient-delta sizes", "both": "gradient-delta and AdamW update sizes"}
@dataclass
class Matched:
    """What :func:`match_passages` found."""

    norms: pd.DataFrame  # seed, condition, passage, tokens, norm, row_norm, adam_norm, grad_norm, base_grad_norm, base_loss
    pairs: pd.DataFrame  # seed (null: the mean), fabricated, attested, norms, gradmatch's PAIR_COLUMNS, diff, tolerance, within
    best: pd.Series  # the mean row with the smallest diff
    by: str  # a key of MEASURES
    tolerance: float
    defaults: dict[str, str]  # side -> the config's passage, for a side given no variants
    path: Path | None  # match.parquet, or None: not written (no pair met the tolerance and a table was there)
    table: Path  # where match.parquet is

    @property
    def met(self) -> bool:
        """The best pair is within the tolerance."""
        return bool(self.best["within"])

    @property
    def mean(self) -> pd.DataFrame:
        """The seed-mean pairs, closest first."""
        return self.pairs[self.pairs["seed"].isna()].sort_values("diff", kind="stable").reset_index(drop=True)

    def per_seed(self, fabricated: str, attested: str) -> pd.DataFrame:
        """One pair's rows, seed by seed."""
        p = self.pairs
        return p[p["seed"].notna() & (p["fabricated"] == fabricated) & (p["attested"] == attested)]

    def variant_means(self) -> pd.DataFrame:
        """Per side and variant (in the order measured), the mean over seeds of its tokens, ``norm`` (|Δ|, the
        gradient delta), ``adam_norm`` (|u|, the AdamW update difference) and ``row_norm`` (|G|/N)."""
        cols = ["tokens", "norm", "adam_norm", "row_norm"]
        return self.norms.groupby(["condition", "passage"], sort=False)[cols].mean()

    def closest(self, k: int = 10) -> pd.DataFrame:
        """The ``k`` seed-mean pairs closest in the criterion (``diff``), closest first."""
        return self.mean.head(k)

    def best_range(self) -> tuple[float, float]:
        """The best pair's smallest and largest ``diff`` over the seeds."""
        seeds = self.per_seed(self.best.fabricated, self.best.attested)["diff"]
        return seeds.min(), seeds.max()


def match_passages(cfg: TwinsConfig, out: str | Path, variants: Mapping[str, Sequence[str | Path]] | None = None, *,
                   base: Path = Path("."), tolerance: float = TOLERANCE, by: str = "update", force: bool = False,
                   allow_env_change: bool = False, progress: bool = True) -> Matched:
    """Match the fluent passages of the twins design ``cfg`` (``base``: its file's folder) in the folder ``out``.

    ``variants``: ``{"fluent-fabricated": [files], "fluent-attested": [files]}`` (paths relative to
    the current folder); a side given none is the config's passage (:attr:`Matched.defaults`).
    Every input is checked before anything is written (one-line :class:`SeedlabError`): the
    tolerance (0 < tolerance < 1), ``by``, the config's corpus and passages (as ``twins run``
    checks them), each variant's file, subject (``subjects``: a whole word) and length (a row), and
    the folder (another design, corpus or environment). Then each seed's prefix is trained or read
    back, every variant measured at s, and the table written (see the module docstring)."""
    from seedlab.twins.train import load_inputs

    if not (isinstance(tolerance, int | float) and 0 < tolerance < 1):
        raise SeedlabError(f"--tolerance: must be a fraction between 0 and 1 (0.0014 = 0.14%), got {tolerance!r}")
    if by not in MEASURES:
        raise SeedlabError(f"--by: must be one of {', '.join(MEASURES)}, got {by!r}")
    world = World()
    corpus, gcfg, passages, _ = load_inputs(cfg, base, world)
    own = {c: (f"config:{cfg.passages[c]}", passages[c]) for c in SIDES if c in passages}
    cands = Candidates.build(variants, own, corpus, gcfg.block_size, cfg.subjects,
                             missing="the config has no passage for it; give variants")
    defaults = {c: cands.labels[c][0] for c in SIDES if c not in (variants or {})}
    folder, device = MatchDir(Path(out)), world.device(cfg.device)
    inputs = corpus_record(corpus)
    s, norm_rows, pair_rows = cfg.injection_step, [], []
    # another design refused (or, --force, removed), the corpus the kept prefixes were trained on, the environment
    with begin(folder, prefix_record(cfg), inputs, device=device, precision=cfg.precision, threads=cfg.threads,
               force=force, allow_env_change=allow_env_change, world=world) as started:
        started.first_files()
        todo = sum(s for k in cfg.seeds if not folder.prefix(k).is_file())
        with Bar("match", todo, "prefix steps", enabled=progress and todo > 0) as bar, nondeterminism_is_an_error():
            for k in cfg.seeds:
                prefix = SharedPrefix(folder.prefix(k), lambda k=k: Trainer(cfg, gcfg, k, corpus.train, world), s,
                                      on_step=lambda k=k: bar.step(f"seed {k}"), world=world)
                trainer, _ = prefix.kept()  # trained as `twins run` trains it, or read back (its hashes checked)
                model = model_at(gcfg, trainer.weights(), device, f"seed {k} prefix")
                adam = AdamStep(trainer.opt, trainer.params, lr=trainer.lr, grad_clip=cfg.grad_clip)
                del trainer, prefix
                norms, pairs = seed_rows(cfg, gcfg, corpus, k, model, adam, cands)
                norm_rows += norms
                pair_rows += pairs
        table, _ = pairs_table(pd.DataFrame(pair_rows))
        cols = list(MEASURES[by])
        table["diff"] = table[cols].max(axis=1, skipna=False)
        table["tolerance"] = tolerance
        table["within"] = (table["diff"] <= tolerance).fillna(False).astype(bool)
        mean = table[table["seed"].isna()]
        best = mean.loc[mean.index[int(np.argmin(mean["diff"].fillna(np.inf).to_numpy()))]]
        written = write_parquet(folder.table, table) if bool(best["within"]) or not folder.table.exists() else None
    return Matched(pd.DataFrame(norm_rows), table, best, by, tolerance, defaults, written, folder.table)


def percent(x: float) -> str:
    """A relative difference in percent, with the digits a 0.14% tolerance needs."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:.3f}%" if x < 0.1 else f"{100 * x:.1f}%"

"""Gradient matching: how much one injected passage changes the full-batch gradient.

At the injection step ``s`` of seed ``k`` every condition holds the same weights (the twin's
``step-<s>.safetensors``) and sees the same batch ``get_batch(train, k, s)``; an injected
condition differs only in row ``injection_row``. ``Δ_p``, the change in the full-batch gradient
when passage p replaces that row, is computed as lm/gradients.py explains.

The paper wrote its two fluent passages so that their "full-batch gradient deltas" were nearly
equal (they "differed by 0.14%"), "so any difference cannot come from update size". ``match``
computes, for every fabricated x attested candidate pair and seed:

- ``rel_norm_diff = |‖Δa‖ - ‖Δb‖| / mean(‖Δa‖, ‖Δb‖)``: the sizes of the two changes to the batch
  gradient. This is what the paper's 0.14% most plausibly is: a difference of *sizes* ("update
  size"), and the one quantity that can be made that small by editing prose (the directions
  of two different texts' gradients are far apart: see ``cosine``);
- ``rel_vec_diff = ‖Δa - Δb‖ / mean`` and ``cosine(Δa, Δb)``: how different the changes are as vectors;
- ``row_rel_norm_diff`` and ``row_cosine``: the passages' own row gradients G_a, G_b (each the
  gradient of its CE sum / N), compared the same way;
- ``adam_rel_norm_diff`` and ``adam_cosine``: the same for the *update* differences at the
  injection step, ``u(g_base + Δ) − u(g_base)`` with the trainer's clipping and AdamW state
  (lm/gradients.py ``AdamStep``), read from the seed's shared prefix (``prefix.safetensors``,
  its weights checked against the twin's step-s hashes). A run trained ``--independent`` keeps no
  prefix: these columns are then empty.

It averages over seeds and picks the pair with the smallest mean ``rel_norm_diff``;
``DIR/gradmatch.parquet`` holds the pairs (one row per seed and pair, plus the seed mean with
``seed`` null). The per-passage norms (``‖Δ‖``, ``‖G_p‖/N``, ``‖u delta‖``) are in ``GradMatch.norms``.
A candidate file must mention its condition's subject (the run's ``subjects``, a whole word) and fit a row.

Before training, ``seedlab twins match`` (twins/match.py) computes the same numbers with the same
functions (:class:`Candidates`, :func:`seed_rows`, :func:`pairs_table`) from each seed's shared
prefix, trained for it as ``twins run`` trains it, instead of a finished run's checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from seedlab.corpus import Corpus, whole_word
from seedlab.errors import SeedlabError
from seedlab.forks.design import ForkDesign
from seedlab.forks.prefix import read_prefix
from seedlab.lm.batches import check_passage, get_batch
from seedlab.lm.determinism import settle
from seedlab.lm.distributed import World
from seedlab.lm.gradients import AdamStep, BatchGradients, pair_stats
from seedlab.lm.model import GPT, GPTConfig
from seedlab.lm.trainer import Trainer
from seedlab.store import write_parquet
from seedlab.twins.config import TwinsConfig
from seedlab.twins.rundir import Run, open_run

#: candidate conditions, in the order pairs are formed (fabricated x attested)
SIDES = ("fluent-fabricated", "fluent-attested")
#: what gradmatch.parquet compares for each pair (the module docstring says what each is)
PAIR_COLUMNS = ("rel_norm_diff", "rel_vec_diff", "cosine", "row_rel_norm_diff", "row_cosine", "adam_rel_norm_diff", "adam_cosine")


@dataclass
class GradMatch:
    """What :func:`match` computed: per-candidate norms, per-pair statistics, the best pair."""

    norms: pd.DataFrame  # seed, condition, passage, tokens, norm, row_norm, adam_norm, grad_norm, base_grad_norm, base_loss
    pairs: pd.DataFrame  # seed (null: mean over seeds), fabricated, attested, norm_*, adam_norm_*, and the PAIR_COLUMNS
    best: pd.Series  # the mean row with the smallest rel_norm_diff
    path: Path  # where the pairs table was written (DIR/gradmatch.parquet)

    @property
    def mean(self) -> pd.DataFrame:
        """The seed-mean pairs, best first."""
        return self.pairs[self.pairs["seed"].isna()].sort_values("rel_norm_diff", kind="stable").reset_index(drop=True)


def match(
    run_dir: str | Path,
    candidates: Mapping[str, Sequence[str | Path]] | None = None,
    *,
    seed: int | None = None,
    corpus: str | Path | None = None,
    device: str | None = None,
    loss_check: bool = True,
) -> GradMatch:
    """Gradient-delta matching of fabricated x attested candidate passages on a twins run.

    ``candidates``: ``{"fluent-fabricated": [files], "fluent-attested": [files]}`` (paths as
    given, relative to the cwd); a side left out (or ``None``: both) is the run's own passage,
    as it was trained (its token ids in ``DIR/inputs.json``, labelled ``inputs.json:<condition>``).
    ``seed``: one of the run's seeds (default: all of them; the mean is over the seeds used).
    ``corpus``: where the run's corpus is now, if it moved. ``device``: default the config's.
    ``loss_check``: compare the ordinary batch's loss with the twin's recorded loss at the
    injection step (a batch that is not the run's).

    Everything is checked (files, passage lengths, seeds, checkpoints) before any gradient is
    computed. Writes ``DIR/gradmatch.parquet`` (the pairs table) atomically."""
    run = open_run(run_dir, corpus)
    cands = Candidates.of(run, candidates)
    seeds = _seeds(run.cfg, seed)
    # every seed's twin at the injection step, verified against its manifest before any gradient
    states = {k: run.weights(k, "twin", run.cfg.injection_step) for k in seeds}
    dev = World().device(device or run.cfg.device)
    settle(dev, run.cfg.threads)  # before the first matrix multiply
    norm_rows, pair_rows = [], []
    for k in seeds:
        seed_norms, seed_pairs = _seed_rows(run, k, states.pop(k), cands, dev, loss_check)
        norm_rows += seed_norms
        pair_rows += seed_pairs
    pairs, best = pairs_table(pd.DataFrame(pair_rows))
    out = write_parquet(run.dir.gradmatch, pairs)
    return GradMatch(norms=pd.DataFrame(norm_rows), pairs=pairs, best=best, path=out)


# --------------------------------------------------------------------------- the inputs, checked


@dataclass
class Candidates:
    """The passages to compare: each side's labels in input order, and every label's token ids."""

    labels: dict[str, list[str]]  # condition -> labels (file paths as given, or inputs.json:<condition>)
    tokens: dict[str, list[int]]  # label -> token ids

    @classmethod
    def of(cls, run: Run, candidates: Mapping[str, Sequence[str | Path]] | None) -> Candidates:
        """Candidate files for a side, or the run's own passage; every one checked to fit a row."""
        own = {c: (f"inputs.json:{c}", [int(i) for i in run.passages[c]]) for c in SIDES if c in run.passages}
        return cls.build(candidates, own, run.corpus, run.gcfg.block_size, run.cfg.subjects,
                         missing="the run has no passage for it; give candidates")

    @classmethod
    def build(cls, candidates: Mapping[str, Sequence[str | Path]] | None, own: Mapping[str, tuple[str, list[int]]],
              corp: Corpus, block_size: int, subjects: Mapping[str, str] | None = None, *,
              missing: str = "no passage for it; give candidates") -> Candidates:
        """Each side's candidate files (``candidates[side]``), else its own passage ``own[side]``
        (label, token ids); every file read and encoded once, every candidate checked to mention
        its subject (``subjects[side]``, a whole word: candidate files only) and to fit a row of
        ``block_size + 1`` tokens. A one-line :class:`SeedlabError` names the first bad one."""
        given = dict(candidates or {})
        unknown = [c for c in given if c not in SIDES]
        if unknown:
            raise SeedlabError(f"candidates: conditions are {', '.join(SIDES)}, got {unknown[0]!r}")
        cands = cls({}, {})
        for c in SIDES:
            if c in given:
                cands._add_files(c, given[c], corp, (subjects or {}).get(c))
            elif c in own:
                label, ids = own[c]
                cands.labels[c] = [label]
                cands.tokens[label] = list(ids)
            else:
                raise SeedlabError(f"passages.{c}: {missing}")
            for label in cands.labels[c]:
                check_passage(len(cands.tokens[label]), block_size, f"passages.{c} {label}")
        return cands

    def _add_files(self, c: str, files: Sequence[str | Path], corp: Corpus, subject: str | None) -> None:
        """Side ``c``'s candidate files: at least one, none twice, each there and mentioning
        ``subject`` (when given); read and encoded once."""
        if not files:
            raise SeedlabError(f"passages.{c}: give at least one candidate passage file")
        self.labels[c] = [str(p) for p in files]
        twice = [lab for i, lab in enumerate(self.labels[c]) if lab in self.labels[c][:i]]
        if twice:
            raise SeedlabError(f"passages.{c}: {twice[0]!r} is given twice")
        for p in files:
            if not Path(p).is_file():
                raise SeedlabError(f"passages.{c}: no such file {str(p)!r}")
            text = Path(p).read_text().strip()
            if subject and not whole_word(subject).search(text):
                raise SeedlabError(f"passages.{c}: {str(p)!r} does not mention its subject {subject!r} (subjects.{c})")
            self.tokens.setdefault(str(p), corp.encode(text))

    def rows(self) -> list[tuple[str, str]]:
        """(condition, label) of every candidate, fabricated first."""
        return [(c, lab) for c in SIDES for lab in self.labels[c]]

    def pairs(self) -> list[tuple[str, str]]:
        """(fabricated, attested) labels of every pair, in input order."""
        return [(fa, at) for fa in self.labels[SIDES[0]] for at in self.labels[SIDES[1]]]


def _seeds(cfg: TwinsConfig, seed: int | None) -> list[int]:
    """The seeds to compute: ``seed`` when given (one of the run's), else all of them."""
    if seed is not None and seed not in cfg.seeds:
        raise SeedlabError(f"seed: the run's seeds are {cfg.seeds}, got {seed!r}")
    return list(cfg.seeds) if seed is None else [seed]


# --------------------------------------------------------------------------- the gradients


def _seed_rows(run: Run, seed: int, twin_state: dict, cands: Candidates, dev: torch.device,
               loss_check: bool) -> tuple[list[dict], list[dict]]:
    """One seed's rows of a run: the twin's weights at s and the kept prefix's AdamW step (:func:`seed_rows`)."""
    model, adam = _model_at_injection(run, seed, twin_state, dev)
    check = (lambda loss: _check_loss(run.dir.condition(seed, "twin").losses, run.cfg, seed, loss)) if loss_check else None
    return seed_rows(run.cfg, run.gcfg, run.corpus, seed, model, adam, cands, check)


def seed_rows(cfg: ForkDesign, gcfg: GPTConfig, corp: Corpus, seed: int, model: GPT, adam: AdamStep | None,
              cands: Candidates, check_loss: Callable[[float], None] | None = None) -> tuple[list[dict], list[dict]]:
    """One seed's rows: each candidate's norms, and each fabricated x attested pair's statistics.

    ``model``: the GPT at the injection step (float32, eval: :func:`model_at`); ``adam``: the AdamW
    step the trainer takes there (None: the update columns are nan); the batch is the seed's batch
    of step s, the candidate in row ``injection_row``. ``check_loss(loss)``: given the ordinary
    batch's loss, raises when it is not what the run recorded."""
    x, y = get_batch(corp.train, seed, cfg.injection_step, cfg.batch_size, gcfg.block_size)
    bg = BatchGradients(model, x, y, cfg.injection_row, micro_batch=cfg.micro_batch)
    if check_loss is not None:
        check_loss(bg.loss)
    deltas = {key: bg.delta(ids, corp.eot_id) for key, ids in cands.tokens.items()}
    updates = {key: adam.delta(bg.grad + d.vec, bg.grad) for key, d in deltas.items()} if adam else {}
    norms, pairs = [], []
    for c, key in cands.rows():
        d = deltas[key]
        norms.append({"seed": seed, "condition": c, "passage": key, "tokens": len(cands.tokens[key]), "norm": d.norm,
                      "row_norm": d.row_norm, "adam_norm": _norm(updates.get(key)), "grad_norm": d.grad_norm,
                      "base_grad_norm": d.base_grad_norm, "base_loss": bg.loss})
    for fa, at in cands.pairs():
        a, b = deltas[fa], deltas[at]
        pairs.append({"seed": seed, "fabricated": fa, "attested": at, "norm_fabricated": a.norm, "norm_attested": b.norm,
                      "adam_norm_fabricated": _norm(updates.get(fa)), "adam_norm_attested": _norm(updates.get(at)),
                      **pair_stats(a, b), **_update_stats(updates.get(fa), updates.get(at))})
    return norms, pairs


def pairs_table(per_seed: pd.DataFrame, by: str = "rel_norm_diff") -> tuple[pd.DataFrame, pd.Series]:
    """The per-seed pairs and their seed means (``seed`` null) in one table, and the mean row with the
    smallest ``by`` (a column of the table; the first of ties, in input order)."""
    cols = ["norm_fabricated", "norm_attested", "adam_norm_fabricated", "adam_norm_attested", *PAIR_COLUMNS]
    mean = per_seed.groupby(["fabricated", "attested"], sort=False, as_index=False)[cols].mean()
    pairs = pd.concat([per_seed, mean.assign(seed=None)], ignore_index=True)[["seed", "fabricated", "attested", *cols]]
    pairs["seed"] = pairs["seed"].astype("Int64")
    best = mean.loc[int(np.argmin(mean[by].fillna(np.inf).to_numpy()))]
    return pairs, best


def model_at(gcfg: GPTConfig, state: Mapping[str, torch.Tensor], dev: torch.device, what: str) -> GPT:
    """A GPT holding ``state`` (weights), in float32 and eval mode on ``dev``, as gradients are
    compared; ``what`` names the weights in the error when they do not fit the model."""
    model = GPT(gcfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise SeedlabError(f"{what}: does not fit the model ({str(err).splitlines()[0]})") from None
    return model.float().to(dev).eval()


def _model_at_injection(run: Run, seed: int, twin_state: dict, dev: torch.device) -> tuple[GPT, AdamStep | None]:
    """The GPT at the injection step (the twin's verified checkpoint) and, when the seed's shared
    prefix was kept, the AdamW step the trainer took there (its weights checked against the same hashes)."""
    cfg, s = run.cfg, run.cfg.injection_step
    model = model_at(run.gcfg, twin_state, dev, f"seed {seed} twin step {s}")
    prefix = run.dir.prefix(seed)
    if not prefix.is_file():
        return model, None
    trainer = Trainer(cfg.model_copy(update={"device": str(dev)}), run.gcfg, seed, run.corpus.train)
    read_prefix(trainer, prefix, s, {str(s): run.dir.condition(seed, "twin").read_manifest()[str(s)]})
    return model, AdamStep(trainer.opt, trainer.params, lr=trainer.lr, grad_clip=cfg.grad_clip)


def _norm(v) -> float:
    return float(torch.linalg.vector_norm(v)) if v is not None else float("nan")


def _update_stats(a, b) -> dict[str, float]:
    """The relative size difference and cosine of two passages' update differences (nan without them)."""
    if a is None or b is None:
        return {"adam_rel_norm_diff": float("nan"), "adam_cosine": float("nan")}
    na, nb = _norm(a), _norm(b)
    mean = (na + nb) / 2
    return {"adam_rel_norm_diff": abs(na - nb) / mean if mean > 0 else float("nan"),
            "adam_cosine": float(torch.dot(a, b)) / (na * nb) if na > 0 and nb > 0 else float("nan")}


def _check_loss(path: Path, cfg: TwinsConfig, seed: int, loss: float) -> None:
    """The ordinary batch's loss must be the twin's recorded loss (``path``: its losses.parquet) at the injection step."""
    if not path.is_file():  # the twin has not finished: nothing recorded to compare with
        return
    recorded = pd.read_parquet(path).set_index("step")["loss"]
    if cfg.injection_step not in recorded.index:
        return
    want = float(recorded.loc[cfg.injection_step])
    tol = 5e-2 if cfg.precision == "bf16" else 1e-4
    if not abs(loss - want) <= tol * max(1.0, abs(want)):
        raise SeedlabError(
            f"corpus: seed {seed}'s batch at step {cfg.injection_step} gives loss {loss:.6f}, the run recorded"
            f" {want:.6f} (not the corpus this run trained on?)"
        )

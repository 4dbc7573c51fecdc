"""Estimators of a *training row's* effect: what removing row (t, i) of the twin's own run does to L_q(θ_h), for the
rows the bank's removal arms touch (attribution/bank/removals.py ``rows_of``: the leave-one-out rows, and with groups every
row of the steps s .. end − 1) — the predictions the leave-one-out (attribution/analyses/loo.py) and the LDS (attribution/analyses/lds.py)
are scored on. ``seedlab attribution rowscores BANK`` writes them to rowscores.parquet (:data:`COLUMNS`).

**Which estimators can score an arbitrary training row at an arbitrary step.** Most of the bank's estimators
(attribution/estimators/builtin.py) are functions of one swap at s: the row's gradient difference δ_c at θ_s and AdamW's state
before step s (sgd, adam, adam-linear, tracin's one term, cosine, adam-cosine, the baselines), and unroll carries the
change of *that* step forward. A row of another step t is another case (its θ_t, its AdamW state, the moments carried
to h): they do not apply as they are. What does:

===========  ==========================================================================================  ==========
name         value: the predicted Δ L_q(θ_h) of removing row (t, i) (positive: the query's loss rises)      unit
===========  ==========================================================================================  ==========
metagrad     −∂L_q(θ_h)/∂w_{t,i} at w = 1 (attribution/estimators/metagrad.py; a removal is Δw = −1): the exact first  nats/token
             order through the twin's replayed run; read from metagrad.parquet, not computed here
tracin       TracIn's one term for the row's one visit (Pruthi et al. 2020, §3): +lr_t·⟨∇L_q(θ_t),          nats/token
             ∇ℓ_i(θ_t)⟩ / N at the weights the row was trained at (the twin replayed and hash-checked);
             no clip, no Adam, no propagation: the same number at every horizon after t
grad-dot     ⟨∇L_q(θ_h), ∇ℓ_i(θ_h)⟩ / N at the twin's weights of the horizon (one model, no projection, no  score
             kernel: TRAK-like without its (ΦᵀΦ)⁻¹, the field's "gradient dot product")
grad-cosine  cos(∇L_q(θ_h), ∇ℓ_i(θ_h)) (the field's gradient-cosine baseline)                            cosine
ekfac        +⟨∇L_q, (F + λ)⁻¹ ∇ℓ_i⟩ / D at the twin's weights at the end (kronfluence's pairwise scores,   nats/token
             F fitted on attribute.fit_rows rows of steps 0 .. end as attribute's ekfac is; D = B, or
             attribute.train_rows): the influence function of removing the row, as the field computes it
             for groups by summing per-row scores; the end horizon only (its cost: one score per row)
trak         +τ(q, z) = φ(q)ᵀ (ΦᵀΦ)⁻¹ φ(z) · Q_z (TRAK, Park et al. 2023, one model, through traker exactly  score
             as influence.py's ``trak``: margin gradients, a seeded Gaussian projection, traker's scale)
             at the twin's weights at the end; Φ's training set is the rows themselves, as the field
             fits it for groups: the attribute.fit_rows rows ekfac fits F on, then every row scored (a
             scored row drawn among the fit rows is in Φ twice, as ``trak``'s replaced row is). τ > 0
             says training on z lowers q's loss, so removing it raises it: +τ (``trak``'s swap is
             −(τ(q, c) − τ(q, r)): the candidate added, the row removed); the end horizon only
===========  ==========================================================================================  ==========

ℓ_i is row i's CE sum over its T targets and N = B·T (the trainer's loss, lm/trainer.py); ∇L_q the query's mean CE
gradient, all in eval mode, float64 (attribution/estimators/builtin.py's ``Gradients``; trak: traker's float32, on the CPU,
whatever ``device`` says). A group's prediction is the sum of its rows' values (lds.py): the additive model every
group attribution assumes (TRAK's LDS sums τ so). ``grad-dot`` is TRAK's one-model, unprojected, kernel-free core.

Cost per seed (R rows, Q queries, H horizons, B rows a batch): tracin replays the twin from step 0 (rows before s)
or from the prefix, and takes Q + B one-row gradients at each row step; grad-dot and grad-cosine take Q + R gradients
per horizon (one pass gives both); ekfac fits the curvature once and scores R rows; trak featurizes M + R rows (M
the fit rows) and the Q queries once, on the CPU (the p × k projection held: 4·p·k bytes, k = (M + R) // 2 ≤ 2048).

``--add`` (``add=True``) keeps the estimators of a rowscores.parquet already there that were not asked for and
replaces those that were (rowscores.json's estimators and seconds merged likewise).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from seedlab.attribution.bank import removals
from seedlab.attribution.bank.rundir import Bank, open_bank
from seedlab.errors import SeedlabError
from seedlab.store import write_json, write_parquet

if TYPE_CHECKING:  # torch is imported where the gradients are taken: the report reads row scores without it
    import torch

COLUMNS = ["seed", "estimator", "query", "horizon", "step", "row", "value", "unit"]
#: the estimators computed here (metagrad's values come from metagrad.parquet: :func:`metagrad_scores`)
ESTIMATORS = ("tracin", "grad-dot", "grad-cosine", "ekfac", "trak")
UNITS = {"metagrad": "nats/token", "tracin": "nats/token", "grad-dot": "score", "grad-cosine": "cosine",
         "ekfac": "nats/token", "trak": "score"}
#: the optional library an estimator needs: its import name (the key of registry.py's install hints)
LIBRARIES = {"ekfac": "kronfluence", "trak": "trak"}


def choose(names: Sequence[str] | None) -> list[str]:
    """The estimators asked for (None: every one whose library is installed); an unknown name is a one-line error."""
    if names:
        bad = [n for n in names if n not in ESTIMATORS]
        if bad:
            more = " (metagrad's rows come from `seedlab attribution metagrad`)" if "metagrad" in bad else ""
            raise SeedlabError(f"--estimator: must be among {', '.join(ESTIMATORS)}, got {bad[0]!r}{more}")
        for name in names:
            _library(name)
        return list(dict.fromkeys(names))
    out = []
    for name in ESTIMATORS:
        try:
            _library(name)
        except SeedlabError:
            continue
        out.append(name)
    return out


def _library(name: str) -> None:
    """A one-line error when ``name`` needs a library (:data:`LIBRARIES`) that is not installed."""
    import importlib

    lib = LIBRARIES.get(name)
    if lib is None:
        return
    try:
        importlib.import_module(lib)
    except ImportError:
        from seedlab.attribution.estimators.registry import HINTS

        package = "traker" if lib == "trak" else lib
        raise SeedlabError(f"rowscores: {name} needs {package}, which is not installed: {HINTS[lib]}") from None


def bank_rowscores(root: str | Path, *, estimators: Sequence[str] | None = None, device: str = "auto",
                   progress: bool = True, add: bool = False) -> pd.DataFrame:
    """``seedlab attribution rowscores BANK``: every removal row's value (module doc) for every estimator, query
    and horizon after the row's step, every seed whose twin finished; written to rowscores.parquet and
    rowscores.json (the seconds per seed and estimator). Every input is checked before any work: a bank without
    ``loo`` or ``groups``, an unknown estimator, no finished twin — one line, nothing written. ``add``: keep the
    other estimators' rows of a rowscores.parquet already there (these estimators' rows are replaced), e.g.
    ``--estimator trak --add`` on a bank scored before; the frame returned is then the merged one."""
    from seedlab.lm.determinism import nondeterminism_is_an_error, settle
    from seedlab.lm.distributed import World
    from seedlab.progress import Bar

    bank = open_bank(root)
    cfg = bank.cfg
    if cfg.loo is None and cfg.groups is None and cfg.trak is None:
        raise SeedlabError(f"{bank.root}: the bank removes no rows (no loo, groups or trak section): nothing to score")
    names = choose(estimators)
    seeds = [seed for seed in cfg.seeds if bank.dir.twin(seed).finished]
    if not seeds:
        raise SeedlabError(f"{bank.root}: no seed's twin has finished (run `seedlab attribution bank` first)")
    rows = removals.rows_of(cfg)
    hs = sorted(cfg.horizon_steps())
    from seedlab.attribution.estimators.metagrad import replay_check

    checks = {seed: replay_check(bank, seed, hs) for seed in seeds}
    dev = World().device(device)
    settle(dev, cfg.threads)
    frames, seconds = [], {}
    with Bar("rowscores", len(seeds) * len(names), "scores", enabled=progress) as bar, nondeterminism_is_an_error():
        for seed in seeds:
            seconds[str(seed)] = {}
            for name in names:
                bar.update(note=f"seed {seed} {name}")
                t0 = time.perf_counter()
                if name == "tracin":
                    f = tracin_scores(bank, seed, rows, hs, dev, checks[seed])
                elif name == "ekfac":
                    f = ekfac_scores(bank, seed, rows, dev)
                elif name == "trak":
                    f = trak_scores(bank, seed, rows)
                else:
                    f = None
                    if name == "grad-dot" or "grad-dot" not in names:  # one pass gives both
                        f = gradient_scores(bank, seed, rows, hs, dev)
                        f = f[f.estimator.isin(names)]
                if f is not None:
                    frames.append(f)
                seconds[str(seed)][name] = time.perf_counter() - t0
                bar.advance()
    df = pd.concat(frames, ignore_index=True)[COLUMNS]
    if add and bank.dir.rowscores.is_file() and bank.dir.rowscores_json.is_file():
        df, names, seconds = _merged(bank, df, names, seconds)
    write_parquet(bank.dir.rowscores, df)
    write_json(bank.dir.rowscores_json, {"estimators": names, "rows": len(rows), "horizons": hs,
                                                         "device": str(dev), "seconds": seconds})
    return df


def _merged(bank: Bank, df: pd.DataFrame, names: list[str], seconds: dict[str, dict[str, float]]
            ) -> tuple[pd.DataFrame, list[str], dict[str, dict[str, float]]]:
    """``add``: the estimators already in rowscores.parquet that were not asked for kept (their rows and seconds as
    they are), those asked for replaced."""
    import json

    old, before = pd.read_parquet(bank.dir.rowscores), json.loads(bank.dir.rowscores_json.read_text())
    kept = [n for n in before["estimators"] if n not in names]
    df = pd.concat([old[old.estimator.isin(kept)][COLUMNS], df], ignore_index=True)
    merged = {seed: {n: t for n, t in times.items() if n in kept} for seed, times in before["seconds"].items()}
    for seed, times in seconds.items():
        merged[seed] = merged.get(seed, {}) | times
    return df, kept + names, merged


# --------------------------------------------------------------------------- gradients


def _queries(bank: Bank) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.tokens) for n, t in bank.inputs.queries.items()}


def _query_grads(model, queries: dict[str, tuple[int, ...]], micro_batch: int | None) -> torch.Tensor:
    """[Q, P] float64: ∇L_q (mean CE) of every query at ``model``'s weights (estimators.py ``Gradients.query``)."""
    import torch

    from seedlab.attribution.estimators.builtin import Gradients

    g = Gradients(model, SimpleNamespace(queries=queries), micro_batch=micro_batch)
    return torch.stack([g.query(q) for q in queries])


def _row_grads(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[n, P] float64: ∇ℓ_i, each row's CE sum over its targets, one row at a time (eval mode)."""
    import torch

    from seedlab.attribution.estimators.builtin import _eval
    from seedlab.lm.determinism import deterministic
    from seedlab.lm.gradients import ce_sum_grad

    device = next(model.parameters()).device
    out = []
    with _eval(model), deterministic(device):
        for i in range(x.shape[0]):
            g, _ = ce_sum_grad(model, x[i:i + 1], y[i:i + 1], torch.ones(1, x.shape[1], dtype=torch.bool), 1)
            out.append(g)
    return torch.stack(out)


def _batch(bank: Bank, seed: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    from seedlab.lm.batches import get_batch

    return get_batch(bank.inputs.corpus.train, seed, t, bank.cfg.batch_size, bank.inputs.gcfg.block_size)


def _row_tensors(bank: Bank, seed: int, rows: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) [len(rows), T] of the training rows (t, i), in order; each step's batch drawn once."""
    import torch

    batches = {t: _batch(bank, seed, t) for t in dict.fromkeys(t for t, _ in rows)}
    return (torch.stack([batches[t][0][i] for t, i in rows]), torch.stack([batches[t][1][i] for t, i in rows]))


def _long(seed: int, estimator: str, queries: list[str], h: int, rows: list[tuple[int, int]], values: np.ndarray
          ) -> pd.DataFrame:
    """values [rows, queries] as rowscores.parquet's long frame."""
    R, Q = values.shape
    return pd.DataFrame({"seed": seed, "estimator": estimator, "query": np.tile(np.asarray(queries, dtype=object), R),
                         "horizon": h, "step": np.repeat([t for t, _ in rows], Q), "row": np.repeat([i for _, i in rows], Q),
                         "value": values.reshape(-1), "unit": UNITS[estimator]})


def tracin_scores(bank: Bank, seed: int, rows: list[tuple[int, int]], horizons: list[int], device, check
                  ) -> pd.DataFrame:
    """``tracin`` (module doc): the twin replayed (from step 0 when a row is older than s, else from the kept
    prefix; ``check(t, trainer)`` at every step: metagrad.py ``replay_check``), and at every row step t the value
    +lr_t·⟨∇L_q(θ_t), ∇ℓ_i(θ_t)⟩ / N, repeated at every horizon after t."""
    from seedlab.forks.prefix import advance_to, read_prefix
    from seedlab.lm.trainer import Trainer

    cfg, s, queries = bank.cfg, bank.cfg.injection_step, _queries(bank)
    by_step: dict[int, list[int]] = {}
    for t, i in rows:
        by_step.setdefault(t, []).append(i)
    tr = Trainer(cfg.model_copy(update={"device": str(device)}), bank.inputs.gcfg, seed, bank.inputs.corpus.train)
    if min(by_step) >= s:
        read_prefix(tr, bank.dir.prefix(seed), s)
    N = cfg.batch_size * bank.inputs.gcfg.block_size
    frames = []

    def visit(trainer) -> None:
        t = trainer.step
        check(t, trainer)
        if t not in by_step:
            return
        x, y = _batch(bank, seed, t)
        idx = by_step[t]
        G = _row_grads(trainer.model, x[idx], y[idx])  # [n, P]
        Gq = _query_grads(trainer.model, queries, cfg.micro_batch)  # [Q, P]
        values = (trainer.lr * (G @ Gq.T) / N).cpu().numpy()
        for h in horizons:
            if h > t:
                frames.append(_long(seed, "tracin", list(queries), h, [(t, i) for i in idx], values))

    manifest_steps = {int(k) for k in bank.dir.twin(seed).read_manifest()}
    advance_to(tr, max(by_step), stops=set(by_step) | {t for t in manifest_steps if t <= max(by_step)}, visit=visit)
    return pd.concat(frames, ignore_index=True)


def gradient_scores(bank: Bank, seed: int, rows: list[tuple[int, int]], horizons: list[int], device) -> pd.DataFrame:
    """``grad-dot`` and ``grad-cosine`` (module doc) at the twin's saved weights of every horizon, for the rows
    before it."""
    import copy

    from seedlab.lm.model import GPT

    cfg, queries = bank.cfg, _queries(bank)
    model = GPT(bank.inputs.gcfg).to(device)
    N = cfg.batch_size * bank.inputs.gcfg.block_size
    frames = []
    batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for h in horizons:
        before = [(t, i) for t, i in rows if t < h]
        if not before:
            continue
        model.load_state_dict(bank.dir.twin(seed).weights(h))
        work = copy.deepcopy(model)
        Gq = _query_grads(work, queries, cfg.micro_batch)
        qn = Gq.norm(dim=1)
        dots, cosines = np.zeros((len(before), len(queries))), np.zeros((len(before), len(queries)))
        for j, (t, i) in enumerate(before):
            if t not in batches:
                batches[t] = _batch(bank, seed, t)
            x, y = batches[t]
            g = _row_grads(work, x[i:i + 1], y[i:i + 1])[0]
            d = Gq @ g
            dots[j] = (d / N).cpu().numpy()
            cosines[j] = (d / (qn * g.norm()).clamp_min(1e-300)).cpu().numpy()
        frames += [_long(seed, "grad-dot", list(queries), h, before, dots),
                   _long(seed, "grad-cosine", list(queries), h, before, cosines)]
    return pd.concat(frames, ignore_index=True)


def ekfac_scores(bank: Bank, seed: int, rows: list[tuple[int, int]], device) -> pd.DataFrame:
    """``ekfac`` (module doc): kronfluence's pairwise scores at the twin's weights at the end, for every row."""
    import torch

    from seedlab.attribution.estimators.attribute import fit_set
    from seedlab.attribution.estimators.influence import _rows, gpt_task, kronfluence_scores, query_rows, tracked_modules
    from seedlab.lm.model import GPT

    cfg, queries, end = bank.cfg, _queries(bank), bank.cfg.end
    a = cfg.attribute
    model = GPT(bank.inputs.gcfg).to(device)
    model.load_state_dict(bank.dir.twin(seed).weights(end))
    fx, fy = fit_set(bank, seed, end)
    X, Y = _row_tensors(bank, seed, rows)
    qx, qy, qm = query_rows(queries, 0)  # padded with token 0 after each text (masked)
    task = gpt_task(tracked_modules(model, a.modules))
    scores = kronfluence_scores(model, task, _rows(fx, fy, torch.ones(fx.shape, dtype=torch.bool)), _rows(qx, qy, qm),
                                _rows(X, Y, torch.ones(X.shape, dtype=torch.bool)), strategy="ekfac",
                                damping=a.damping)  # [Q, R]
    D = a.train_rows or cfg.batch_size
    return _long(seed, "ekfac", list(queries), end, rows, scores.T / D)


def trak_scores(bank: Bank, seed: int, rows: list[tuple[int, int]]) -> pd.DataFrame:
    """``trak`` (module doc): traker's τ(q, z) at the twin's weights at the end (influence.py ``trak_tau``, on the
    CPU, as ``trak`` computes it: P seeded 0, proj_dim half the training rows, at most 2048), Φ fitted on the
    :func:`~seedlab.attribution.estimators.attribute.fit_set` rows of the end, then every row scored."""
    import torch

    from seedlab.attribution.estimators.attribute import fit_set
    from seedlab.attribution.estimators.influence import InfluenceOptions, query_rows, trak_tau
    from seedlab.lm.model import GPT

    queries, end = _queries(bank), bank.cfg.end
    model = GPT(bank.inputs.gcfg)
    model.load_state_dict(bank.dir.twin(seed).weights(end))
    fx, fy = fit_set(bank, seed, end)
    rx, ry = _row_tensors(bank, seed, rows)
    X, Y = torch.cat([fx, rx]), torch.cat([fy, ry])
    o = InfluenceOptions()  # attribute's trak: its defaults (seed 0, proj_dim None, fit_batch 8)
    tau = trak_tau(model, (X, Y, torch.ones(X.shape, dtype=torch.bool)), query_rows(queries, bank.inputs.pad_id),
                   proj_dim=o.proj_dim, seed=o.seed, fit_batch=o.fit_batch)  # [M + R, Q]
    return _long(seed, "trak", list(queries), end, rows, tau[len(fx):])


# --------------------------------------------------------------------------- reading them back


def metagrad_scores(metagrad: pd.DataFrame) -> pd.DataFrame:
    """metagrad.parquet as row scores (:data:`COLUMNS`): value = −∂L_q(θ_h)/∂w_{t,i}, a removal's first order."""
    return metagrad.assign(estimator="metagrad", value=-metagrad["value"], unit=UNITS["metagrad"])[COLUMNS]


def read_scores(root: str | Path) -> pd.DataFrame | None:
    """Every row score of a bank folder: metagrad.parquet's (as :func:`metagrad_scores`) and rowscores.parquet's;
    None when it has neither."""
    from seedlab.attribution.bank.rundir import BankDir

    rd = BankDir(Path(root))
    parts = []
    if rd.metagrad.is_file():
        parts.append(metagrad_scores(pd.read_parquet(rd.metagrad)))
    if rd.rowscores.is_file():
        parts.append(pd.read_parquet(rd.rowscores)[COLUMNS])
    return pd.concat(parts, ignore_index=True) if parts else None

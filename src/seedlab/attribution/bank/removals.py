"""The bank's removal arms: rows of the twin's own run left out of its loss, one at a time by age
(leave-one-out) and in random groups (the LDS's subsets). What a removal is — the row's loss weight set to 0 with no
text in its place, the batch loss Σ_{i∉removed} ℓ_i / N with N = B·T unchanged — is forks/arms.py's; here: which rows.

**Leave-one-out** (``loo:``). For every step t of ``loo.steps`` and each of the first ``loo.rows`` rows i of its
batch, one arm removes row (t, i) and nothing else (arm ``loo.<t>.<i>``; folder seed-<k>/loo/<t>-<i>). The rows of a
batch are independent draws of the corpus (lm/batches.py: a pure function of (seed, t)), so its first rows are a
random sample of the step's. A step is named as updates completed (an int), or ``s``, ``s+n``, ``s-n``, ``end-n``,
``early`` (⌊s/2⌋) or ``late`` (s + ⌊(end − s)/2⌋): :func:`loo_steps`. For t ≥ s the arm forks from the prefix at s
as every candidate does (bitwise the twin through t); for t < s it leaves the shared prefix at t itself
(forks/arms.py ``Arm.start``: the prefix's own state after t updates, kept when it trains), so its age at the end,
end − t, can exceed the candidates'. Each LOO arm trains end − t updates.

**Groups** (``groups:``). Per training seed, α ∈ ``groups.alphas`` and k < ``groups.subsets``: a subset of
n(α) = round(α·R) of the R = (end − s)·B rows of the steps s .. end − 1, drawn without replacement from
``numpy.random.default_rng([groups.seed, seed, round(α·10⁶), k])`` (:func:`subsets`: the same subsets whenever the
bank is built again), removed together (arm ``group.<α>.<k>``; folder seed-<k>/groups/<α>-<k>). Each group arm
trains end − s updates: per seed, len(alphas) × subsets of them. α·R < 1 leaves no row and is refused by the config.

**The retest** (``ceiling:``). Every leave-one-out arm and the first ``ceiling.subsets`` group subsets per α (null:
every one) again, on the nudged twin: the same rows left out of a run that is also nudged by one ulp at s at the
nudge arm's element (``ceiling.nudge``, a tensor of ``chaos.nudges``: its arm ``nudge.<tensor>`` is the nudged twin;
null: the first), arm ``retest.<the removal's name>`` (folder seed-<k>/retest/loo/<t>-<i>, seed-<k>/retest/groups/<α>-<k>).
Measured against the nudged twin, each removal's effect gets a test–retest partner: the same removal on a trajectory
that differs from the twin's by the smallest possible difference, which the chaotic dynamics grow
(attribution/analyses/ceiling.py). A leave-one-out row before s leaves the prefix at its step, as its removal does, and
is nudged at s. Each retest trains what its removal trains.

**TRAK's subsets** (``trak:``). Per training seed, α_keep ∈ ``trak.keep`` and k < ``trak.subsets``: a subset that keeps
n = round(α_keep·R) of the R rows of steps s .. end − 1, drawn without replacement from
``numpy.random.default_rng([trak.seed, seed, round(α_keep·10⁶), k, 1])`` (:func:`trak_kept`; a draw equal to an
earlier subset of the same α_keep is drawn again from the same generator, so the subsets are distinct), its other
R − n rows removed together. Each subset is retrained ``trak.retrains`` times from the prefix at s: retraining 0 plain,
retraining r ≥ 1 also nudged by one ulp at s at element ``chaos.index`` + r − 1 of ``trak.nudge`` (null: the first of
``chaos.nudges``) — after the shared prefix the bank's training is deterministic, and a training seed fixes every
batch's rows as well as the init, so the nudge is the retraining's seed (arm ``trak.<α_keep>.<k>.<r>``; folder
seed-<k>/trak/<α_keep>-<k>-<r>). A run keeps the schedule and its steps, the removed rows' loss weight 0 (the batch
loss Σ_{kept} ℓ_i / N, N = B·T unchanged, as every removal here): not a shorter run on a smaller data set, as TRAK's
retraining is. Per seed len(keep) × subsets × retrains arms of end − s updates. A subset that keeps every row or none,
or more subsets than distinct ones exist, is refused by the config.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from seedlab.attribution.bank.kinds import GROUP, LOO, RETEST, TRAK  # the registry of arm kinds
from seedlab.errors import SeedlabError

if TYPE_CHECKING:  # forks/arms.py loads torch: imported where the arms are made
    from seedlab.forks.arms import Arm


class Removing(Protocol):
    """What the removal arms read of a bank's config (attribution/bank/config.py ``AttributionConfig``, whose
    validator calls :func:`check`: this module imports no config, so the two do not import each other)."""

    injection_step: int
    batch_size: int
    loo: Any  # LooConfig | None
    groups: Any  # GroupsConfig | None
    chaos: Any  # ChaosConfig (its nudges: the retest's nudged twin, TRAK's retrainings)
    ceiling: Any  # CeilingConfig | None
    trak: Any  # TrakConfig | None

    @property
    def end(self) -> int: ...

Row = tuple[int, int]  # (step, row of its batch)


def loo_name(step: int, row: int) -> str:
    return f"{LOO}{int(step)}.{int(row)}"


def alpha_label(alpha: float) -> str:
    """α as its arm and folder names write it (``%g``: 0.01, 0.05)."""
    return f"{alpha:g}"


def group_name(alpha: float, k: int) -> str:
    return f"{GROUP}{alpha_label(alpha)}.{int(k)}"


def parse_loo(arm: str) -> Row:
    """A leave-one-out arm's (step, row)."""
    m = re.match(r"^loo\.(\d+)\.(\d+)$", arm)
    if m is None:
        raise SeedlabError(f"leave-one-out arm: expected loo.<step>.<row>, got {arm!r}")
    return int(m.group(1)), int(m.group(2))


def parse_group(arm: str) -> tuple[str, int]:
    """A group arm's (α as :func:`alpha_label` writes it, subset index)."""
    m = re.match(r"^group\.(\d+(?:\.\d+)?(?:e-\d+)?)\.(\d+)$", arm)
    if m is None:
        raise SeedlabError(f"group arm: expected group.<alpha>.<subset>, got {arm!r}")
    return m.group(1), int(m.group(2))


def retest_name(removal: str) -> str:
    """The retest arm of the removal arm named ``removal`` (module doc)."""
    return f"{RETEST}{removal}"


def trak_name(keep: float, k: int, r: int) -> str:
    return f"{TRAK}{alpha_label(keep)}.{int(k)}.{int(r)}"


def parse_trak(arm: str) -> tuple[str, int, int]:
    """A TRAK arm's (α_keep as :func:`alpha_label` writes it, subset index, retraining)."""
    m = re.match(r"^trak\.(\d+(?:\.\d+)?(?:e-\d+)?)\.(\d+)\.(\d+)$", arm)
    if m is None:
        raise SeedlabError(f"TRAK arm: expected trak.<keep>.<subset>.<retraining>, got {arm!r}")
    return m.group(1), int(m.group(2)), int(m.group(3))


def is_removal(arm: str) -> bool:
    """A leave-one-out, group, retest or TRAK arm (it carries no text: it is measured on the queries only)."""
    return arm.startswith((LOO, GROUP, RETEST, TRAK))


def resolve_step(spec: int | str, s: int, end: int) -> int:
    """A leave-one-out step as updates completed (module doc); a name it does not know is a one-line error."""
    if isinstance(spec, bool):
        raise SeedlabError(f"loo.steps: a step is an int or s, s+n, s-n, end-n, early, late; got {spec!r}")
    if isinstance(spec, int):
        return spec
    key = str(spec).strip().replace(" ", "")
    named = {"s": s, "early": s // 2, "late": s + (end - s) // 2}
    if key in named:
        return named[key]
    m = re.match(r"^(s|end)([+-])(\d+)$", key)
    if m is None:
        raise SeedlabError(f"loo.steps: a step is an int (updates completed) or s, s+n, s-n, end-n, early, late; "
                           f"got {spec!r}")
    base = s if m.group(1) == "s" else end
    return base + int(m.group(3)) * (1 if m.group(2) == "+" else -1)


def loo_steps(cfg: Removing) -> list[int]:
    """The leave-one-out steps, sorted (none without ``loo``)."""
    if cfg.loo is None:
        return []
    return sorted({resolve_step(t, cfg.injection_step, cfg.end) for t in cfg.loo.steps})


def loo_rows(cfg: Removing) -> list[Row]:
    """Every (step, row) a leave-one-out arm removes, sorted."""
    if cfg.loo is None:
        return []
    return [(t, i) for t in loo_steps(cfg) for i in range(cfg.loo.rows)]


def group_rows(cfg: Removing) -> int:
    """R: the rows the groups are drawn from, (end − s)·B (the steps s .. end − 1)."""
    return (cfg.end - cfg.injection_step) * cfg.batch_size


def group_size(cfg: Removing, alpha: float) -> int:
    """n(α) = round(α·R), at least 1 (α·R < 1 is refused by the config)."""
    return max(1, int(round(alpha * group_rows(cfg))))


def subsets(cfg: Removing, seed: int) -> dict[tuple[float, int], list[Row]]:
    """``{(α, k): [(step, row), ...]}`` of the seed's groups (module doc), each subset sorted."""
    if cfg.groups is None:
        return {}
    s, B, R = cfg.injection_step, cfg.batch_size, group_rows(cfg)
    out = {}
    for alpha in cfg.groups.alphas:
        n = group_size(cfg, alpha)
        for k in range(cfg.groups.subsets):
            rng = np.random.default_rng([cfg.groups.seed, seed, int(round(alpha * 1e6)), k])
            flat = np.sort(rng.choice(R, size=n, replace=False))
            out[alpha, k] = [(s + int(j) // B, int(j) % B) for j in flat]
    return out


def ceiling_nudge(cfg: Removing) -> str | None:
    """The tensor whose nudged twin the retest runs on: ``ceiling.nudge``, else the first of ``chaos.nudges`` (None:
    no ceiling, or no nudge to take)."""
    if cfg.ceiling is None:
        return None
    return cfg.ceiling.nudge or next(iter(cfg.chaos.nudges), None)


def trak_nudge(cfg: Removing) -> str | None:
    """The tensor TRAK's retrainings past the first nudge: ``trak.nudge``, else the first of ``chaos.nudges``."""
    if cfg.trak is None:
        return None
    return cfg.trak.nudge or next(iter(cfg.chaos.nudges), None)


def retested(cfg: Removing, seed: int) -> list[tuple[str, list[Row], int | None]]:
    """The removals the retest repeats, as (the removal arm's name, its rows, where it leaves the prefix): every
    leave-one-out row, then the first ``ceiling.subsets`` subsets of each α (every one when null); [] without a ceiling."""
    if cfg.ceiling is None:
        return []
    s = cfg.injection_step
    out = [(loo_name(t, i), [(t, i)], t if t < s else None) for t, i in loo_rows(cfg)]
    first = cfg.ceiling.subsets
    out += [(group_name(alpha, k), rows, None) for (alpha, k), rows in subsets(cfg, seed).items()
            if first is None or k < first]
    return out


def trak_size(cfg: Removing, keep: float) -> int:
    """n = round(α_keep·R): the rows a TRAK subset keeps (0 and R are refused by the config)."""
    return int(round(keep * group_rows(cfg)))


def trak_kept(cfg: Removing, seed: int) -> dict[tuple[float, int], list[Row]]:
    """``{(α_keep, k): [(step, row), ...]}``: the rows each of the seed's TRAK subsets keeps (module doc), sorted."""
    if cfg.trak is None:
        return {}
    s, B, R = cfg.injection_step, cfg.batch_size, group_rows(cfg)
    out = {}
    for keep in cfg.trak.keep:
        n, seen = trak_size(cfg, keep), set()
        for k in range(cfg.trak.subsets):
            rng = np.random.default_rng([cfg.trak.seed, seed, int(round(keep * 1e6)), k, 1])
            flat = tuple(np.sort(rng.choice(R, size=n, replace=False)).tolist())
            while flat in seen:  # a subset drawn before: drawn again (the config refuses more subsets than exist)
                flat = tuple(np.sort(rng.choice(R, size=n, replace=False)).tolist())
            seen.add(flat)
            out[keep, k] = [(s + j // B, j % B) for j in flat]
    return out


def trak_removed(cfg: Removing, seed: int) -> dict[tuple[float, int], list[Row]]:
    """``{(α_keep, k): [(step, row), ...]}``: the rows each TRAK subset's runs leave out (the rows of steps s .. end − 1
    it does not keep), sorted."""
    every = [(t, i) for t in range(cfg.injection_step, cfg.end) for i in range(cfg.batch_size)]
    out = {}
    for key, kept in trak_kept(cfg, seed).items():
        keep = set(kept)
        out[key] = [r for r in every if r not in keep]
    return out


def arms(cfg: Removing, seed: int) -> list[Arm]:
    """The seed's removal arms: every leave-one-out row (by step, then row), then every group (by α, then k), then
    (``ceiling``) every retest in :func:`retested`'s order, then (``trak``) every TRAK subset's retrainings (by α_keep,
    then k, then r). With neither ``ceiling`` nor ``trak`` the list is what it was before either existed."""
    from seedlab.forks.arms import nudge, removal

    s = cfg.injection_step
    out = [removal(loo_name(t, i), [(t, i)], start=t if t < s else None) for t, i in loo_rows(cfg)]
    out += [removal(group_name(alpha, k), rows) for (alpha, k), rows in subsets(cfg, seed).items()]
    tensor = ceiling_nudge(cfg)
    for name, rows, start in retested(cfg, seed):
        bare = removal(retest_name(name), rows, start=start)
        out.append(replace(bare, perturbation=nudge(bare.name, s, tensor, cfg.chaos.index).perturbation))
    if cfg.trak is not None:
        tensor = trak_nudge(cfg)
        for (keep, k), rows in trak_removed(cfg, seed).items():
            for r in range(cfg.trak.retrains):
                bare = removal(trak_name(keep, k, r), rows)
                out.append(bare if r == 0 else
                           replace(bare, perturbation=nudge(bare.name, s, tensor, cfg.chaos.index + r - 1).perturbation))
    return out


def updates_per_seed(cfg: Removing) -> dict[str, int]:
    """What the removal arms train per seed (updates): the leave-one-out arms (Σ over rows of end − t), the groups, and
    (with ``ceiling``, ``trak``) the retests (each what its removal trains) and TRAK's retrainings."""
    after = cfg.end - cfg.injection_step
    loo = sum(cfg.end - t for t, _ in loo_rows(cfg))
    groups = 0 if cfg.groups is None else len(cfg.groups.alphas) * cfg.groups.subsets * after
    retest = 0
    if cfg.ceiling is not None:
        per_alpha = 0 if cfg.groups is None else min(cfg.groups.subsets, cfg.ceiling.subsets if cfg.ceiling.subsets
                                                     is not None else cfg.groups.subsets)
        retest = loo + (0 if cfg.groups is None else len(cfg.groups.alphas) * per_alpha * after)
    out = {"loo": loo, "groups": groups}
    if cfg.ceiling is not None:
        out["retest"] = retest
    if cfg.trak is not None:
        out["trak"] = len(cfg.trak.keep) * cfg.trak.subsets * cfg.trak.retrains * after
    return out


def check(cfg: Removing) -> None:
    """The ``loo`` and ``groups`` sections against the design (the config validator calls it): every step inside
    the run, the rows within a batch, every α leaving at least one row; else a one-line error (ValueError, as
    pydantic wants it)."""
    s, end = cfg.injection_step, cfg.end
    if cfg.loo is not None:
        try:
            steps = [resolve_step(t, s, end) for t in cfg.loo.steps]
        except SeedlabError as e:
            raise ValueError(str(e).removeprefix("loo.steps: ")) from None
        bad = next((t for t in steps if not 0 <= t < end), None)
        if bad is not None:
            raise ValueError(f"loo.steps: a step must be an update of the run (0 .. {end - 1}), got {bad}")
        if len(set(steps)) != len(steps):
            raise ValueError(f"loo.steps: each step once, got {steps} (from {cfg.loo.steps})")
        if cfg.loo.rows > cfg.batch_size:
            raise ValueError(f"loo.rows: at most the batch's {cfg.batch_size} rows, got {cfg.loo.rows}")
    if cfg.groups is not None:
        R = group_rows(cfg)
        for alpha in cfg.groups.alphas:
            if alpha * R < 1:
                raise ValueError(f"groups.alphas: α = {alpha:g} leaves no row (α·R = {alpha * R:.3g} < 1 of the R = "
                                 f"{R} rows of steps {s} .. {end - 1}); at least {1 / R:.3g}")
        if len(set(cfg.groups.alphas)) != len(cfg.groups.alphas):
            raise ValueError(f"groups.alphas: each α once, got {cfg.groups.alphas}")
    if cfg.ceiling is not None:
        _check_ceiling(cfg)
    if cfg.trak is not None:
        _check_trak(cfg)


def _check_ceiling(cfg: Removing) -> None:
    """The retest needs removals to repeat and a nudged twin to repeat them on."""
    nudges = list(cfg.chaos.nudges)
    if cfg.loo is None and cfg.groups is None:
        raise ValueError("ceiling: nothing to repeat on the nudged twin: the design removes no rows (add a loo or "
                         "groups section)")
    if not nudges:
        raise ValueError("ceiling: needs a nudged twin, and chaos.nudges names none (e.g. --set "
                         "'chaos.nudges=[blocks.0.mlp.c_fc.weight]')")
    if cfg.ceiling.nudge is not None and cfg.ceiling.nudge not in nudges:
        raise ValueError(f"ceiling.nudge: must be one of chaos.nudges ({', '.join(nudges)}): its nudged twin is the "
                         f"retest's reference; got {cfg.ceiling.nudge!r}")
    want = cfg.ceiling.subsets
    if want:
        if cfg.groups is None:
            raise ValueError(f"ceiling.subsets: {want} group subsets to repeat, but the design has no groups section")
        if want > cfg.groups.subsets:
            raise ValueError(f"ceiling.subsets: at most the groups.subsets = {cfg.groups.subsets} subsets each α has, "
                             f"got {want}")


def _check_trak(cfg: Removing) -> None:
    """Every α_keep keeps some rows and removes some, the subsets exist, and retrainings past the first have a tensor to nudge."""
    s, end, R = cfg.injection_step, cfg.end, group_rows(cfg)
    keeps = list(cfg.trak.keep)
    if not keeps:
        raise ValueError("trak.keep: name at least one α_keep")
    if len(set(keeps)) != len(keeps):
        raise ValueError(f"trak.keep: each α_keep once, got {keeps}")
    for keep in keeps:
        n = trak_size(cfg, keep)
        if n < 1:
            raise ValueError(f"trak.keep: α_keep = {keep:g} keeps no row (round(α_keep·R) = 0 of the R = {R} rows of "
                             f"steps {s} .. {end - 1}); at least {1 / R:.3g}")
        if n >= R:
            raise ValueError(f"trak.keep: α_keep = {keep:g} keeps all R = {R} rows of steps {s} .. {end - 1} "
                             f"(round(α_keep·R) = {n}): it removes none; at most {(R - 1) / R:.4g}")
        if math.comb(R, n) < cfg.trak.subsets:
            raise ValueError(f"trak.subsets: {cfg.trak.subsets} distinct subsets of {n} of the R = {R} rows do not "
                             f"exist (at most {math.comb(R, n)}); fewer subsets, or a longer run or a larger batch")
    nudges = list(cfg.chaos.nudges)
    if cfg.trak.retrains > 1 and cfg.trak.nudge is None and not nudges:
        raise ValueError(f"trak.retrains: {cfg.trak.retrains} retrainings, each past the first nudged at s, but neither "
                         "trak.nudge nor chaos.nudges names a tensor to nudge (or --set trak.retrains=1)")


def rows_of(cfg: Removing) -> list[Row]:
    """Every training row a removal arm of the bank touches: the leave-one-out rows, and (with groups or trak) every row
    of the steps s .. end − 1 (what an estimator must score for either LDS: attribution/estimators/rowscores.py). The
    retests remove the same rows as their removals."""
    rows = set(loo_rows(cfg))
    if cfg.groups is not None or cfg.trak is not None:
        rows |= {(t, i) for t in range(cfg.injection_step, cfg.end) for i in range(cfg.batch_size)}
    return sorted(rows)


__all__: Sequence[str] = ("GROUP", "LOO", "RETEST", "TRAK", "arms", "check", "group_name", "loo_name", "loo_rows",
                          "loo_steps", "parse_group", "parse_loo", "parse_trak", "retest_name", "retested", "rows_of",
                          "subsets", "trak_kept", "trak_name", "trak_removed")

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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from seedlab.attribution.bank.kinds import GROUP, LOO  # the registry of arm kinds
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


def is_removal(arm: str) -> bool:
    """A leave-one-out or group arm (it carries no text: it is measured on the queries only)."""
    return arm.startswith((LOO, GROUP))


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


def arms(cfg: Removing, seed: int) -> list[Arm]:
    """The seed's removal arms: every leave-one-out row (by step, then row), then every group (by α, then k)."""
    from seedlab.forks.arms import removal

    s = cfg.injection_step
    out = [removal(loo_name(t, i), [(t, i)], start=t if t < s else None) for t, i in loo_rows(cfg)]
    out += [removal(group_name(alpha, k), rows) for (alpha, k), rows in subsets(cfg, seed).items()]
    return out


def updates_per_seed(cfg: Removing) -> dict[str, int]:
    """What the removal arms train per seed (updates): the leave-one-out arms (Σ over rows of end − t) and the groups."""
    loo = sum(cfg.end - t for t, _ in loo_rows(cfg))
    groups = 0 if cfg.groups is None else len(cfg.groups.alphas) * cfg.groups.subsets * (cfg.end - cfg.injection_step)
    return {"loo": loo, "groups": groups}


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


def rows_of(cfg: Removing) -> list[Row]:
    """Every training row a removal arm of the bank touches: the leave-one-out rows, and (with groups) every row of
    the steps s .. end − 1 (what an estimator must score for the LDS: attribution/estimators/rowscores.py)."""
    rows = set(loo_rows(cfg))
    if cfg.groups is not None:
        rows |= {(t, i) for t in range(cfg.injection_step, cfg.end) for i in range(cfg.batch_size)}
    return sorted(rows)


__all__: Sequence[str] = ("GROUP", "LOO", "arms", "check", "group_name", "loo_name", "loo_rows", "loo_steps",
                          "parse_group", "parse_loo", "rows_of", "subsets")

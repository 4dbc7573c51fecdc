"""The circuit tables' data, from circuits.parquet and patching.parquet (``seedlab shortcut analyze``).

Each member's shortcut head (:func:`shortcut_heads`), each cell's components at the last checkpoint
(patching, ablations, fingerprints), each member's rule head (:func:`rule_heads`), its heads' roles
through training (:func:`aligned_roles`, :func:`role_moments`) and what the circuit figures draw.
:mod:`seedlab.shortcut.circuits_report` and :mod:`seedlab.shortcut.figures` only word, tabulate and draw them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from seedlab.shortcut.stats import CELL, by_cell, paper_order
from seedlab.shortcut.tasks import get_task

# ---------------------------------------------------------------- the shortcut head

# the circuits.parquet fingerprint that marks a shortcut head, per shortcut feature (the paper's QK fingerprints)
SHORTCUT_FINGERPRINT = {"max": "qk_rho_value", "first": "attn_pos0"}


def shortcut_heads(summary: pd.DataFrame, circuits: pd.DataFrame | None) -> pd.DataFrame:
    """Each member's shortcut head: ``member, layer, head``, one row per member that circuits.parquet covers.

    The rule: the attention head with the highest shortcut fingerprint, averaged over the member's
    checkpoints: the activation-based QK rho with token value (``qk_rho_value``: attends to the max) for
    ``*-max`` tasks, the readout's attention on position 0 (``attn_pos0``) for ``*-first`` tasks.
    """
    if circuits is None or circuits.empty:
        return pd.DataFrame({"member": [], "layer": [], "head": []}, dtype="int64")
    c = circuits[circuits["head"] >= 0].merge(summary[["member", "task"]], on="member")
    first = c["task"].map(lambda t: get_task(t).shortcut == "first")
    c = c.assign(score=np.where(first, c[SHORTCUT_FINGERPRINT["first"]], c[SHORTCUT_FINGERPRINT["max"]]))
    mean = c.groupby(["member", "layer", "head"], as_index=False)["score"].mean().dropna(subset=["score"])
    return mean.loc[mean.groupby("member")["score"].idxmax(), ["member", "layer", "head"]].reset_index(drop=True)


# ---------------------------------------------------------------- circuits at the last checkpoint


def last_checkpoint(summary: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of circuits.parquet or patching.parquet (``table``) at each member's last checkpoint, with the
    member's cell (:data:`~seedlab.shortcut.stats.CELL`) and the row's component (``L0H1``, ``L1MLP``)."""
    t = table[table["epoch"] == table.groupby("member")["epoch"].transform("max")].merge(summary[["member", *CELL]], on="member")
    layer = "L" + t["layer"].astype(str)
    return t.assign(component=np.where(t["head"] >= 0, layer + "H" + t["head"].astype(str), layer + "MLP"))


def per_component(summary: pd.DataFrame, table: pd.DataFrame, values: Callable[[pd.DataFrame], dict]) -> pd.DataFrame:
    """One row per cell and component at the last checkpoint (in :func:`~seedlab.shortcut.stats.cell_order`): ``*CELL, component, seeds``
    and the dict ``values(rows)`` returns for the group's rows."""
    rows = [{**dict(zip([*CELL, "component"], key)), "seeds": d["member"].nunique(), **values(d)}
            for key, d in by_cell(last_checkpoint(summary, table), "component")]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=[*CELL, "component", "seeds"])


def _quartile_medians(d: pd.DataFrame, prefix: str) -> dict[str, float]:
    """The median over seeds of each seed's median and quartiles of a per-pair distribution (``{prefix}_q50`` ...)."""
    return {f"{prefix}_q{p}": float(d[f"{prefix}_q{p}"].median()) for p in ("50", "25", "75")}


def patching_medians(summary: pd.DataFrame, patching: pd.DataFrame) -> pd.DataFrame:
    """Activation patching on matched pairs per cell and component at the last checkpoint: ``pairs`` (median per
    seed), ``flagged`` (the mean share of pairs with a gap too small for a fraction), ``gap`` (the median of the
    seeds' median gaps), the fractions' median and quartiles per direction (``forward_q50, forward_q25,
    forward_q75``: clean→corrupt; ``backward_*``: corrupt→clean; the median over seeds of each) and ``dld_forward``,
    ``dld_backward`` (the median over seeds of the median unnormalized change, logits)."""

    def values(d: pd.DataFrame) -> dict[str, float]:
        fwd, back = d[d["direction"] == "clean_to_corrupt"], d[d["direction"] == "corrupt_to_clean"]
        return {
            "pairs": float(fwd["n_pairs"].median()),
            "flagged": float((fwd["n_small_gap"] / fwd["n_pairs"]).mean()),
            "gap": float(fwd["gap_q50"].median()),
            **{k.replace("frac", "forward"): v for k, v in _quartile_medians(fwd, "frac").items()},
            **{k.replace("frac", "backward"): v for k, v in _quartile_medians(back, "frac").items()},
            "dld_forward": float(fwd["dld_q50"].median()),
            "dld_backward": float(back["dld_q50"].median()),
        }

    return per_component(summary, patching, values)


PATH_ABLATIONS = ["qk_uniform", "qk_mean", "ov_mean"]  # the path ablations of circuits.parquet, per head


def ablation_means(summary: pd.DataFrame, circuits: pd.DataFrame) -> pd.DataFrame:
    """Per cell and head at the last checkpoint, the mean over seeds of each path ablation's accuracy change on each
    split (``{kind}_ablation_{split}`` of circuits.parquet, kinds :data:`PATH_ABLATIONS`, splits val and adv)."""
    columns = [f"{k}_ablation_{s}" for k in PATH_ABLATIONS for s in ("val", "adv")]
    return per_component(summary, circuits[circuits["head"] >= 0], lambda d: {c: d[c].mean() for c in columns})


def fingerprint_medians(summary: pd.DataFrame, circuits: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Per cell and component at the last checkpoint, the median over seeds of each fingerprint in ``columns``
    (NaN where no seed has one)."""
    return per_component(summary, circuits, lambda d: {c: float(d[c].median()) if d[c].notna().any() else np.nan
                                                       for c in columns})


def _select(patching: pd.DataFrame, **values: str) -> pd.DataFrame:
    """The rows of patching.parquet with the given values."""
    return patching[np.logical_and.reduce([patching[c] == v for c, v in values.items()])]


def pair_patching(summary: pd.DataFrame, patching: pd.DataFrame, kinds: list[str]) -> pd.DataFrame:
    """:func:`patching_medians` of whole components (``path == total``) for each pair kind in ``kinds``, side by
    side: one row per cell and component, each kind's columns suffixed ``_{kind}``."""
    keys = [*CELL, "component", "seeds"]
    return pd.concat([patching_medians(summary, _select(patching, pairs=k, path="total")).set_index(keys).add_suffix(f"_{k}")
                      for k in kinds], axis=1).reset_index()


def rule_heads(patching: pd.DataFrame) -> pd.DataFrame:
    """Each member's rule head at its last checkpoint: ``member, layer, head``.

    The attention head whose clean activation, patched (whole) into the corrupt run of
    label-changing pairs, raises ld (clean label − corrupt label) the most: the highest median
    Δld clean→corrupt. Chosen by intervention, not by the direct-path OV fingerprint, which
    misses a head whose parity only an MLP reads."""
    t = _select(patching, pairs="label_changing", path="total", direction="clean_to_corrupt")
    t = t[(t["head"] >= 0) & (t["epoch"] == t.groupby("member")["epoch"].transform("max"))]
    return t.loc[t.groupby("member")["dld_q50"].idxmax(), ["member", "layer", "head"]].reset_index(drop=True)


def path_patching(summary: pd.DataFrame, patching: pd.DataFrame, paths: list[str]) -> pd.DataFrame | None:
    """Each member's rule head (:func:`rule_heads`) on label-changing pairs, clean→corrupt, along each of ``paths``,
    per cell and rule head (``rule_head``) at the last checkpoint: ``flagged`` (the mean share of pairs with too
    small a gap), and per path ``dld_{path}`` and ``frac_{path}`` (the median over seeds of each seed's per-pair
    median). None without label-changing pairs."""
    t = _select(patching, pairs="label_changing", direction="clean_to_corrupt").merge(rule_heads(patching), on=["member", "layer", "head"])
    if t.empty:
        return None

    def values(d: pd.DataFrame) -> dict[str, float]:
        out = {"flagged": float((d["n_small_gap"] / d["n_pairs"]).mean())}
        for path in paths:
            p = d[d["path"] == path]
            out |= {f"dld_{path}": float(p["dld_q50"].median()), f"frac_{path}": float(p["frac_q50"].median())}
        return out

    return per_component(summary, t, values).rename(columns={"component": "rule_head"})


#: the per-head measures :func:`aligned_roles` follows (``shortcut_fp``: the task's shortcut fingerprint)
ROLES = ["shortcut_fp", "qk_rho_value", "attn_pos0", "qk_w_rho_value", "qk_w_pos0", "ov_rho_residue", "probe_sum",
         "probe_shortcut", *(f"{k}_ablation_{s}" for k in ("zero", "mean", *PATH_ABLATIONS) for s in ("val", "adv"))]


def aligned_roles(circuits: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Every head of every member at every checkpoint, aligned at the member's generalization epoch.

    Columns: ``*CELL, member, generalized, layer, head, component, epoch, gen_epoch, epochs_from_gen``
    (``epoch - gen_epoch``; nan, like ``gen_epoch``, for members without a generalization epoch,
    which are not aligned), then :data:`ROLES`: ``shortcut_fp`` (``qk_rho_value`` for max tasks,
    ``attn_pos0`` for first tasks, as :data:`SHORTCUT_FINGERPRINT`) and the per-head measures of
    circuits.parquet present. Sorted by member, layer, head, epoch.
    """
    s = summary[["member", *CELL, "generalized", "gen_epoch"]]
    t = circuits[circuits["head"] >= 0].merge(s, on="member")
    gen = t["gen_epoch"].astype("float64").where(t["generalized"].astype(bool))
    fp = t["task"].map(lambda task: SHORTCUT_FINGERPRINT[get_task(task).shortcut])
    shortcut_fp = np.where(fp == "attn_pos0", t.get("attn_pos0", np.nan), t.get("qk_rho_value", np.nan))
    t = t.assign(gen_epoch=gen, epochs_from_gen=t["epoch"] - gen, shortcut_fp=shortcut_fp,
                 component="L" + t["layer"].astype(str) + "H" + t["head"].astype(str))
    keys = [*CELL, "member", "generalized", "layer", "head", "component", "epoch", "gen_epoch", "epochs_from_gen"]
    return t[keys + [c for c in ROLES if c in t]].sort_values(["member", "layer", "head", "epoch"], ignore_index=True)


def _moments(d: pd.DataFrame) -> list[float | None]:
    """One member's checkpoints to show: aligned, the last before gen_epoch, the first at or after it, and the last;
    otherwise the first and the last (None where there is none)."""
    epochs = np.sort(d["epoch"].unique())
    gen = d["gen_epoch"].iloc[0]
    if np.isnan(gen):
        return [epochs[0], epochs[-1]]
    before, after = epochs[epochs < gen], epochs[epochs >= gen]
    return [before[-1] if len(before) else None, after[0] if len(after) else None, epochs[-1]]


def role_moments(roles: pd.DataFrame, columns: list[str], cap: int) -> list[dict]:
    """Per member (at most ``cap`` per cell, the lowest ids) and head of :func:`aligned_roles`, its values at the
    moments around the generalization epoch: the cell, ``member``, ``gen_epoch`` (nan: not aligned), ``component``,
    ``when`` (each moment's epochs from gen_epoch when aligned, else its epoch; None: no such checkpoint) and per
    column of ``columns`` its values at the moments (None where there is no checkpoint)."""
    rows = []
    for _, cell in by_cell(roles):
        for member in sorted(cell["member"].unique())[:cap]:
            d = cell[cell["member"] == member]
            moments, gen = _moments(d), d["gen_epoch"].iloc[0]
            when = [None if e is None else e if np.isnan(gen) else e - gen for e in moments]
            for comp, h in d.groupby("component", sort=True):
                at = h.set_index("epoch")
                rows.append({**h.iloc[0][CELL].to_dict(), "member": member, "gen_epoch": gen, "component": comp,
                             "when": when, **{c: [None if e is None else at.at[e, c] for e in moments] for c in columns}})
    return rows


# ---------------------------------------------------------------- what the figures draw


def fingerprint_series(heads: pd.DataFrame, column: str) -> list[tuple[tuple, pd.Series]]:
    """Per (layer, head, ratio) of circuits.parquet's head rows (of one capacity): the median over seeds of
    ``column`` at each checkpoint."""
    return [(key, g.groupby("epoch")[column].median()) for key, g in heads.groupby(["layer", "head", "ratio"])]


def ablation_grid(summary: pd.DataFrame, circuits: pd.DataFrame) -> tuple[list[tuple], list[str], dict[str, np.ndarray]]:
    """The mean zero-ablation effect (points) of every component at each member's last checkpoint, per capacity and
    ratio (tasks and weight decays pooled): the cells ``(layers, heads, ratio)`` (:func:`~seedlab.shortcut.stats.paper_order`), the
    components, and per split (val, adv) a cells × components grid (NaN where a cell lacks the component)."""
    last = last_checkpoint(summary, circuits)
    cells = sorted({(int(a), int(b), float(r)) for a, b, r in last[["layers", "heads", "ratio"]].itertuples(index=False)},
                   key=paper_order)
    comps = sorted(last["component"].unique())
    grids = {}
    for split in ("val", "adv"):
        grid = np.full((len(cells), len(comps)), np.nan)
        for i, (L, H, r) in enumerate(cells):
            d = last[(last["layers"] == L) & (last["heads"] == H) & np.isclose(last["ratio"], r)]
            for j, comp in enumerate(comps):
                v = d.loc[d["component"] == comp, f"zero_ablation_{split}"]
                grid[i, j] = 100 * v.mean() if len(v) else np.nan
        grids[split] = grid
    return cells, comps, grids

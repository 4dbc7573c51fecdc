"""The report's circuit tables, from ``circuits.parquet`` and ``patching.parquet`` (``seedlab shortcut analyze``).

Each function returns report-ready markdown. Every table is taken at each member's LAST
checkpoint and groups members by cell (task and weight decay when the folder has several,
capacity, ratio r) and component (``L0H1``, ``L1MLP``):

- :func:`pair_patching_table`: matched counterfactual pairs (same label, shortcut-consistent
  vs anti-shortcut, two tokens apart): per pair, the fraction of the clean-vs-corrupt
  logit-difference gap that patching one component moves, in both directions; the median
  over seeds of each seed's per-pair median [quartiles], and the share of flagged pairs
  (gap below ``MIN_GAP`` logits: no fraction).
- :func:`path_ablation_table`: per head, the mean over seeds of the accuracy change (points)
  when its pattern is made uniform or replaced by its mean (QK ablations), or its values by
  their mean (OV ablation).
- :func:`fingerprint_table`: medians over seeds of the activation- and weight-based QK
  fingerprints, the direct-path OV fingerprint, and the linear-probe accuracies.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from seedlab.reporting import fmt_num, md_table, pct
from seedlab.shortcut import stats
from seedlab.shortcut.figures import cap_label, fmt_ratio
from seedlab.shortcut.interventions import MIN_GAP
from seedlab.shortcut.stats import GROUP

PAIR_NOTE = """\
**Activation patching on matched counterfactual pairs.** Each pair is a shortcut-consistent (clean) and an
anti-shortcut (corrupt) sequence with the same label, two tokens apart (the shortcut token changes its residue,
another token restores the sum's; for max tasks the maximum keeps its position), held out from training. With ld =
logit of the shared label minus the best other logit and gap = ld(clean) − ld(corrupt): *clean→corrupt* runs the
corrupt sequence with one component's activation from the clean one, fraction = (ld(patched) − ld(corrupt)) / gap;
*corrupt→clean* the reverse, fraction = (ld(clean) − ld(patched)) / gap. 1 = the component alone carries the
shortcut's effect on this pair. Per pair, then median [quartiles] per seed, then the median over seeds. Pairs with
|gap| < {min_gap} logit are flagged and get no fraction (a model that follows the rule treats both sides alike); Δld
columns are the median unnormalized change (logits) over all pairs.
"""
PATH_NOTE = """\
**QK and OV ablations per head** (mean over seeds of the accuracy change, points). QK→uniform replaces the head's
attention pattern by uniform weights over the keys it may see, QK→mean by its mean pattern over the split; both keep
its values (OV path). OV→mean keeps the pattern and replaces its value vectors by their mean over the split (per
position). A shortcut head's QK ablation costs validation accuracy; a head whose OV path carries the rule costs
adversarial accuracy when OV-ablated.
"""
FINGERPRINT_NOTE = """\
**Fingerprints** (medians over seeds). QK ρ value: Spearman ρ between the readout query's attention on a key and the
key's token value, on the val+adv rows (act.) or from the weights alone, the readout query against every value's key
through the embeddings, averaged over positions (weights). Attn pos 0: the readout's attention on position 0 (act.),
or on a sequence of identical tokens (weights). OV ρ residue: Spearman ρ of each token's OV output, projected on the
unembedding, with its residue (direct path only). Probe: cross-validated accuracy of a linear probe reading the sum
residue (the label) or the shortcut residue from the component's write at the readout position, on val+adv rows
where the two disagree half the time (chance ≈ 1/2 binary, 1/3 ternary); it finds a parity writer that only a later
MLP reads.
"""


def circuits_section(summary: pd.DataFrame, circuits: pd.DataFrame | None, patching: pd.DataFrame | None) -> str:
    """The whole section (``### Circuits at the last checkpoint``) with its three tables; a note for each missing file."""
    missing = "*No {name} (checkpoint the runs, then `seedlab shortcut analyze DIR`).*"
    parts = ["### Circuits at the last checkpoint"]
    parts.append(missing.format(name="patching.parquet") if patching is None or patching.empty
                 else pair_patching_table(summary, patching))
    if circuits is None or circuits.empty:
        parts.append(missing.format(name="circuits.parquet"))
    else:
        parts += [path_ablation_table(summary, circuits), fingerprint_table(summary, circuits)]
    return "\n\n".join(parts)


def _prose(note: str) -> str:
    """A note as one markdown paragraph (the constants above are wrapped for the source)."""
    return " ".join(note.split())


def _table(groups: pd.DataFrame, note: str, columns: list[tuple[str, Callable]]) -> str:
    """``note`` and one row per (cell, component) of ``groups`` (from :func:`seedlab.shortcut.stats.per_component`):
    its cell (task and weight decay only where the table has several), component, seeds, then ``fn(row)`` per column."""
    many = [c for c in GROUP if groups[c].nunique() > 1]
    header = [{"task": "task", "weight_decay": "wd"}[c] for c in many] + ["model", "r", "component", "seeds"]
    rows = [[*(g.task if c == "task" else f"{g.weight_decay:g}" for c in many), cap_label(g.layers, g.heads),
             fmt_ratio(g.ratio), g.component, str(g.seeds), *(fn(g) for _, fn in columns)]
            for g in groups.itertuples(index=False)]
    return note + "\n\n" + md_table([*header, *(name for name, _ in columns)], rows)


def _quartiles(g, direction: str) -> str:
    """'median [q25, q75]' of a per-pair distribution: the median over seeds of each seed's quantiles."""
    q = [getattr(g, f"{direction}_q{p}") for p in ("50", "25", "75")]
    if any(np.isnan(q)):
        return "—"
    return f"{q[0]:.2f} [{q[1]:.2f}, {q[2]:.2f}]"


def pair_patching_table(summary: pd.DataFrame, patching: pd.DataFrame) -> str:
    cols = [
        ("pairs", lambda g: str(int(g.pairs))),
        ("flagged", lambda g: pct(g.flagged)),
        ("median gap", lambda g: fmt_num(g.gap)),
        ("clean→corrupt fraction", lambda g: _quartiles(g, "forward")),
        ("corrupt→clean fraction", lambda g: _quartiles(g, "backward")),
        ("Δld clean→corrupt", lambda g: fmt_num(g.dld_forward)),
        ("Δld corrupt→clean", lambda g: fmt_num(g.dld_backward)),
    ]
    note = _prose(PAIR_NOTE).format(min_gap=f"{MIN_GAP:g}")
    return _table(stats.patching_medians(summary, patching), note, cols)


PATH_NAMES = {"qk_uniform": "QK→uniform", "qk_mean": "QK→mean", "ov_mean": "OV→mean"}


def path_ablation_table(summary: pd.DataFrame, circuits: pd.DataFrame) -> str:
    points = lambda c: lambda g: f"{100 * getattr(g, c):+.0f}"
    cols = [(f"{PATH_NAMES[k]} {s}", points(f"{k}_ablation_{s}")) for k in stats.PATH_ABLATIONS for s in ("val", "adv")]
    return _table(stats.ablation_means(summary, circuits), _prose(PATH_NOTE), cols)


FINGERPRINTS = {
    "qk_rho_value": "QK ρ value (act.)",
    "qk_w_rho_value": "QK ρ value (weights)",
    "attn_pos0": "attn pos 0 (act.)",
    "qk_w_pos0": "attn pos 0 (weights)",
    "ov_rho_residue": "OV ρ residue (direct)",
    "probe_sum": "probe: sum",
    "probe_shortcut": "probe: shortcut",
}


def fingerprint_table(summary: pd.DataFrame, circuits: pd.DataFrame) -> str:
    median = lambda c: lambda g: "—" if np.isnan(getattr(g, c)) else fmt_num(float(getattr(g, c)))
    groups = stats.fingerprint_medians(summary, circuits, list(FINGERPRINTS))
    return _table(groups, _prose(FINGERPRINT_NOTE), [(name, median(c)) for c, name in FINGERPRINTS.items()])

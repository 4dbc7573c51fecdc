"""The report's circuit tables, from ``circuits.parquet`` and ``patching.parquet`` (``seedlab shortcut analyze``).

Each function returns report-ready markdown. The tables of :func:`circuits_section`'s first
part are taken at each member's LAST checkpoint and group members by cell (task and weight
decay when the folder has several, capacity, ratio r) and component (``L0H1``, ``L1MLP``):

Every number comes from :mod:`seedlab.shortcut.circuit_data`; this module only words and tabulates it.

- :func:`pair_patching_table`: matched counterfactual pairs of both kinds side by side
  (same-label: the shortcut feature changes; label-changing: the shortcut token stays, the
  label changes): per pair, the fraction of the clean-vs-corrupt logit-difference gap that
  patching one component moves, in both directions; the median over seeds of each seed's
  per-pair median [quartiles], and the share of flagged pairs (gap below ``MIN_GAP`` logits).
- :func:`path_patching_table`: each member's rule head (:func:`~seedlab.shortcut.circuit_data.rule_heads`) patched on
  label-changing pairs along its whole effect, its direct path to the logits, and its path
  through the MLPs.
- :func:`path_ablation_table`: per head, the mean over seeds of the accuracy change (points)
  when its pattern is made uniform or replaced by its mean (QK ablations), or its values by
  their mean (OV ablation).
- :func:`fingerprint_table`: medians over seeds of the activation- and weight-based QK
  fingerprints, the direct-path OV fingerprint, and the linear-probe accuracies beside their
  chance levels and row counts.

The second part follows each seed's heads through training (:func:`~seedlab.shortcut.circuit_data.aligned_roles`,
:func:`aligned_roles_table`, :func:`aligned_roles_figure`): generalizing members aligned at their
generalization epoch, the others apart, on their own epochs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from seedlab.reporting import Fig, fmt_num, md_table, new_figure, num_or_dash, pct, save_figure
from seedlab.shortcut import circuit_data
from seedlab.shortcut.constants import MIN_GAP
from seedlab.shortcut.figures import (
    MAX_SEEDS_DRAWN,
    REFERENCE_COLOR,
    Folder,
    cap_label,
    component_colors,
    fmt_ratio,
    panel_count,
    shortcut_fingerprint_text,
)
from seedlab.shortcut.stats import CELL, GROUP, paper_order

PAIR_KINDS = {"same_label": "same-label", "label_changing": "label-changing"}  # patching.parquet's ``pairs``
PATH_LABELS = {"total": "total", "direct": "direct", "via_mlp": "via MLP"}  # patching.parquet's ``path``

PAIR_NOTE = """\
**Activation patching on matched counterfactual pairs**, two kinds side by side. Each pair is a shortcut-consistent
(clean) and an anti-shortcut (corrupt) sequence, held out from training. *Same-label* pairs keep the label and change
the shortcut feature (two tokens apart: the shortcut token changes its residue, another token restores the sum's; for
max tasks the maximum keeps its position): a model that follows the shortcut separates the two sides. *Label-changing*
pairs keep the shortcut token (the same first element, or the same maximum at the same position) and change the label
(one other token changes its residue): a model that follows the rule separates them, so only these pairs show the rule
circuit. With ld = logit of the clean label − logit of the corrupt label (the best other logit for same-label pairs)
and gap = ld(clean) − ld(corrupt): *clean→corrupt* runs the corrupt sequence with one component's activation from the
clean one, fraction = (ld(patched) − ld(corrupt)) / gap; *corrupt→clean* the reverse, fraction = (ld(clean) −
ld(patched)) / gap. 1 = the component alone carries the difference between the two sides. Per pair, then median
[quartiles] per seed, then the median over seeds. Pairs with |gap| < {min_gap} logit are flagged and get no fraction
(the model treats both sides alike); Δld columns are the median unnormalized change (logits) over all pairs.
"""
PATH_PATCHING_NOTE = """\
**Path patching of the rule head** on label-changing pairs (clean→corrupt, median over seeds of each seed's per-pair
median). Each member's rule head is the attention head whose clean activation, patched into the corrupt run, raises
ld (clean label − corrupt label) the most at the last checkpoint. Its activation is patched along its whole effect
(*total*), only along its direct path to the logits (added to the last residual stream, which only the unembedding
reads: *direct*), or only into the inputs of the MLPs that read it, its own layer's and later ones, which then act
as usual (*via MLP*); later attention layers see it unpatched in both. Direct + via MLP = total when everything
downstream is linear; a rule head whose parity only an MLP decodes shows its effect via the MLP.
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
or on a sequence of identical tokens (weights). OV ρ token residue (direct): Spearman ρ between each single token's
OV output, projected on the unembedding's direction for a class, and whether the token's own residue is that class:
a per-token copy of residues onto the logits, on the direct path only; it is not the sum's residue (the label) and
does not see a head whose output an MLP reads. Probe: cross-validated accuracy of a linear probe reading the sum
residue (the label) or the shortcut residue from the component's write at the readout position, on val+adv rows
where the two disagree half the time; it finds a parity writer that only a later MLP reads. Its chance level is the
best accuracy reached from the other residue alone (for the sum probe: the best classifier that sees only the
shortcut residue), 1/2 on these rows for binary and ternary tasks alike, not 1/3. Probe rows: rows per probe (half
val, half adv); the probes' small-sample bias, measured on the demo sweep's checkpoints against the whole sequence
space, averaged about 0.1 point and stayed within about 1 point at 4,096 rows, against up to 2-3.5 points at 1,024
(no correction applied; fewer rows than 4,096 when the val/adv splits are smaller).
"""
ALIGNED_NOTE = """\
**Head roles per seed through training.** Generalizing members are aligned at their generalization epoch
(gen_epoch: the first evaluation with 100% adversarial accuracy): for each head, the last checkpoint before it, the
first at or after it, and the last checkpoint, labelled by epochs from gen_epoch. Shortcut fp: the head's shortcut
fingerprint (QK ρ with token value for max tasks, attention on position 0 for first tasks); OV ρ: token residue on the
direct path; probe sum: linear-probe accuracy of the label from the head's write (chance in the fingerprint table);
Δval, Δadv: zero-ablation accuracy change (points). {cap}
"""
UNALIGNED_NOTE = """\
**Members that never generalized** (no gen_epoch to align at): each head at the first and the last checkpoint. {cap}
"""


MISSING = "*No {name} (checkpoint the runs, then `seedlab shortcut analyze DIR`).*"


def circuits_section(summary: pd.DataFrame, circuits: pd.DataFrame | None, patching: pd.DataFrame | None) -> str:
    """``### Circuits at the last checkpoint``: per cell and component; a note for each missing file. ``patching`` as
    :func:`seedlab.shortcut.rundir.read_table` reads it (with ``pairs`` and ``path``)."""
    parts = ["### Circuits at the last checkpoint"]
    if patching is None or patching.empty:
        parts.append(MISSING.format(name="patching.parquet"))
    else:
        parts += [pair_patching_table(summary, patching), path_patching_table(summary, patching)]
    if circuits is None or circuits.empty:
        parts.append(MISSING.format(name="circuits.parquet"))
    else:
        parts += [path_ablation_table(summary, circuits), fingerprint_table(summary, circuits)]
    return "\n\n".join(parts)


def roles_section(summary: pd.DataFrame, circuits: pd.DataFrame) -> str:
    """``### Head roles through training``: the per-member tables (:func:`aligned_roles_table`), which the report puts
    last."""
    return "### Head roles through training, aligned at the generalization epoch\n\n" + aligned_roles_table(summary, circuits)


def _prose(note: str) -> str:
    """A note as one markdown paragraph (the constants above are wrapped for the source)."""
    return " ".join(note.split())


def _table(groups: pd.DataFrame, note: str, columns: list[tuple[str, Callable]], keys: tuple[str, ...] = ("component", "seeds")) -> str:
    """``note`` and one row per row of ``groups`` (e.g. from :func:`seedlab.shortcut.circuit_data.per_component`): its cell
    (task and weight decay only where the table has several), ``keys``, then ``fn(row)`` per column."""
    many = [c for c in GROUP if groups[c].nunique() > 1]
    header = [{"task": "task", "weight_decay": "wd"}[c] for c in many] + ["model", "r", *(k.replace("_", " ") for k in keys)]
    rows = [[*(g.task if c == "task" else f"{g.weight_decay:g}" for c in many), cap_label(g.layers, g.heads),
             fmt_ratio(g.ratio), *(str(getattr(g, k)) for k in keys), *(fn(g) for _, fn in columns)]
            for g in groups.itertuples(index=False)]
    return note + "\n\n" + md_table([*header, *(name for name, _ in columns)], rows)


def _quartiles(g, direction: str, kind: str) -> str:
    """'median [q25, q75]' of a per-pair distribution: the median over seeds of each seed's quantiles."""
    q = [getattr(g, f"{direction}_q{p}_{kind}") for p in ("50", "25", "75")]
    if any(np.isnan(q)):
        return "—"
    return f"{q[0]:.2f} [{q[1]:.2f}, {q[2]:.2f}]"


def pair_patching_table(summary: pd.DataFrame, patching: pd.DataFrame) -> str:
    """Both kinds of pairs side by side (those the table has), whole components (``path == total``)."""
    kinds = [k for k in PAIR_KINDS if (patching["pairs"] == k).any()]
    groups = circuit_data.pair_patching(summary, patching, kinds)
    cols = [("pairs", lambda g: str(int(getattr(g, f"pairs_{kinds[0]}"))))]
    for k, name in ((k, PAIR_KINDS[k]) for k in kinds):
        cols += [
            (f"{name}: flagged", lambda g, k=k: pct(getattr(g, f"flagged_{k}"))),
            (f"{name}: median gap", lambda g, k=k: fmt_num(getattr(g, f"gap_{k}"))),
            (f"{name}: clean→corrupt fraction", lambda g, k=k: _quartiles(g, "forward", k)),
            (f"{name}: corrupt→clean fraction", lambda g, k=k: _quartiles(g, "backward", k)),
            (f"{name}: Δld clean→corrupt", lambda g, k=k: fmt_num(getattr(g, f"dld_forward_{k}"))),
            (f"{name}: Δld corrupt→clean", lambda g, k=k: fmt_num(getattr(g, f"dld_backward_{k}"))),
        ]
    return _table(groups, _prose(PAIR_NOTE).format(min_gap=f"{MIN_GAP:g}"), cols)


def path_patching_table(summary: pd.DataFrame, patching: pd.DataFrame) -> str:
    """Each member's rule head (:func:`seedlab.shortcut.circuit_data.rule_heads`) on label-changing pairs, clean→corrupt,
    along each path (:func:`seedlab.shortcut.circuit_data.path_patching`)."""
    groups = circuit_data.path_patching(summary, patching, list(PATH_LABELS))
    if groups is None:
        return _prose(PATH_PATCHING_NOTE) + "\n\n*No label-changing pairs in patching.parquet (rerun `seedlab shortcut analyze DIR`).*"
    cols = [("flagged", lambda g: pct(g.flagged))]
    cols += [(f"Δld {name}", lambda g, p=p: fmt_num(getattr(g, f"dld_{p}"))) for p, name in PATH_LABELS.items()]
    cols += [(f"fraction {name}", lambda g, p=p: num_or_dash(getattr(g, f"frac_{p}"))) for p, name in PATH_LABELS.items()]
    return _table(groups, _prose(PATH_PATCHING_NOTE), cols, keys=("rule_head", "seeds"))


PATH_NAMES = {"qk_uniform": "QK→uniform", "qk_mean": "QK→mean", "ov_mean": "OV→mean"}


def path_ablation_table(summary: pd.DataFrame, circuits: pd.DataFrame) -> str:
    points = lambda c: lambda g: f"{100 * getattr(g, c):+.0f}"
    cols = [(f"{PATH_NAMES[k]} {s}", points(f"{k}_ablation_{s}")) for k in circuit_data.PATH_ABLATIONS for s in ("val", "adv")]
    return _table(circuit_data.ablation_means(summary, circuits), _prose(PATH_NOTE), cols)


FINGERPRINTS = {
    "qk_rho_value": "QK ρ value (act.)",
    "qk_w_rho_value": "QK ρ value (weights)",
    "attn_pos0": "attn pos 0 (act.)",
    "qk_w_pos0": "attn pos 0 (weights)",
    "ov_rho_residue": "OV ρ token residue (direct)",
    "probe_sum": "probe: sum",
    "probe_sum_chance": "chance: sum",
    "probe_shortcut": "probe: shortcut",
    "probe_shortcut_chance": "chance: shortcut",
    "probe_rows": "probe rows",
}


def fingerprint_table(summary: pd.DataFrame, circuits: pd.DataFrame) -> str:
    columns = [c for c in FINGERPRINTS if c in circuits]  # a circuits.parquet from before the chance levels lacks them
    fmt = lambda c, v: str(int(v)) if c == "probe_rows" and not np.isnan(v) else num_or_dash(v)
    median = lambda c: lambda g: fmt(c, getattr(g, c))
    groups = circuit_data.fingerprint_medians(summary, circuits, columns)
    return _table(groups, _prose(FINGERPRINT_NOTE), [(FINGERPRINTS[c], median(c)) for c in columns])


# ---------------------------------------------------------------- head roles through training

#: the measures the tables and the figure show: column -> label (ablations in points)
SHOWN = {"shortcut_fp": "shortcut fp", "ov_rho_residue": "OV ρ", "probe_sum": "probe sum",
         "zero_ablation_val": "Δval", "zero_ablation_adv": "Δadv"}


def _member_rows(roles: pd.DataFrame, cap: int) -> pd.DataFrame:
    """One row per (member, head) of :func:`seedlab.shortcut.circuit_data.role_moments`, in words: the cell, ``member``,
    ``gen``, ``component``, ``when`` (the moments' epochs, from gen_epoch when aligned) and each shown measure's
    values at the moments."""
    rows = []
    for m in circuit_data.role_moments(roles, list(SHOWN), cap):
        aligned = not np.isnan(m["gen_epoch"])
        when = " / ".join("—" if e is None else f"{int(e):+d}" if aligned else str(int(e)) for e in m["when"])
        cells = {c: " → ".join("—" if v is None else _fmt_role(c, v) for v in m[c]) for c in SHOWN}
        rows.append({**{c: m[c] for c in CELL}, "member": m["member"], "gen": str(int(m["gen_epoch"])) if aligned else "—",
                     "component": m["component"], "when": when, **cells})
    return pd.DataFrame(rows)


def _fmt_role(column: str, v: float) -> str:
    if np.isnan(v):
        return "—"
    return f"{100 * v:+.0f}" if "ablation" in column else f"{v:.2f}"


def aligned_roles_table(summary: pd.DataFrame, circuits: pd.DataFrame, cap: int = MAX_SEEDS_DRAWN) -> str:
    """Per seed and head, the roles at the moments around its generalization epoch
    (:func:`seedlab.shortcut.circuit_data.aligned_roles`); the
    members that never generalized in a table of their own, on their first and last checkpoints."""
    roles = circuit_data.aligned_roles(circuits, summary)
    if roles.empty:
        return "*No attention heads in circuits.parquet.*"
    capped = f"At most {cap} members per cell (the lowest member ids)."
    cols = [(name, lambda g, c=c: getattr(g, c)) for c, name in SHOWN.items()]
    parts = []
    for aligned, note, when in ((True, ALIGNED_NOTE, "epochs from gen: before / at / last"),
                                (False, UNALIGNED_NOTE, "epochs: first / last")):
        part = roles[roles["gen_epoch"].notna() == aligned]
        if part.empty:
            parts.append(_prose(note).format(cap="") + "\n\n*None.*")
            continue
        table = _table(_member_rows(part, cap), _prose(note).format(cap=capped), [(when, lambda g: g.when), *cols],
                       keys=("member", "gen", "component") if aligned else ("member", "component"))
        parts.append(table)
    return "\n\n".join(parts)


def aligned_roles_figure(summary: pd.DataFrame, circuits: pd.DataFrame | None, folder: Folder) -> Fig:
    """Each seed's heads through training: shortcut fingerprint, OV ρ and sum probe against epochs from gen_epoch
    (generalizing members) or epochs (the others), one row of panels per capacity and group."""
    title = "Head roles per seed through training"
    if circuits is None or circuits.empty:
        return Fig(title, None, "no circuits.parquet (checkpoint the runs, then `seedlab shortcut analyze DIR`)")
    roles = circuit_data.aligned_roles(circuits, summary)
    shown = [c for c in ("shortcut_fp", "ov_rho_residue", "probe_sum") if c in roles]
    panels = [(cap, aligned) for cap in sorted({(int(a), int(b)) for a, b in roles[["layers", "heads"]].itertuples(index=False)},
                                               key=paper_order)
              for aligned in (True, False) if ((roles["layers"] == cap[0]) & (roles["heads"] == cap[1])
                                               & (roles["gen_epoch"].notna() == aligned)).any()]
    if not panels:
        return Fig(title, None, "no attention heads in circuits.parquet")
    fig, axes = new_figure(len(panels), len(shown), w=3.8, h=2.8)
    colors = component_colors(roles["component"])
    for row, ((L, H), aligned) in enumerate(panels):
        d = roles[(roles["layers"] == L) & (roles["heads"] == H) & (roles["gen_epoch"].notna() == aligned)]
        every = sorted(d["member"].unique())
        members = every[:MAX_SEEDS_DRAWN]
        x = "epochs_from_gen" if aligned else "epoch"
        for col, c in enumerate(shown):
            ax = axes[row * len(shown) + col]
            for (member, comp), g in d[d["member"].isin(members)].groupby(["member", "component"]):
                ax.plot(g[x], g[c], marker=".", lw=0.8, alpha=0.7, color=colors[comp], label=comp if member == members[0] else None)
            if aligned:
                ax.axvline(0, color=REFERENCE_COLOR, lw=0.8, ls="--")
            group = "generalized" if aligned else "never generalized"
            ax.set_title(f"{cap_label(L, H)} {group}, {panel_count(len(members), len(every))}\n{SHOWN[c]}", fontsize=9)
            ax.set(xlabel="epochs from gen_epoch" if aligned else "epoch")
            if col == 0:
                ax.legend(fontsize=6)
    return Fig(title, save_figure(fig, folder.figure("head_roles.png")),
               f"One line per member and head; colour = head, the colours of the fingerprint figure. A panel with more "
               f"than {MAX_SEEDS_DRAWN} members shows the first {MAX_SEEDS_DRAWN} by id and says so. Generalizing members "
               "are aligned at their gen_epoch (dashed line), the others drawn on their own epochs. Shortcut fp: "
               f"{shortcut_fingerprint_text(summary['task'].unique())}; OV ρ: each token's residue on the direct path; "
               "probe sum: linear-probe accuracy of the label from the head's write.")

"""The two phases of a generalizing run, per member, read off its evaluation curves.

    shortcut_epoch  first evaluation with validation accuracy >= ``val_level`` (shortcut learned)
    phase2_epoch    onset of phase 2: the adversarial trough after the shortcut epoch from which
                    adversarial accuracy rises by >= ``rise`` while validation stays >= ``val_level``
                    (the trough's epoch)
    gen_epoch       first evaluation with adversarial accuracy 100% and validation >= ``val_level`` (as in
                    summary.parquet: the rule; the inverted shortcut solves the adversarial split alone)

Members that never learn the shortcut, or never rise, get <NA>; so does the phase-2 onset of a
member that never generalizes (a rise of a few points that goes nowhere is not phase 2).
"""

from __future__ import annotations

import pandas as pd

VAL_LEVEL = 0.99  # "validation stays >= 99%"
RISE = 0.05  # adversarial accuracy must climb this much above its trough to count as phase 2


def member_phases(curve: pd.DataFrame, val_level: float = VAL_LEVEL, rise: float = RISE,
                  generalized: bool | None = None) -> dict[str, int | None]:
    """``curve``: one member's rows (epoch, split, acc). ``generalized``: whether the member
    generalized (e.g. seen by ``train.adv_every`` checks between the curve's evaluations);
    None: read off the curve."""
    wide = curve.pivot_table(index="epoch", columns="split", values="acc").sort_index()
    out: dict[str, int | None] = {"shortcut_epoch": None, "phase2_epoch": None, "gen_epoch": None}
    gen = wide.index[(wide["adv"] >= 1.0) & (wide["val"] >= val_level)]
    out["gen_epoch"] = int(gen[0]) if len(gen) else None
    learned = wide.index[wide["val"] >= val_level]
    if not len(learned):
        return out
    out["shortcut_epoch"] = int(learned[0])
    if not (out["gen_epoch"] is not None if generalized is None else generalized):  # phase 2 is the climb to the rule
        return out
    trough_acc, trough_epoch = float("inf"), None
    for epoch, row in wide.loc[learned[0] :].iterrows():
        if row["val"] < val_level:  # the shortcut slipped: the trough restarts
            trough_acc, trough_epoch = float("inf"), None
            continue
        if row["adv"] < trough_acc:
            trough_acc, trough_epoch = row["adv"], int(epoch)
        elif row["adv"] >= trough_acc + rise:
            out["phase2_epoch"] = trough_epoch
            break
    return out


def phases(curves: pd.DataFrame, generalized=None) -> pd.DataFrame:
    """Phase epochs for every member in a curves table (member, epoch, split, acc, ...);
    ``generalized``: the members that generalized (None: read off the curves)."""
    gen = None if generalized is None else set(generalized)
    rows = [{"member": m, **member_phases(c, generalized=None if gen is None else m in gen)}
            for m, c in curves.groupby("member", sort=True)]
    df = pd.DataFrame(rows, columns=["member", "shortcut_epoch", "phase2_epoch", "gen_epoch"])
    for col in ("shortcut_epoch", "phase2_epoch", "gen_epoch"):
        df[col] = df[col].astype("Int64")
    return df

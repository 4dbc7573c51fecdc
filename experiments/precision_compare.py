"""Does bf16 change the science? The pre-registered comparison of docs/preregistration/precision.md.

Reads two shortcut sweeps and two twins runs that differ only in ``precision`` (fp32, bf16) and prints,
as markdown, every test fixed in the pre-registration with its decision, then the descriptive rows:

- shortcut, paired by (cell, seed): E1 (TOST on the 128 per-member differences, margin ±0.10), E2 (per
  cell, ±0.25), D1 (Fisher per cell, Holm), F1 (the flip's intersection-union p in each precision);
  rates, discordant pairs, retention and training time per precision;
- twins, paired by seed: T1 (TOST on drop(bf16) − drop(fp32) at s + 50, ±0.02 nats/token, per fluent
  passage), T2 (drop vs 0 in each precision); the drop and the weight distance at the end.

    python experiments/precision_compare.py SWEEP_FP32 SWEEP_BF16 TWINS_FP32 TWINS_BF16 [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from seedlab.config import load_yaml
from seedlab.shortcut import stats as sstats
from seedlab.shortcut.rundir import SweepDir
from seedlab.stats import fisher, paired, tost_paired
from seedlab.twins.rundir import RunDir as TwinsDir

MARGIN_ALL, MARGIN_CELL, MARGIN_TWINS = 0.10, 0.25, 0.02  # fixed in the pre-registration


def sweep(folder: str) -> tuple[pd.DataFrame, str, float]:
    """A finished sweep's summary, its precision and its training time (s, summed over jobs)."""
    s = SweepDir(folder)
    precision = load_yaml(s.config_path)["train"].get("precision", "fp32")
    seconds = sum(json.loads(p.read_text())["seconds"] for p in Path(folder).glob("jobs/*/meta.json"))
    return pd.read_parquet(s.summary_path), precision, seconds


def shortcut_section(a_dir: str, b_dir: str) -> list[str]:
    (a, pa, ta), (b, pb, tb) = sweep(a_dir), sweep(b_dir)
    if (pa, pb) != ("fp32", "bf16"):
        sys.exit(f"error: expected an fp32 then a bf16 sweep, got {pa} and {pb}")
    key = [*sstats.CELL, "seed"]
    m = a.merge(b, on=key, suffixes=("_fp32", "_bf16"), validate="one_to_one")
    if len(m) != len(a) or len(m) != len(b):
        sys.exit(f"error: the sweeps' members do not pair up ({len(a)} fp32, {len(b)} bf16, {len(m)} pairs)")
    d = lambda t: (t["generalized_bf16"].astype(float), t["generalized_fp32"].astype(float))
    e1 = tost_paired(*d(m), MARGIN_ALL)
    out = ["## Shortcut: quick, fp32 vs bf16, paired by cell and seed", "",
           f"E1 (primary): overall rate bf16 − fp32 = {e1['diff']:+.3f}, 90% interval [{e1['ci_low']:+.3f}, "
           f"{e1['ci_high']:+.3f}] over {e1['n']} pairs, margin ±{MARGIN_ALL}: TOST p = {e1['p']:.3g} -> "
           f"**{'equivalent' if e1['equivalent'] else 'not shown equivalent'}**", "",
           "| cell (task, wd, layers, heads, r) | fp32 | bf16 | discordant (fp32 only / bf16 only) | E2: bf16 − fp32, 90% interval | E2 (±0.25) | D1: Fisher p | Holm p | retained fp32 / bf16 |",
           "|---|---|---|---|---|---|---|---|---|"]
    rows, ps = [], []
    for cell, t in sstats.by_cell(m):
        ka, kb, n = int(t["generalized_fp32"].sum()), int(t["generalized_bf16"].sum()), len(t)
        e2 = tost_paired(*d(t), MARGIN_CELL)
        only_a = int((t["generalized_fp32"] & ~t["generalized_bf16"]).sum())
        only_b = int((~t["generalized_fp32"] & t["generalized_bf16"]).sum())
        p = fisher(ka, n, kb, n)[1]
        ps.append(p)
        rows.append((cell, ka, kb, n, only_a, only_b, e2, p, int(t["retained_fp32"].sum()), int(t["retained_bf16"].sum())))
    holm = multipletests(ps, method="holm")[1]
    for (cell, ka, kb, n, oa, ob, e2, p, ra, rb), h in zip(rows, holm, strict=True):
        out.append(f"| {', '.join(map(str, cell))} | {ka}/{n} | {kb}/{n} | {oa} / {ob} | {e2['diff']:+.3f} "
                   f"[{e2['ci_low']:+.3f}, {e2['ci_high']:+.3f}] | {'inside' if e2['equivalent'] else 'not inside'} "
                   f"| {p:.3g} | {h:.3g} | {ra} / {rb} |")
    e2_all = all(r[6]["equivalent"] for r in rows)
    d1 = bool((holm < 0.05).any())
    flips = {name: sstats.simple_slopes(t) for name, t in (("fp32", a), ("bf16", b))}
    f1 = (flips["fp32"]["p_flip"] < 0.05) == (flips["bf16"]["p_flip"] < 0.05)
    out += ["", f"E2 (every cell inside ±{MARGIN_CELL}): **{'yes' if e2_all else 'no'}**; "
            f"D1 (a cell's rate differs, Holm p < 0.05): **{'yes' if d1 else 'no'}**",
            f"F1: the flip's p_flip is {flips['fp32']['p_flip']:.3g} (fp32) and {flips['bf16']['p_flip']:.3g} (bf16): "
            f"**{'same side' if f1 else 'different sides'}** of 0.05",
            f"Training time (sum over jobs, one thread each): fp32 {ta / 60:.1f} min, bf16 {tb / 60:.1f} min "
            f"(bf16/fp32 speed {ta / tb:.2f}x)", "",
            f"Shortcut recommendation rule: bf16 {'may be recommended' if e1['equivalent'] and e2_all and not d1 else 'is not recommended'}"
            " for the shortcut study (the rule: E1 and E2 hold and D1 does not)."]
    return out


def drops(folder: str) -> tuple[pd.DataFrame, str, int]:
    """Per seed and fluent condition: the drop (twin's CE − the condition's on its own passage) at s + 50
    and at the end, and the weight distance at the end; the run's precision and injection step."""
    rd = TwinsDir(Path(folder))
    cfg = rd.read_config()
    c = pd.read_parquet(rd.measure_table("checkpoints"))
    c = c[c.condition.str.startswith("fluent")].assign(drop=lambda t: t.twin_passage_ce - t.passage_ce)
    return c, cfg["precision"], cfg["injection_step"]


def twins_section(a_dir: str, b_dir: str) -> list[str]:
    (a, pa, s), (b, pb, sb) = drops(a_dir), drops(b_dir)
    if (pa, pb) != ("fp32", "bf16") or s != sb:
        sys.exit(f"error: expected fp32 then bf16 twins runs with one injection step, got {pa}, {pb}")
    end = int(a.step.max())
    out = ["", f"## Twins: mini, fp32 vs bf16, paired by seed (drop at s + 50 = step {s + 50})", "",
           "| passage | drop fp32 | drop bf16 | T1: bf16 − fp32, 90% interval | T1 (±0.02) | T2: p vs 0 fp32 / bf16 | drop at the end fp32 / bf16 | distance at the end fp32 / bf16 |",
           "|---|---|---|---|---|---|---|---|"]
    t1_all = t2_all = True
    for cond in sorted(a.condition.unique()):
        at = lambda t, step, col, cond=cond: t[(t.condition == cond) & (t.step == step)].set_index("seed")[col].sort_index()
        fa, fb = at(a, s + 50, "drop"), at(b, s + 50, "drop")
        if list(fa.index) != list(fb.index):
            sys.exit(f"error: {cond}: the runs' seeds differ")
        t1 = tost_paired(fb.to_numpy(), fa.to_numpy(), MARGIN_TWINS)
        t2 = [paired(f.to_numpy(), np.zeros(len(f))) for f in (fa, fb)]
        ok2 = all(r["diff"] > 0 and r["p_t"] < 0.10 for r in t2)
        t1_all, t2_all = t1_all and t1["equivalent"], t2_all and ok2
        out.append(f"| {cond} | {fa.mean():.4f} | {fb.mean():.4f} | {t1['diff']:+.4f} [{t1['ci_low']:+.4f}, {t1['ci_high']:+.4f}] "
                   f"| {'inside' if t1['equivalent'] else 'not inside'} | {t2[0]['p_t']:.3g} / {t2[1]['p_t']:.3g} "
                   f"| {at(a, end, 'drop').mean():.4f} / {at(b, end, 'drop').mean():.4f} "
                   f"| {at(a, end, 'distance').mean():.3f} / {at(b, end, 'distance').mean():.3f} |")
    out += ["", f"T1 (both passages inside ±{MARGIN_TWINS}): **{'yes' if t1_all else 'no'}**; "
            f"T2 (learned in both precisions): **{'yes' if t2_all else 'no'}**",
            f"Twins recommendation rule: bf16 {'may be recommended' if t1_all and t2_all else 'is not recommended'} for the twins (the rule: T1 and T2 hold)."]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_fp32"), ap.add_argument("sweep_bf16"), ap.add_argument("twins_fp32"), ap.add_argument("twins_bf16")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args()
    text = "\n".join(shortcut_section(args.sweep_fp32, args.sweep_bf16) + twins_section(args.twins_fp32, args.twins_bf16)) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

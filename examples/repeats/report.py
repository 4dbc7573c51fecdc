"""report.md of a measured repeats design: the answer in its first lines, then one table of the paired
comparisons and what the integrity record shows. It only renders: every number is repeats/measure.py's
(paired.parquet), and it loads no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from seedlab.errors import SeedlabError
from seedlab.reporting import Report, fmt_num, fmt_p, md_table
from seedlab.store import write_text

from repeats.config import ALPHA, RepeatsFolder, read_config

QUESTION = "Does a passage seen three times differ from one seen once?"
WORDS = {"passage_ce_diff": "the passage's CE minus the twin's (nats/token)", "distance": "weight distance to the twin"}


def write_report(root: str | Path) -> Path:
    """Write ``root``/report.md from the measured tables; returns its path."""
    folder = RepeatsFolder(Path(root))
    if not folder.paired.is_file():
        raise SeedlabError(f"{root}: no paired.parquet (measure it first: repeats measure {root})")
    cfg = read_config(folder.read_config())
    paired = pd.read_parquet(folder.paired).set_index(["comparison", "measure"])
    integrity = json.loads(folder.integrity.read_text())
    rep = Report()
    rep.add(f"# {QUESTION}", answer(paired.loc[("thrice − once", "passage_ce_diff")], cfg.schedule),
            null(paired.loc[("once − ordinary", "passage_ce_diff")]))
    rep.add(f"## Paired over {len(cfg.seeds)} seeds, at the end (step {cfg.end})",
            md_table(["comparison", "measure", "mean a", "mean b", "a − b [95% CI]", "p (t)", "p (sign-flip)", "MDE", "shown"],
                     [[c, WORDS[m], fmt_num(r.mean_a), fmt_num(r.mean_b), f"{fmt_num(r['diff'])} [{fmt_num(r.ci_low)}, "
                       f"{fmt_num(r.ci_high)}]", fmt_p(r.p_t), fmt_p(r.p_perm), fmt_num(r.mde), "yes" if r.shown else "no"]
                      for (c, m), r in paired.iterrows()]),
            f"Shown: both tests p < {ALPHA}. With {len(cfg.seeds)} seeds the sign-flip test cannot go below "
            f"{fmt_p(paired.p_perm_min.iloc[0])}.")
    rep.add("## Integrity", *integrity_lines(integrity, cfg.injection_step))
    return write_text(folder.report, rep.text())


def _effect(r: pd.Series) -> str:
    return (f"{fmt_num(r['diff'])} nats/token [{fmt_num(r.ci_low)}, {fmt_num(r.ci_high)}], "
            f"p (t) {fmt_p(r.p_t)}, p (sign-flip) {fmt_p(r.p_perm)}, {int(r.n)} seeds")


def answer(r: pd.Series, schedule: list[int]) -> str:
    """The study's answer: thrice − once in the passage's CE (each minus its twin's)."""
    seen = f"seen three times (the batches of steps {', '.join(map(str, schedule))})"
    if r.shown:
        how = "lower" if r["diff"] < 0 else "higher"
        return f"**Answer: yes.** {seen.capitalize()}, the passage's CE is {how} than seen once: thrice − once {_effect(r)}."
    floor = (f" (with {int(r.n)} seeds the sign-flip test cannot go below {fmt_p(r.p_perm_min)}: more seeds)"
             if r.p_perm_min >= ALPHA else "")
    return f"**Answer: not shown.** {seen.capitalize()} rather than once, the passage's CE differs by {_effect(r)}{floor}."


def null(r: pd.Series) -> str:
    """Against the null: one sighting of the passage against an ordinary row in its place."""
    verdict = "differs" if r.shown else "is not shown to differ"
    return f"Seen once, the passage's CE {verdict} from an ordinary held-out row's in its place: once − ordinary {_effect(r)}."


def integrity_lines(integrity: dict, s: int) -> list[str]:
    """What integrity.json shows: identical at the fork step, and the replica control."""
    seeds = integrity["seeds"]
    first = next(iter(seeds.values()))
    reps = {k: len(v["replica"]["steps_compared"]) for k, v in seeds.items() if "replica" in v}  # written once it held
    return [f"Identical at step {s}: {first['identical_at_injection']}.",
            "Deterministic after it: the replica control (the twin trained again) is bitwise equal to the twin at every "
            f"hashed step ({'; '.join(f'seed {k}: {n} steps' for k, n in reps.items())})."]

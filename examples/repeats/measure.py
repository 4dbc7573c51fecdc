"""Measure a finished repeats design: every number its report prints, computed here and written
through seedlab.store (the report only renders them).

Per seed x arm (once, thrice, ordinary), at the end of training (``cfg.end`` updates):

- ``passage_ce``       the passage's mean next-token cross-entropy under the arm (nats/token; the model's
                       own float32 loss, seedlab.measures.text ``text_ce``), and ``twin_passage_ce`` under its twin;
- ``passage_ce_diff``  passage_ce − twin_passage_ce: below 0, the arm predicts the passage better than its twin;
- ``distance``         the Euclidean weight distance to the twin, all tensors (seedlab.measures.weights).

Paired over seeds (seedlab.measures.paired ``paired_row``: both tests, the 95% interval, the MDE), for
each of the two measures: ``thrice − once`` (what two more sightings add) and ``once − ordinary``
(what one sighting of the passage does beyond an ordinary row in its place). A difference is
``shown`` when both the paired t-test and the sign-flip test give p < :data:`ALPHA`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from seedlab.errors import SeedlabError
from seedlab.forks.folders import open_design
from seedlab.lm.model import GPT
from seedlab.measures.paired import paired_row
from seedlab.measures.text import text_ce
from seedlab.measures.weights import weight_distance
from seedlab.store import write_parquet

from repeats.config import ALPHA, ARMS, RepeatsFolder, read_config

#: (name, arm a, arm b): the comparisons a − b, paired over seeds
COMPARISONS = (("thrice − once", "thrice", "once"), ("once − ordinary", "once", "ordinary"))
MEASURES = ("passage_ce_diff", "distance")


def measure(root: str | Path, *, device: str = "cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Measure the design in ``root``; writes and returns (measures.parquet, paired.parquet)."""
    folder = RepeatsFolder(Path(root))
    on = open_design(folder, read_config)
    cfg, passage = on.cfg, on.inputs["passage"]
    missing = [f"seed {k} {a}" for k in cfg.seeds for a in ARMS if not folder.run(k, a).finished]
    if missing or not folder.integrity.is_file():
        raise SeedlabError(f"{root}: the design has not finished ({', '.join(missing) or 'no integrity.json'}): "
                           "run it again to finish it")
    model = GPT(cfg.gpt_config(on.corpus.vocab_size)).to(torch.device(device))

    def ce(state: dict) -> float:
        model.load_state_dict(state)
        return text_ce(model, passage, dtype=torch.float32)

    rows = []
    for k in cfg.seeds:
        twin = folder.run(k, "twin").weights(cfg.end)
        twin_ce = ce(twin)
        for arm in ARMS[1:]:
            state = folder.run(k, arm).weights(cfg.end)
            arm_ce = ce(state)
            rows.append({"seed": k, "arm": arm, "step": cfg.end, "passage_ce": arm_ce, "twin_passage_ce": twin_ce,
                         "passage_ce_diff": arm_ce - twin_ce, "distance": weight_distance(state, twin)["all"]})
    measures = pd.DataFrame(rows)
    paired = pd.DataFrame(compare(measures))
    write_parquet(folder.measures, measures)
    write_parquet(folder.paired, paired)
    return measures, paired


def compare(measures: pd.DataFrame) -> list[dict]:
    """Every comparison of :data:`COMPARISONS` on every measure of :data:`MEASURES`, paired over seeds."""
    wide = {m: measures.pivot(index="seed", columns="arm", values=m) for m in MEASURES}
    out = []
    for name, a, b in COMPARISONS:
        for m in MEASURES:
            row = paired_row(wide[m][a].to_numpy(), wide[m][b].to_numpy(), alpha=ALPHA)
            out.append({"comparison": name, "measure": m, **row,
                        "shown": bool(row["p_t"] < ALPHA and row["p_perm"] < ALPHA)})
    return out

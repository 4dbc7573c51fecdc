"""The bank's arm kinds, registered once: what differs from the twin in each kind of run, the channel it acts
through, how its arms are named and the colour it is drawn in. Arms are named ``<prefix><...>`` (a candidate's own
arm is its candidate's name, no prefix); :func:`kind_of` reads the kind back from a name, and the names a
candidate may not take are every kind's prefix (:data:`RESERVED`). A new kind is one entry here plus the function
that makes its arms (attribution/bank/arms.py).

This module imports nothing of the bank, so texts, removals, arms and measure all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

REPLICATE = "replicate."  # a candidate's replicate arm: "replicate.<candidate>"
PAIR, PAIR_SEP = "pair.", ".."  # a pair's arm: "pair.<first>..<second>"
WEIGHTED = "weight."  # a candidate at loss weight w < 1: "weight.<w>.<candidate>"
NUDGE = "nudge."  # one ulp of one weight at s: "nudge.<tensor>"
LOO = "loo."  # a leave-one-out arm: "loo.<step>.<row>"
GROUP = "group."  # a group arm: "group.<alpha>.<subset>"
RETEST = "retest."  # a removal arm again on the nudged twin: "retest.<the removal arm's name>"
TRAK = "trak."  # a TRAK subset's retraining: "trak.<keep>.<subset>.<retraining>"


@dataclass(frozen=True)
class ArmKind:
    """One kind of bank arm."""

    name: str  # as result files write it (distances.parquet's ``kind``)
    prefix: str  # its arms' names start with it ("" for a candidate's own arm)
    channel: str  # what the difference from the twin acts through: data, loss weight or weights
    what: str  # what differs from the twin, in a phrase
    candidate: bool  # carries one candidate's text in one row (its candidate and loss weight read from the name)
    colour: str  # one colour per kind across the bank's figures


KINDS: dict[str, ArmKind] = {k.name: k for k in (
    ArmKind("candidate", "", "data", "the candidate's text in row injection_row of the batch of s", True, "#1f77b4"),
    ArmKind("replicate", REPLICATE, "data", "the candidate's text in row replicate_row instead (its test-retest)", True,
            "#aec7e8"),
    ArmKind("pair", PAIR, "data", "two candidates at once, one in each of the two rows of the batch of s", False,
            "#2ca02c"),
    ArmKind("weighted", WEIGHTED, "loss weight", "the candidate's row at loss weight w < 1 (the size axis)", True,
            "#9467bd"),
    ArmKind("nudge", NUDGE, "weights", "one ulp of one weight at s (the floor chaos alone makes)", False, "#7f7f7f"),
    ArmKind("loo", LOO, "loss weight", "one row of the twin's own batch at some step left out of its loss", False,
            "#d62728"),
    ArmKind("group", GROUP, "loss weight", "a random fraction of the rows of steps s .. end - 1 left out at once", False,
            "#ff7f0e"),
    ArmKind("retest", RETEST, "loss weight", "a leave-one-out or group arm's rows left out of the nudged twin instead "
            "(one ulp at s; measured against the nudged twin: the removal's test-retest)", False, "#8c564b"),
    ArmKind("trak", TRAK, "loss weight", "a random fraction keep of the rows of steps s .. end - 1 kept, the rest left "
            "out (TRAK's retained subset); each retraining past the first also nudged by one ulp at s", False, "#e377c2"),
)}

#: the prefixes a candidate's name may not start with (its own arm would read as another kind)
RESERVED = tuple(k.prefix for k in KINDS.values() if k.prefix)


def kind_of(arm: str) -> ArmKind:
    """The kind of the arm named ``arm`` (not the twin): the kind whose prefix it starts with, else a candidate."""
    return next((k for k in KINDS.values() if k.prefix and arm.startswith(k.prefix)), KINDS["candidate"])

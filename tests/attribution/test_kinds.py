"""attribution/bank/kinds.py: every kind of bank arm registered once, and read back from the names the bank gives."""

from seedlab.attribution.bank.kinds import KINDS, RESERVED, kind_of
from seedlab.attribution.bank.removals import group_name, loo_name, retest_name, trak_name
from seedlab.attribution.bank.texts import nudged, pair, replicate, weighted


def test_every_arm_name_the_bank_makes_reads_back_as_its_kind():
    made = {"candidate": "heldout-3", "replicate": replicate("heldout-3"), "pair": pair("heldout-3", "passage-1"),
            "weighted": weighted(0.25, "heldout-3"), "nudge": nudged("wte.weight"), "loo": loo_name(50, 2),
            "group": group_name(0.05, 7), "retest": retest_name(loo_name(50, 2)), "trak": trak_name(0.5, 3, 1)}
    assert set(made) == set(KINDS)
    assert {k: kind_of(name).name for k, name in made.items()} == {k: k for k in made}


def test_the_registry_holds_one_distinct_prefix_channel_and_colour_per_kind():
    prefixes = [k.prefix for k in KINDS.values() if k.prefix]
    assert len(set(prefixes)) == len(prefixes) == len(KINDS) - 1 and set(RESERVED) == set(prefixes)
    assert len({k.colour for k in KINDS.values()}) == len(KINDS)
    assert {k.channel for k in KINDS.values()} <= {"data", "loss weight", "weights"}
    assert [k.name for k in KINDS.values() if k.candidate] == ["candidate", "replicate", "weighted"]

"""Phase epochs read off hand-written curves."""

import pandas as pd

from seedlab.shortcut.phases import member_phases, phases


def _curve(val, adv, every=10):
    rows = [(e * every, "val", v) for e, v in enumerate(val)] + [(e * every, "adv", a) for e, a in enumerate(adv)]
    return pd.DataFrame(rows, columns=["epoch", "split", "acc"])


def test_two_phase_run():
    #            epoch: 0    10    20    30    40    50    60
    c = _curve(val=[0.5, 0.995, 1.0, 1.0, 1.0, 1.0, 1.0], adv=[0.5, 0.05, 0.02, 0.03, 0.2, 0.9, 1.0])
    assert member_phases(c) == {"shortcut_epoch": 10, "phase2_epoch": 20, "gen_epoch": 60}


def test_shortcut_only_and_never_learned():
    assert member_phases(_curve([0.5, 1.0, 1.0], [0.5, 0.0, 0.01])) == {"shortcut_epoch": 10, "phase2_epoch": None, "gen_epoch": None}
    assert member_phases(_curve([0.5, 0.6], [0.5, 0.55])) == {"shortcut_epoch": None, "phase2_epoch": None, "gen_epoch": None}


def test_rise_while_shortcut_lost_does_not_count():
    c = _curve(val=[1.0, 1.0, 0.7, 0.7, 1.0, 1.0, 1.0], adv=[0.1, 0.0, 0.5, 0.6, 0.55, 0.7, 1.0])
    # the rise at 20-30 happens with validation < 99%; the trough restarts at 40 (0.55), phase 2 from there
    assert member_phases(c)["phase2_epoch"] == 40


def test_table_types():
    c = _curve([0.5, 1.0], [0.5, 0.0])
    df = phases(pd.concat([c.assign(member=0), c.assign(member=1)]))
    assert list(df.columns) == ["member", "shortcut_epoch", "phase2_epoch", "gen_epoch"]
    assert str(df.shortcut_epoch.dtype) == "Int64" and df.phase2_epoch.isna().all()


def test_a_wobble_without_generalizing_is_not_phase_2():
    """A member that never generalizes has no phase-2 onset, however its adversarial accuracy wobbles."""
    c = _curve(val=[0.5, 1.0, 1.0, 1.0, 1.0], adv=[0.5, 0.02, 0.01, 0.08, 0.03])
    assert member_phases(c) == {"shortcut_epoch": 10, "phase2_epoch": None, "gen_epoch": None}

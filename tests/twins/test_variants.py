"""Every twins condition is registered once (twins/variants.py): a new null is one entry and the function that
builds its arm, and it runs through config validation, training, measurement, the report's tables and the
figures' legends with no other module edited."""

import pytest
from matplotlib.colors import to_rgb

from seedlab.config import parse
from seedlab.errors import SeedlabError
from seedlab.twins.config import TwinsConfig
from seedlab.twins.variants import CHANNELS, VARIANTS, Variant, color, null_groups, register, variant_of


def reversed_passage(inputs, v):
    """The new null's whole definition of its arm: the fabricated passage's tokens in reverse order, in the row."""
    from seedlab.forks.arms import injection

    cfg = inputs.cfg
    ids = list(reversed(inputs.texts["fluent-fabricated"]))
    return [injection(v.name, ids, cfg.injection_step, cfg.injection_row)]


NEW = Variant("reversed-passage", "null", "data", "tab:cyan", "the fabricated passage's tokens in reverse order",
              reversed_passage)


@pytest.fixture
def registered():
    v = register(NEW)
    yield v
    VARIANTS.pop(v.name)


def test_the_registry_is_one_place_and_its_colours_are_distinct():
    for name, v in VARIANTS.items():
        assert v.name == name and v.role in ("twin", "passage", "null") and v.channel in CHANNELS and v.description
    assert len({to_rgb(v.color) for v in VARIANTS.values()} | {to_rgb(color("seed"))}) == len(VARIANTS) + 1
    shades = [to_rgb(color(f"ordinary-row.{i}")) for i in range(24)]  # one colour per ordinary row, none another's
    assert len(set(shades)) == 24 and not set(shades) & {to_rgb(v.color) for v in VARIANTS.values() if v.name != "ordinary-row"}
    assert variant_of("ordinary-row.3") is variant_of("ordinary-row") is VARIANTS["ordinary-row"]
    assert variant_of("matched-noise") is VARIANTS["weight-kick"] and variant_of("ordinary-row.x") is None
    assert null_groups() == ["ordinary-rows", "nudge", "matched-gradient", "sign-gradient", "weight-kick"]
    with pytest.raises(SeedlabError, match=r"^variant 'nudge': that name is registered already"):
        register(VARIANTS["nudge"])


def test_a_condition_named_twice_is_refused():
    with pytest.raises(SeedlabError, match=r"^conditions: 'nudge' is named twice"):
        parse(TwinsConfig, {"corpus": "c", "conditions": ["twin", "nudge", "nudge"]})


def test_a_null_registered_here_runs_through_every_module(registered, twins_inputs, tmp_path, monkeypatch):
    """One entry and its function: the config accepts it (and refused it before), the run trains its arm, measure
    measures it, the report's tables name it beside the other nulls, and every figure that draws it has it in its
    legend, in its own colour."""
    import figcheck

    from seedlab.twins import figures, report
    from seedlab.twins.measure import measure
    from seedlab.twins.train import run_twins

    corpus, files = twins_inputs
    cfg = {"corpus": str(corpus), "model": "mini", "block_size": 128, "seeds": [0, 1], "steps": 12, "batch_size": 4,
           "injection_step": 4, "peak_lr": 3e-3, "checkpoint_every": 4, "threads": 1,
           "conditions": ["twin", "fluent-fabricated", "ordinary-row", "reversed-passage"], "nulls": {"ordinary_rows": 2},
           "passages": {"fluent-fabricated": str(files["fluent-fabricated"])},
           "measure": {"alphas": [0, 0.5, 1], "heldout_rows": 4, "probe_rows": 2, "eval_rows": 4}}
    VARIANTS.pop(NEW.name)
    with pytest.raises(SeedlabError, match=r"^conditions: must be among twin, .*got 'reversed-passage'"):
        parse(TwinsConfig, cfg)
    register(NEW)
    design = parse(TwinsConfig, cfg)
    assert design.arm_names == ["twin", "fluent-fabricated", "ordinary-row.0", "ordinary-row.1", "reversed-passage"]
    run_twins(design, tmp_path / "run", base=tmp_path, progress=False)
    out = measure(tmp_path / "run", progress=False)
    assert set(out["measures"].condition) >= {"reversed-passage", "ordinary-row.0", "fluent-fabricated"}
    figs = figcheck.capture(monkeypatch, figures)
    text = report.write_report(tmp_path / "run").read_text()
    assert "fluent-fabricated vs reversed-passage" in text  # the nulls' table
    assert "from the fabricated passage's tokens in reverse order: " in text  # its description, from the registry
    assert "against each of the 2 nulls (the ordinary rows, reversed-passage)" in text  # the answer's nulls, in words
    assert "| reversed-passage |" in text  # the per-arm tables
    legends = {name: _legend_colors(fig) for name, fig in figs.items()}
    drawn = [name for name, colors in legends.items() if "reversed-passage" in colors]
    assert {"interpolation.png", "cka.png", "distance_course.png"} <= set(drawn), legends
    for name in drawn:
        assert legends[name]["reversed-passage"] == {"#17becf"}, name  # tab:cyan, its own colour
    figcheck.check_all(figs)  # its legend entries drawn, its colour distinct from every other arm's


def _legend_colors(fig) -> dict[str, set[str]]:
    """label -> the colours its legend keys are drawn in, over the figure's legends."""
    import figcheck

    out: dict[str, set[str]] = {}
    for ax in fig.axes:
        lg = ax.get_legend()
        for h, t in zip(lg.legend_handles, lg.texts) if lg else ():
            out.setdefault(t.get_text(), set()).add(figcheck.style(h)[0])
    return out

"""Horizon-aware plug-ins (attribution/estimators/plugins.py): the guide's example against brute force, what a
plug-in is handed (copies: θ_s, the AdamW state; the twin's weights on request), the refusals, and
the attribute stage calling one per horizon with its unit reaching the report's calibration."""

from __future__ import annotations

import copy
import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from seedlab.attribution.estimators.builtin import Case, Gradients
from seedlab.attribution.estimators.registry import get_estimator, run
from seedlab.errors import SeedlabError
from seedlab.lm.model import masked_ce_sum
from seedlab.measures.text import text_ce

pytestmark = pytest.mark.usefixtures("one_thread")
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "attribution.md"
GUIDE_PLUGIN = "my_estimators:tracin_at_horizon"


def readme_plugin() -> str:
    """The plug-in example of the attribution guide, docs/attribution.md (its first ```python block;
    test_estimators_literature.py runs its at-θ_s plug-in)."""
    section = GUIDE.read_text().split("# The attribution study", 1)[1]
    return textwrap.dedent(re.search(r"```python\n(.*?)```", section, re.S).group(1))


def _case(fork) -> Case:
    return Case.of(fork.x, fork.y, fork.row, fork.candidates, fork.queries, 0)


def _after_a_step(fork) -> dict[str, torch.Tensor]:
    """The fork point's weights after one real AdamW update on its batch: a 'twin at h' ≠ θ_s."""
    model, opt = fork.copy()
    opt.zero_grad()
    (masked_ce_sum(model(fork.x)[0], fork.y, torch.ones_like(fork.x, dtype=torch.bool)) / fork.x.numel()).backward()
    opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _at(fork, state, direction: torch.Tensor | None = None, eps: float = 0.0):
    """A copy of the fork's model at ``state`` moved by eps·direction (flat over parameters)."""
    m = copy.deepcopy(fork.model)
    m.load_state_dict(state)
    if direction is not None:
        with torch.no_grad():
            flat = torch.nn.utils.parameters_to_vector(m.parameters()) + eps * direction
            torch.nn.utils.vector_to_parameters(flat, m.parameters())
    return m


@pytest.fixture
def guide(tmp_path, monkeypatch):
    (tmp_path / "my_estimators.py").write_text(readme_plugin())
    monkeypatch.chdir(tmp_path)  # plug-ins are imported with the current folder on sys.path
    return tmp_path


def test_the_guides_horizon_aware_plugin_reads_the_query_at_the_twins_weights(fork, guide):
    case, lr, s = _case(fork), 1e-3, 5
    grads = Gradients(fork.model, case)
    e = get_estimator(GUIDE_PLUGIN)
    assert (e.label, e.unit, e.per_horizon, e.horizon) == ("plug-in", "nats/token", True, "every horizon")
    theta_s = {k: v.detach().clone() for k, v in fork.model.state_dict().items()}
    later = _after_a_step(fork)
    asked = []

    def twin(step):
        asked.append(step)
        return theta_s if step == s else later

    # at h = s the twin's weights are θ_s: TracIn's term at s, exactly as the built-in computes it
    at_s = run(GUIDE_PLUGIN, fork.model, case, grads=grads, lr=lr, step=s, horizon=s, twin=twin)
    np.testing.assert_allclose(at_s, run("tracin", fork.model, case, grads=grads, lr=lr), rtol=1e-12, atol=0)
    # at h = s + 1 the query's gradient is taken at the later weights: brute force by central differences
    # of L_q along each swap gradient, −lr/N·(L_q(θ_h + εd) − L_q(θ_h − εd))/2ε with d = ∇ℓ_c − ∇ℓ_r at θ_s
    got = run(GUIDE_PLUGIN, fork.model, case, grads=grads, lr=lr, step=s, horizon=s + 1, twin=twin)
    assert asked == [s, s + 1]  # the twin read once per call, at the call's horizon
    brute = np.zeros_like(got)
    for i, c in enumerate(case.candidates):
        d = grads.swap(c)
        eps = 1e-4 / float(d.norm())
        up, down = _at(fork, later, d, eps), _at(fork, later, d, -eps)
        for j, q in enumerate(case.queries.values()):
            brute[i, j] = -lr / case.n_targets * (text_ce(up, q) - text_ce(down, q)) / (2 * eps)
    np.testing.assert_allclose(got, brute, rtol=1e-6)
    assert np.abs(got - at_s).max() > 1e-3 * np.abs(at_s).max()  # the horizon changed the prediction


PLUGINS = textwrap.dedent("""
    import numpy as np
    import torch

    from seedlab.attribution.estimators.plugins import declare

    SEEN = {}

    def zeros(case):
        return np.zeros((len(case.candidates), len(case.queries)))

    def vandal(model, case, grads):
        SEEN["model"], SEEN["grads_model"] = model, grads.model
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        return zeros(case)

    def vandal_ctx(ctx):
        with torch.no_grad():
            for p in ctx.model.parameters():
                p.mul_(3)
            for t in ctx.adam().m.values():
                t.fill_(7)
        return zeros(ctx.case)

    def scales_a_gradient(ctx):
        ctx.grads.query(next(iter(ctx.case.queries))).mul_(2)
        return zeros(ctx.case)

    def scales_theta_s(ctx):
        with torch.no_grad():
            next(ctx._theta_s.parameters()).add_(1)
        return zeros(ctx.case)

    def lazy(ctx):
        SEEN["ctx"] = ctx
        return zeros(ctx.case)

    def reads(ctx):
        SEEN["weights"] = (ctx.weights(), ctx.weights(step=ctx.step))
        SEEN["adam"] = ctx.adam()
        return zeros(ctx.case) + ctx.after

    @declare(unit="nats/token")
    def in_nats(model, case, grads):
        return zeros(case)

    def one(x):
        return None

    def ctx_and_more(ctx, other):
        return None

    @declare(unit="nats")
    def bad_unit(ctx):
        return None

    def bad_horizons(ctx):
        return None
    bad_horizons.horizons = "end"

    @declare(horizons=[0])
    def horizon_zero(ctx):
        return None

    @declare(horizons=[3, "mid"])
    def wants_known(ctx):
        return zeros(ctx.case)

    @declare(horizons=[7])
    def wants_s7(ctx):
        return zeros(ctx.case)

    def fingerprint(ctx):
        return zeros(ctx.case) + float(sum(t.double().sum() for t in ctx.weights().values()))
""")


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "my_plugins.py").write_text(PLUGINS)
    monkeypatch.chdir(tmp_path)
    import importlib
    import sys

    sys.modules.pop("my_plugins", None)
    yield lambda: importlib.import_module("my_plugins")
    sys.modules.pop("my_plugins", None)


def _state(fork):
    return ({k: v.detach().clone() for k, v in fork.model.state_dict().items()},
            {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()} for p, st in fork.opt.state.items()})


def _same(fork, saved) -> bool:
    weights, opt = saved
    now = _state(fork)
    return (all(torch.equal(weights[k], now[0][k]) for k in weights)
            and all(torch.equal(opt[i][k], now[1][i][k]) for i in opt for k in opt[i]))


def test_a_plugin_changes_only_its_own_copies(fork, plugins):
    case = _case(fork)
    grads = Gradients(fork.model, case)
    before, saved = run("tracin", fork.model, case, grads=grads, lr=1e-3), _state(fork)
    run("my_plugins:vandal", fork.model, case, grads=grads)
    seen = plugins().SEEN
    assert seen["model"] is seen["grads_model"] is not fork.model  # grads.model is the plug-in's copy too
    assert all(float(p.detach().abs().sum()) == 0 for p in seen["model"].parameters())  # it did zero its copy
    run("my_plugins:vandal_ctx", fork.model, case, grads=grads, step=5, horizon=6, optimizer=fork.opt)
    assert _same(fork, saved)  # θ_s and the AdamW state untouched
    assert np.array_equal(run("tracin", fork.model, case, grads=grads, lr=1e-3), before)
    assert np.array_equal(run("tracin", fork.model, case, lr=1e-3), before)  # fresh gradients: the same weights


@pytest.mark.parametrize("name, match", [
    ("scales_a_gradient", r"^estimator 'my_plugins:scales_a_gradient': changed grads\.query\('short'\) in place; "
                          r"it is shared with the other estimators"),
    ("scales_theta_s", r"^estimator 'my_plugins:scales_theta_s': changed the weights at θ_s"),
])
def test_changing_what_others_share_is_caught(fork, plugins, name, match):
    case = _case(fork)
    with pytest.raises(SeedlabError, match=match) as err:
        run(f"my_plugins:{name}", copy.deepcopy(fork.model), case, step=5, horizon=6)
    assert "\n" not in str(err.value)


def test_the_lazy_parts_cost_nothing_until_asked(fork, plugins):
    case, calls = _case(fork), []
    state = {k: v.detach().clone() for k, v in fork.model.state_dict().items()}

    def twin(step):
        calls.append(step)
        return state

    run("my_plugins:lazy", fork.model, case, step=5, horizon=9, twin=twin, optimizer=fork.opt, lr=1e-3, seed=3,
        grad_clip=1.0)
    ctx = plugins().SEEN["ctx"]
    assert calls == [] and ctx._memo == {}  # no weights read, no copy of θ_s or of the moments made
    assert (ctx.seed, ctx.step, ctx.horizon, ctx.after, ctx.lr, ctx.grad_clip) == (3, 5, 9, 4, 1e-3, 1.0)
    out = run("my_plugins:reads", fork.model, case, step=5, horizon=9, twin=twin, optimizer=fork.opt)
    assert calls == [9, 5] and np.all(out == 4)  # ctx.weights() is this horizon's; step= another saved step


def test_the_adam_state_is_a_copy_by_parameter_name(fork, plugins):
    case = _case(fork)
    run("my_plugins:reads", fork.model, case, step=5, horizon=6, optimizer=fork.opt, twin=lambda t: {})
    adam = plugins().SEEN["adam"]
    named = dict(fork.model.named_parameters())
    assert list(adam.m) == list(named)
    for name, p in named.items():
        st = fork.opt.state[p]
        assert torch.equal(adam.m[name], st["exp_avg"]) and torch.equal(adam.v[name], st["exp_avg_sq"])
        assert adam.m[name] is not st["exp_avg"] and adam.steps[name] == 5  # five updates before the fork
        assert adam.weight_decay[name] == (0.1 if p.dim() >= 2 else 0.0)
    assert adam.betas == (0.9, 0.95) and adam.eps == 1e-8
    flat = adam.flat("v")
    assert flat.dtype == torch.float64 and torch.equal(flat, torch.cat([fork.opt.state[p]["exp_avg_sq"].reshape(-1)
                                                                        for p in named.values()]).double())
    sgd = torch.optim.SGD(fork.model.parameters(), lr=0.1)
    with pytest.raises(SeedlabError, match=r"^ctx\.adam\(\): the run's optimizer is SGD, not AdamW"):
        run("my_plugins:reads", fork.model, case, step=5, horizon=6, optimizer=sgd, twin=lambda t: {})


@pytest.mark.parametrize("name, match", [
    ("one", r"^estimator 'my_plugins:one': horizon-aware plug-ins take \(ctx\), training-rows plug-ins \(rows\), "
            r"the others must take \(model, case, grads\), its signature is one\(x\)$"),
    ("ctx_and_more", r"its signature is ctx_and_more\(ctx, other\)$"),
    ("bad_unit", r"^estimator 'my_plugins:bad_unit': unit must be nats/token or score, got 'nats'$"),
    ("bad_horizons", r"horizons must be a list of updates after s \(≥ 1\), 'mid' or 'end', got 'end'$"),
    ("horizon_zero", r"horizons must be a list of updates after s \(≥ 1\), 'mid' or 'end', got \[0\]$"),
])
def test_plugin_declarations_are_checked_on_load(plugins, name, match):
    with pytest.raises(SeedlabError, match=match) as err:
        get_estimator(f"my_plugins:{name}")
    assert "\n" not in str(err.value)


def test_declared_units_and_forms(fork, plugins):
    e = get_estimator("my_plugins:in_nats")
    assert (e.unit, e.per_horizon, e.needs) == ("nats/token", False, ())
    assert get_estimator("my_plugins:lazy").unit == "score"  # the default
    with pytest.raises(SeedlabError, match=r"^estimator 'my_plugins:lazy': needs step=, horizon=$"):
        run("my_plugins:lazy", fork.model, _case(fork))
    with pytest.raises(SeedlabError, match="horizon 4 is before the injection step 5"):
        run("my_plugins:lazy", fork.model, _case(fork), step=5, horizon=4)


# --------------------------------------------------------------------------- the attribute stage on a small bank


@pytest.fixture(scope="module")
def small_bank(tmp_path_factory, twins_inputs, bank_design):
    """conftest's TINY_BANK trained (s = 4; horizons s+1, s+3, mid = 9, end = 14), not attributed."""
    from seedlab.attribution.bank.run import run_bank
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.config import load_config

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("plugin-bank")
    cfg, folder = load_config(AttributionConfig, "attribution", bank_design.write(base, twins_inputs[0]))
    run_bank(cfg, base / "bank", base=folder, progress=False)
    torch.set_num_threads(before)
    return base / "bank"


def _files(folder):
    return sorted((p.relative_to(folder).as_posix(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file())


def test_attribute_calls_a_horizon_aware_plugin_once_per_horizon(small_bank, tmp_path, monkeypatch):
    import shutil

    from seedlab.attribution.estimators.attribute import attribute
    from seedlab.attribution.bank.rundir import BankDir, open_bank
    from seedlab.attribution.analyses.stats import Arrays, calibration

    bank = shutil.copytree(small_bank, tmp_path / "bank")
    (tmp_path / "my_estimators.py").write_text(readme_plugin())
    (tmp_path / "my_plugins.py").write_text(PLUGINS)
    monkeypatch.chdir(tmp_path)
    names = ["tracin", "my_estimators:grad_dot", GUIDE_PLUGIN, "my_plugins:wants_known", "my_plugins:fingerprint"]
    df = attribute(bank, estimators=names, progress=False, settings=["attribute.fit_rows=8"])
    cfg = open_bank(bank).cfg
    by = {n: f for n, f in df.groupby("estimator")}
    assert dict(by[GUIDE_PLUGIN][["unit", "estimator_label"]].drop_duplicates().values.tolist()) == {"nats/token": "plug-in"}
    assert set(by["my_estimators:grad_dot"].unit) == {"score"}
    key = ["seed", "candidate", "query"]
    wide = by[GUIDE_PLUGIN].pivot_table(index=key, columns="horizon", values="estimate")
    assert list(wide.columns) == sorted(cfg.horizon_steps())
    top = wide.abs().max(axis=1)
    moved = top > 0  # the own-row candidate's swap is 0: 0 at every horizon
    assert moved.mean() > 0.5 and ((wide.max(axis=1) - wide.min(axis=1))[moved] > 1e-6 * top[moved]).all()
    assert by["my_estimators:grad_dot"].groupby(key).estimate.nunique().eq(1).all()  # the θ_s form: one number
    # every (seed, horizon) got its own twin's weights after h updates
    got = by["my_plugins:fingerprint"].groupby(["seed", "horizon"]).estimate.agg(["min", "max"])
    for (seed, h), row in got.iterrows():
        want = float(sum(t.double().sum() for t in BankDir(bank).twin(seed).weights(h).values()))
        assert row["min"] == row["max"] == want
    assert len(got) == 2 * len(cfg.horizon_steps())
    cal = calibration(Arrays.of(df), df)
    assert GUIDE_PLUGIN in set(cal.estimator) and "my_estimators:grad_dot" not in set(cal.estimator)
    meta = json.loads(BankDir(bank).attribution_json.read_text())
    assert meta["labels"][GUIDE_PLUGIN] == "plug-in" and GUIDE_PLUGIN in meta["seconds"]


def test_a_plugin_asking_for_a_horizon_the_bank_lacks_is_refused_before_any_work(seedlab_cli, small_bank, tmp_path):
    before = _files(small_bank)
    (tmp_path / "my_plugins.py").write_text(PLUGINS)  # seedlab_cli runs in tmp_path
    for args, match in [
        (["--estimator", "sgd", "--estimator", "my_plugins:wants_s7"],
         r"^error: estimator 'my_plugins:wants_s7': asks for horizon s\+7 \(step 11\), which this bank lacks "
         r"\(its horizons: s\+1 \(step 5\), s\+3 \(step 7\), mid \(step 9\), end \(step 14\)\)$"),
        (["--estimator", "my_plugins:bad_unit"], "unit must be nats/token or score, got 'nats'"),
    ]:
        rc, _, err = seedlab_cli("attribution", "attribute", str(small_bank), *args, "--no-progress")
        assert rc == 2 and err.strip().count("\n") == 0 and re.search(match, err.strip()), (args, err)
    assert _files(small_bank) == before

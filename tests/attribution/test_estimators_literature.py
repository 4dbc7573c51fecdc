"""The estimators as the literature defines them, against brute force on the tiny fork of conftest.py:
the exact AdamW update (two real torch AdamW steps), TracIn's one term at s, TrackStar's
Adam-preconditioned cosine, the baselines, and plug-in estimators (docs/attribution.md's example included)."""

from __future__ import annotations

import copy
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seedlab.attribution.estimators.builtin import Case, Gradients, query_tensors
from seedlab.attribution.estimators.registry import get_estimator, run
from seedlab.errors import SeedlabError
from seedlab.lm.batches import inject
from seedlab.lm.model import masked_ce_sum
from seedlab.measures.text import text_ce

pytestmark = pytest.mark.usefixtures("one_thread")
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "attribution.md"


def _case(fork) -> Case:
    return Case.of(fork.x, fork.y, fork.row, fork.candidates, fork.queries, 0)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def _real_step(fork, passage, lr: float, grad_clip: float | None):
    """A copy of the fork point after one real step of its fused torch AdamW, the trainer's way:
    (masked CE sum over the batch, ``passage`` in row ROW or None) / N, backward, clip, step."""
    model, opt = fork.copy()
    x, y, m = (fork.x, fork.y, torch.ones_like(fork.x, dtype=torch.bool)) if passage is None \
        else inject(fork.x, fork.y, fork.row, passage, 0)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad()
    model.eval()  # no dropout either way; the estimators' gradients are taken in eval mode
    (masked_ce_sum(model(x)[0], y, m) / x.numel()).backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), grad_clip)
    opt.step()
    return model


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("grad_clip", [None, 0.1])  # 0.1 < ‖g‖ ≈ 0.3: the clip is active (and exact)
def test_adam_is_the_exact_adamw_update(fork, grad_clip):
    # brute force: θ_c, θ_o after two real torch AdamW steps from the fork point (with and without
    # the candidate); ``adam`` = ⟨∇L_q(θ_s), θ_c − θ_o⟩ with nothing linearised in Adam
    case, lr = _case(fork), 1e-3
    grads = Gradients(fork.model, case)
    twin = _flat(_real_step(fork, None, lr, grad_clip).parameters())
    brute = np.array([[float(grads.query(q) @ (_flat(_real_step(fork, ids, lr, grad_clip).parameters()) - twin))
                       for q in case.queries] for ids in case.candidates.values()])
    est = run("adam", fork.model, case, grads=grads, lr=lr, optimizer=fork.opt, grad_clip=grad_clip)
    assert _rel(est, brute) < 1e-10  # observed 2e-15 (no clip) and 1e-14 (clip) of the largest effect
    lin = run("adam-linear", fork.model, case, grads=grads, lr=lr, optimizer=fork.opt, grad_clip=grad_clip)
    assert _rel(lin, brute) > 1e-2  # observed 7.5% and 6.7%: the whole row is no small change for Adam


def test_adam_predicts_the_real_loss_change(fork):
    # the real swap (w = 1) at lr 1e-5: what is left out is the O(‖Δθ‖²) curvature of L_q only
    # (adam-linear is off by ~7.5% here: test_estimators.py)
    case, lr = _case(fork), 1e-5
    twin = _real_step(fork, None, lr, None)
    measured = np.array([[text_ce(_real_step(fork, ids, lr, None), q) - text_ce(twin, q)
                          for q in case.queries.values()] for ids in case.candidates.values()])
    est = run("adam", fork.model, case, lr=lr, optimizer=fork.opt)
    lin = run("adam-linear", fork.model, case, lr=lr, optimizer=fork.opt)
    assert _rel(est, measured) < 1e-3 < 1e-2 < _rel(lin, measured)  # observed 6e-5 and 7.5%
    assert np.sign(est[0, 0]) == np.sign(measured[0, 0]) == -1


def _row_grad(model, x, y, m) -> torch.Tensor:
    """∇ of a row's masked CE sum, straight from autograd."""
    model.eval()
    return _flat(torch.autograd.grad(masked_ce_sum(model(x)[0], y, m), list(model.parameters())))


def _brute(fork):
    """(∇L_q per query, ∇ℓ_c − ∇ℓ_r per candidate), from autograd."""
    r = slice(fork.row, fork.row + 1)
    g_r = _row_grad(fork.model, fork.x[r], fork.y[r], torch.ones(1, fork.T, dtype=torch.bool))
    swaps = {}
    for c, ids in fork.candidates.items():
        x, y, m = inject(fork.x, fork.y, fork.row, ids, 0)
        swaps[c] = _row_grad(fork.model, x[r], y[r], m[r]) - g_r
    gq = {}
    for q, ids in fork.queries.items():
        t = torch.tensor([ids])
        gq[q] = _row_grad(fork.model, t[:, :-1], t[:, 1:], torch.ones(1, len(ids) - 1, dtype=torch.bool)) / (len(ids) - 1)
    return gq, swaps, g_r


def test_tracin_is_the_term_at_s(fork):
    # TracIn sums over the steps that used the example: one, at s: −lr_s⟨∇L_q, ∇ℓ_c − ∇ℓ_r⟩/N
    case, lr, N = _case(fork), 1e-3, fork.B * fork.T
    gq, swaps, _ = _brute(fork)
    brute = np.array([[-lr * float(gq[q] @ swaps[c]) / N for q in case.queries] for c in case.candidates])
    got = run("tracin", fork.model, case, lr=lr)
    np.testing.assert_allclose(got, brute, rtol=1e-9)
    assert np.array_equal(got, run("sgd", fork.model, case, lr=lr))  # plain SGD's step, no clip
    # tracin-cp over the checkpoint s alone is the same; a later checkpoint adds a visit that never happened
    state = {k: v.clone() for k, v in fork.model.state_dict().items()}
    assert np.array_equal(run("tracin-cp", fork.model, case, checkpoints=[(state, lr)]), got)
    assert not np.allclose(run("tracin-cp", fork.model, case, checkpoints=[(state, lr)] * 2), got)


def test_adam_cosine_is_trackstars_score(fork):
    # TrackStar without projection or task Hessian: unit-normalised gradients divided by √v̂ + ε,
    # v̂ the AdamW second moment at θ_s bias-corrected for the k updates so far (5 here)
    case = _case(fork)
    gq, swaps, _ = _brute(fork)
    params = list(fork.model.parameters())
    k = int(fork.opt.state[params[0]]["step"])
    (beta2, eps) = fork.opt.param_groups[0]["betas"][1], fork.opt.param_groups[0]["eps"]
    P = 1 / ((_flat(fork.opt.state[p]["exp_avg_sq"] for p in params) / (1 - beta2**k)).sqrt() + eps)

    def cos(a, b):
        return float(a @ b / (a.norm() * b.norm()))

    brute = np.array([[-cos(P * gq[q], P * swaps[c]) for q in case.queries] for c in case.candidates])
    got = run("adam-cosine", fork.model, case, optimizer=fork.opt)
    np.testing.assert_allclose(got, brute, rtol=1e-6)  # float32 CE in the row gradients
    plain = run("cosine", fork.model, case)
    assert np.abs(got - plain).max() > 0.05  # the preconditioner changes the direction
    assert got[0, 0] < 0 and np.all(np.abs(got) <= 1)


def test_trak_is_the_traker_formula(fork):
    # brute force in float64 from autograd: per-row margin gradients f = Σ_t log(p_t/(1 − p_t)),
    # traker's Gaussian CPU projection (the same seeded matrix), φ = Pᵀ∇f/√p, its (ΦᵀΦ)⁻¹ scaled by
    # the mean |entry|, Q = the row's mean 1 − p_t; training set: the batch, the row, the candidates
    pytest.importorskip("trak")
    from trak.projectors import BasicProjector, ProjectionType

    from seedlab.attribution.estimators.influence import InfluenceOptions

    case = _case(fork)
    got = run("trak", fork.model, case, influence=InfluenceOptions(seed=3))
    model = copy.deepcopy(fork.model).float().eval()
    params = list(model.parameters())

    def features(x, y, m):
        logp = F.log_softmax(model(x)[0].float(), -1).gather(-1, y[..., None])[..., 0]
        f = torch.where(m, logp - torch.log(-torch.expm1(logp)), 0.0).sum()
        q = float(torch.where(m, 1 - logp.detach().exp(), 0.0).sum() / m.sum())
        return _flat(torch.autograd.grad(f, params)), q

    ones = torch.ones(1, fork.T, dtype=torch.bool)
    rows = [(fork.x[i : i + 1], fork.y[i : i + 1], ones) for i in range(fork.B)]
    rows += [case.ordinary_row(), *(case.candidate_row(c) for c in case.candidates)]
    G, Q = zip(*(features(*r) for r in rows))
    G, Q = torch.stack(G), torch.tensor(Q, dtype=torch.float64)
    Gq = torch.stack([features(*query_tensors(ids))[0] for ids in case.queries.values()])
    k = len(rows) // 2
    P = BasicProjector(grad_dim=G.shape[1], proj_dim=k, seed=3, proj_type=ProjectionType.normal,
                       device="cpu").proj_matrix.double()
    phi, phi_q = G @ P / G.shape[1] ** 0.5, Gq @ P / G.shape[1] ** 0.5
    inv = torch.linalg.inv(phi.T @ phi)
    tau = (phi @ (inv / inv.abs().mean()) @ phi_q.T) * Q[:, None]
    want = -(tau[fork.B + 1 :] - tau[fork.B : fork.B + 1]).numpy()
    assert _rel(got, want) < 1e-4  # observed 4e-6: float32 in traker
    own = run("trak", fork.model, Case.of(fork.x, fork.y, fork.row, {"own": fork.own()}, fork.queries, 0))
    assert (own == 0).all()  # no swap: set to 0, as every estimator gives it


def test_baselines(fork):
    # −(score(c) − score(r)), the same for every query; r the replaced row (T + 1 tokens)
    own = fork.own()
    texts = {**fork.candidates, "own": own}
    case = Case.of(fork.x, fork.y, fork.row, texts, fork.queries, 0)
    gq, swaps, g_r = _brute(fork)

    def mean_ce(ids):
        t = torch.tensor(ids)
        with torch.no_grad():
            return float(F.cross_entropy(fork.model.eval()(t[None, :-1])[0][0].double(), t[1:]))

    def gnorm(c):
        return float((swaps[c] + g_r).norm()) if c != "own" else float(g_r.norm())

    scores = {"loss": mean_ce, "length": len,
              "random": lambda ids: float(np.random.default_rng([7, *ids]).random())}
    for name, score in scores.items():
        got = run(name, fork.model, case, seed=7)
        want = [-(score(ids) - score(own)) for ids in texts.values()]
        assert got.shape == (3, 2) and np.all(got == got[:, :1])  # one number per candidate
        np.testing.assert_allclose(got[:, 0], want, rtol=1e-6, atol=0)
        assert got[2, 0] == 0.0  # the own-row candidate, exactly
    got = run("gradnorm", fork.model, case)
    np.testing.assert_allclose(got[:2, 0], [-(gnorm(c) - gnorm("own")) for c in fork.candidates], rtol=1e-6)
    assert got[2, 0] == 0.0
    assert run("length", fork.model, case)[:, 0].tolist() == [fork.T + 1 - 9, 0.0, 0.0]
    assert not np.array_equal(run("random", fork.model, case, seed=7), run("random", fork.model, case, seed=8))
    assert get_estimator("random").label == "baseline" and get_estimator("random").unit == "score"


# --------------------------------------------------------------------------- plug-ins


def readme_plugin() -> str:
    """The plug-in example of the attribution guide, docs/attribution.md (its first ```python block)."""
    section = GUIDE.read_text().split("# The attribution study", 1)[1]
    return textwrap.dedent(re.search(r"```python\n(.*?)```", section, re.S).group(1))


def test_the_readme_plugin_runs_and_is_a_gradient_dot_product(fork, tmp_path, monkeypatch):
    (tmp_path / "my_estimators.py").write_text(readme_plugin())
    monkeypatch.chdir(tmp_path)  # plug-ins are imported with the current folder on sys.path
    case = _case(fork)
    gq, swaps, _ = _brute(fork)
    got = run("my_estimators:grad_dot", fork.model, case)
    brute = np.array([[-float(gq[q] @ swaps[c]) for q in case.queries] for c in case.candidates])
    np.testing.assert_allclose(got, brute, rtol=1e-9)
    e = get_estimator("my_estimators:grad_dot")
    assert (e.name, e.label, e.unit) == ("my_estimators:grad_dot", "plug-in", "score")


PLUGINS = textwrap.dedent("""
    import numpy as np

    def good(model, case, grads):
        return np.zeros((len(case.candidates), len(case.queries)))

    def two_args(model, case):
        return None

    def wrong_shape(model, case, grads):
        return np.zeros(3)

    not_a_function = 3
""")


@pytest.mark.parametrize("spec, match", [
    ("no_such_module_xyz:f", r"^estimator 'no_such_module_xyz:f': cannot import no_such_module_xyz \(ModuleNotFoundError"),
    ("broken_plugins:f", r"cannot import broken_plugins \(ZeroDivisionError: division by zero\)"),
    ("plugins_ok:missing", r"^estimator 'plugins_ok:missing': plugins_ok has no missing$"),
    ("plugins_ok:not_a_function", "is not a function"),
    ("plugins_ok:two_args", r"must take \(model, case, grads\), its signature is two_args\(model, case\)$"),
    ("plugins_ok:", "a plug-in is named package.module:function"),
    ("plugins ok:good", "a plug-in is named package.module:function"),
])
def test_plugin_refusals_are_one_line(tmp_path, monkeypatch, spec, match):
    (tmp_path / "plugins_ok.py").write_text(PLUGINS)
    (tmp_path / "broken_plugins.py").write_text("1 / 0\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SeedlabError, match=match) as err:
        get_estimator(spec)
    assert "\n" not in str(err.value)
    assert get_estimator("plugins_ok:good").label == "plug-in"


def test_plugin_of_the_wrong_shape(fork, tmp_path, monkeypatch):
    (tmp_path / "plugins_shape.py").write_text(PLUGINS)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SeedlabError, match=r"returned shape \(3,\), not \(candidates, queries\) = \(2, 2\)"):
        run("plugins_shape:wrong_shape", fork.model, _case(fork))


# --------------------------------------------------------------------------- the attribute stage (the session's tiny bank)


def _files(folder):
    return sorted((p.relative_to(folder).as_posix(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file())


def test_attribute_runs_a_plugin_beside_the_builtins(tiny_bank, tmp_path, monkeypatch):
    import json
    import shutil

    import pandas as pd

    from seedlab.attribution.estimators.attribute import COLUMNS, attribute
    from seedlab.attribution.bank.rundir import BankDir, open_bank
    from seedlab.lm.schedule import lr_of

    bank = shutil.copytree(tiny_bank / "bank", tmp_path / "bank")
    (tmp_path / "my_estimators.py").write_text(readme_plugin())
    monkeypatch.chdir(tmp_path)
    df = attribute(bank, estimators=["tracin", "my_estimators:grad_dot"], progress=False,
                   settings=["attribute.fit_rows=8"])
    assert list(df.columns) == COLUMNS and list(pd.read_parquet(BankDir(bank).attribution).columns) == COLUMNS
    assert "measured_replicate" in df  # measure.collect's, or NaN where the bank has none
    assert dict(df.drop_duplicates("estimator").set_index("estimator").estimator_label) == {
        "tracin": "estimator", "my_estimators:grad_dot": "plug-in"}
    # the guide's plug-in is −⟨∇L_q, ∇ℓ_c − ∇ℓ_r⟩ = tracin · N / lr_s
    cfg = open_bank(bank).cfg
    key = ["seed", "candidate", "query", "horizon"]
    both = df[df.estimator == "tracin"].merge(df[df.estimator != "tracin"], on=key)
    n = cfg.batch_size * cfg.block_size
    np.testing.assert_allclose(both.estimate_y, both.estimate_x * n / lr_of(cfg, cfg.injection_step), rtol=1e-9, atol=1e-12)
    meta = json.loads(BankDir(bank).attribution_json.read_text())
    assert meta["fit_rows"] == 8 and meta["labels"]["my_estimators:grad_dot"] == "plug-in"
    assert json.loads(BankDir(bank).config.read_text())["attribute"].get("fit_rows", 256) == 256  # not written back


def test_the_curvature_fit_set_is_drawn_from_the_twins_batches(tiny_bank):
    from seedlab.attribution.estimators.attribute import fit_set, with_settings
    from seedlab.attribution.bank.rundir import open_bank
    from seedlab.lm.batches import get_batch

    bank = with_settings(open_bank(tiny_bank / "bank"), ["attribute.fit_rows=6"])
    cfg, tokens = bank.cfg, bank.inputs.corpus.train
    s = cfg.injection_step
    batches = [get_batch(tokens, 0, t, cfg.batch_size, cfg.block_size) for t in range(s + 1)]
    seen = {tuple(r) for bx, by in batches for r in torch.cat([bx, by[:, -1:]], 1).tolist()}
    x, y = fit_set(bank, 0, s)
    assert x.shape == (6, cfg.block_size) and torch.equal(x[:, 1:], y[:, :-1])
    assert all(tuple(r) in seen for r in torch.cat([x, y[:, -1:]], 1).tolist())
    assert torch.equal(fit_set(bank, 0, s)[0], x) and not torch.equal(fit_set(bank, 1, s)[0], x)
    every, _ = fit_set(with_settings(bank, ["attribute.fit_rows=1000"]), 0, s)  # fewer rows than asked: all of them
    assert len(every) == (s + 1) * cfg.batch_size


def test_attribute_refusals_are_one_line_and_write_nothing(seedlab_cli, tiny_bank, tmp_path):
    bank = tiny_bank / "bank"
    before = _files(bank)
    (tmp_path / "plugins_ok.py").write_text(PLUGINS)  # seedlab_cli runs in tmp_path
    for args, match in [
        (["--estimator", "no_such_module_xyz:f"], "cannot import no_such_module_xyz"),
        (["--estimator", "sgd", "--estimator", "plugins_ok:two_args"], r"must take \(model, case, grads\)"),
        (["--set", "attribute.fit_rows=100000000"], r"attribute.fit_rows: 100000000 is more than the corpus's \d+ training rows"),
        (["--set", "steps=3"], "attribute takes attribute.KEY=VALUE only"),
    ]:
        rc, _, err = seedlab_cli("attribution", "attribute", str(bank), *args, "--no-progress")
        assert rc == 2 and err.strip().count("\n") == 0 and re.search(match, err), (args, err)
    assert _files(bank) == before

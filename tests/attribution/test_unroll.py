"""unroll, the exact linearized counterfactual: its Jacobian-vector product against finite differences
of the update it linearizes, plain SGD's measured effect matched at every horizon (not only s+1), the
own-row control exactly 0, and a replay that is not the twin's run refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedlab.attribution.estimators.attribute import attribute
from seedlab.attribution.bank.run import run_bank
from seedlab.attribution.estimators.unroll import Step
from seedlab.errors import SeedlabError
from seedlab.lm.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def _trainer(design, **over) -> Trainer:
    cfg, base = design(**over)
    from seedlab.attribution.bank.texts import load_inputs

    inputs = load_inputs(cfg, base)
    t = Trainer(cfg.model_copy(update={"device": "cpu"}), inputs.gcfg, 0, inputs.corpus.train)
    t.model.double()
    for _ in range(3):  # nonzero moments, a clip that acts (grad_clip below the gradient's norm)
        t.advance()
    return t


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_the_jvp_of_the_update_is_its_derivative(design, optimizer):
    # F(z + εΔ) − F(z − εΔ) / 2ε in float64 against jvp(F)(Δ), through the clip, the moments and √v
    t = _trainer(design, optimizer=optimizer, grad_clip=0.05, weight_decay=0.1)
    step = Step(t)
    g = torch.Generator().manual_seed(0)
    # θ: an absolute direction; m and v: relative ones (v stays positive within ±ε)
    tan = tuple(tuple(torch.randn(p.shape, generator=g, dtype=torch.float64) * (1e-2 if k == 0 else p)
                      for p in part) for k, part in enumerate(step.state))
    batched = tuple(tuple(x[None] for x in part) for part in tan)
    pushed = step.push(batched, chunk=None)
    eps = 1e-3
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        plus = step(*(tuple(a + eps * b for a, b in zip(z, d)) for z, d in zip(step.state, tan)))
        minus = step(*(tuple(a - eps * b for a, b in zip(z, d)) for z, d in zip(step.state, tan)))
    for k in range(len(step.state)):
        fd = torch.cat([((p - m) / (2 * eps)).reshape(-1) for p, m in zip(plus[k], minus[k])])
        jv = torch.cat([x[0].reshape(-1) for x in pushed[k]])
        err = float(torch.linalg.vector_norm(fd - jv) / torch.linalg.vector_norm(fd))
        assert err < 1e-4, (k, err)


def test_plain_sgd_every_horizon_matches_the_measured_effect(tmp_path, design):
    # plain SGD (no decay, no clipping) at a small rate: the measured Δ L_query at *every* horizon is the
    # linear response up to O(δ²) terms and float32 round-off — not only at s+1, where one step is exact
    cfg, base = design(optimizer="sgd", peak_lr=2e-3, min_lr=0.0, weight_decay=0.0, grad_clip=1e9, steps=14,
                       horizons=[1, 3, "end"], seeds=[0], candidates={"file": "candidates.txt", "heldout": 2})
    run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    df = attribute(tmp_path / "bank", estimators=["unroll", "sgd"], progress=False)
    u, one = df[df.estimator == "unroll"], df[df.estimator == "sgd"]
    assert set(u.label) == {"s+1", "s+3", "end"}
    for label, g in u.groupby("label"):
        err = np.abs(g.estimate - g.measured).max() / np.abs(g.measured).max()
        assert err < 1e-2, (label, err)
    # ... where the one-step estimate, frozen at θ_s, is not: the response has moved on by the end
    end_u, end_1 = u[u.label == "end"], one[one.label == "end"]
    assert np.abs(end_1.estimate - end_1.measured).max() > 5 * np.abs(end_u.estimate - end_u.measured).max()


def test_own_row_is_exactly_zero_and_adamw_tracks_the_measured_effect(tmp_path, design):
    cfg, base = design(seeds=[0], horizons=[1, 3, "end"], peak_lr=1e-3)
    run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    df = attribute(tmp_path / "bank", estimators=["unroll"], progress=False)
    own = df[df.candidate == "own-row"]
    assert len(own) and (own.estimate == 0).all() and (own.measured == 0).all()
    rest = df[df.candidate != "own-row"]
    for _, g in rest.groupby("horizon"):
        assert np.corrcoef(g.estimate, g.measured)[0, 1] > 0.9


def test_a_replay_that_is_not_the_twin_is_refused(tmp_path, design, monkeypatch):
    cfg, base = design(seeds=[0], horizons=[1, 3])
    run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    real = Trainer.advance

    def drifting(self, *a, **k):  # one ulp on one weight: the replay is not the twin's run any more
        out = real(self, *a, **k)
        with torch.no_grad():
            self.model.wte.weight[0, 0] = torch.nextafter(self.model.wte.weight[0, 0], torch.tensor(1.0))
        return out

    monkeypatch.setattr(Trainer, "advance", drifting)
    with pytest.raises(SeedlabError, match="replayed for unroll differs from the bank's twin at step"):
        attribute(tmp_path / "bank", estimators=["unroll"], progress=False)


def test_a_horizon_unroll_cannot_reach_is_one_line(tmp_path, design):
    from seedlab.attribution.estimators.attribute import twin_check
    from seedlab.attribution.estimators.registry import run
    from seedlab.attribution.bank.rundir import open_bank

    cfg, base = design(seeds=[0], horizons=[1, 3])
    run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    bank = open_bank(tmp_path / "bank")
    with pytest.raises(SeedlabError, match=r"^seed 0: unroll cannot reach step 8: the twin saved no weights there"):
        twin_check(bank, 0, [5, 8])
    t = Trainer(cfg.model_copy(update={"device": "cpu"}), bank.inputs.gcfg, 0, bank.inputs.corpus.train)
    t.load_state(bank.dir.prefix(0))
    x, y = bank.inputs.ordinary_batch(0)
    for h in (cfg.injection_step, cfg.steps + 1):
        with pytest.raises(SeedlabError, match="unroll: horizons must be after the injection step"):
            run("unroll", t.model, _case(bank, x, y), trainer=t, horizon=h)


def _case(bank, x, y):
    from seedlab.attribution.estimators.builtin import Case

    texts = {n: t.tokens for n, t in bank.inputs.candidates_of(0).items()}
    return Case.of(x, y, bank.cfg.injection_row, texts, texts, bank.inputs.pad_id)

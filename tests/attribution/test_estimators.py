"""The gradient estimators against real optimizer steps from the fork point, exact zeros for a
candidate equal to the replaced row, the registry's errors.

Measured here: two copies of the fork point take one real step, on the ordinary batch and on the
batch with the candidate in row ROW (the trainer's loss: masked CE sum / N, N = B·T fixed), and
Δ L_query = L_query(injected) − L_query(twin) is compared with the estimate."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seedlab.attribution.estimators.builtin import Case, Gradients
from seedlab.attribution.estimators.registry import ESTIMATORS, available, estimate, get_estimator, run
from seedlab.errors import SeedlabError
from seedlab.lm.batches import inject
from seedlab.measures.text import text_ce

pytestmark = pytest.mark.usefixtures("one_thread")
B, T, ROW = 16, 16, 3  # as in conftest.py


def _ce_sum(model, x, y, mask):
    """The trainer's masked CE sum, in float64 (the test's weights are float64)."""
    logits, _ = model(x)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
    return torch.where(mask.flatten(), ce, torch.zeros_like(ce)).sum()


def _measured(fork, optimizer: str, lr: float, grad_clip: float | None = None, weight: float = 1.0) -> np.ndarray:
    """[candidates × queries] of Δ L_query after one real step. ``weight`` w < 1 trains on
    Σ_rest ℓ + (1−w)·ℓ_r + w·ℓ_c (the swap scaled by w), and the difference is divided by w:
    its limit w → 0 is exactly what a first-order estimate predicts."""
    ones = torch.ones(B, T, dtype=torch.bool)
    rest = [i for i in range(B) if i != ROW]
    out = np.zeros((len(fork.candidates), len(fork.queries)))
    for i, ids in enumerate(fork.candidates.values()):
        losses = []
        for w in (0.0, weight):
            model, opt = fork.copy()
            if optimizer == "sgd":
                opt = torch.optim.SGD(model.parameters(), lr=lr)
            for group in opt.param_groups:
                group["lr"] = lr
            xp, yp, mp = inject(fork.x, fork.y, ROW, ids, 0)
            r = slice(ROW, ROW + 1)
            loss = (_ce_sum(model, fork.x[rest], fork.y[rest], ones[rest])
                    + (1 - w) * _ce_sum(model, fork.x[r], fork.y[r], ones[r])
                    + w * _ce_sum(model, xp[r], yp[r], mp[r])) / (B * T)
            opt.zero_grad()
            loss.backward()
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(list(model.parameters()), grad_clip)
            opt.step()
            losses.append([text_ce(model, q) for q in fork.queries.values()])
        out[i] = (np.array(losses[1]) - np.array(losses[0])) / weight
    return out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """Largest error relative to the largest measured effect."""
    return float(np.abs(a - b).max() / np.abs(b).max())


def _case(fork, candidates=None) -> Case:
    assert (fork.B, fork.T, fork.row) == (B, T, ROW)
    return Case.of(fork.x, fork.y, ROW, candidates or fork.candidates, fork.queries, 0)


def test_sgd_matches_a_real_sgd_step(fork):
    # plain torch.optim.SGD (no momentum, decay or clip), the real candidate rows (weight 1):
    # SGD is linear in the gradient, so only the O(lr²) curvature of L_query is left out.
    case = _case(fork)
    for lr in (1e-3, 1e-4):
        est = run("sgd", fork.model, case, lr=lr)
        assert _rel(est, _measured(fork, "sgd", lr)) < 1e-3 * (lr / 1e-4)  # observed 7e-5 at lr=1e-3, 7e-6 at 1e-4
    assert est[0, 0] < 0  # the candidate used as its own query: learnt, loss down
    # with the trainer's clipping active (0.1 < ‖g‖ ≈ 0.3) the step is no longer linear in the
    # swap: the first-order clip is checked on the swap scaled by 1e-3 (observed 5e-5)
    clipped = run("sgd", fork.model, case, lr=1e-4, grad_clip=0.1)
    assert _rel(clipped, _measured(fork, "sgd", 1e-4, 0.1, weight=1e-3)) < 1e-2
    assert _rel(est, clipped) > 0.1


@pytest.mark.parametrize("grad_clip", [None, 0.1])  # 0.1 < the gradient norm (~0.3): clipping active
def test_adam_linear_is_the_first_order_response_of_a_real_adamw_step(fork, grad_clip):
    # the trainer's fused AdamW from a state with nonzero moments (5 updates), lr 1e-5; the
    # swap scaled by w = 1e-3 so that what is left out (second order in the gradient change,
    # O(lr²)) is far below the tolerance: observed 1e-4 (no clip) and 7e-5 (clip) of the largest
    # effect, vs 1e-2 allowed. The second-moment term is first order: dropping it is off by 18%
    # (no clip) and 4% (clip) of the largest effect.
    case = _case(fork)
    measured = _measured(fork, "adam", 1e-5, grad_clip, weight=1e-3)
    est = run("adam-linear", fork.model, case, lr=1e-5, optimizer=fork.opt, grad_clip=grad_clip)
    assert _rel(est, measured) < 1e-2
    no_v = run("adam-linear", fork.model, case, lr=1e-5, optimizer=fork.opt, grad_clip=grad_clip, include_v=False)
    assert _rel(no_v, measured) > 2e-2


def test_adam_linear_with_the_whole_candidate_row(fork):
    # the real swap (w = 1): Adam is not linear in a one-row change of a 16-row batch (the
    # change is not small against √v̂ everywhere), so the first-order estimate is approximate:
    # observed 7.5% on the candidate's own loss, and 7.5% of the largest effect overall
    # (the exact-update ``adam``: test_estimators_literature.py).
    case = _case(fork)
    measured = _measured(fork, "adam", 1e-5)
    est = run("adam-linear", fork.model, case, lr=1e-5, optimizer=fork.opt)
    assert est[0, 0] == pytest.approx(measured[0, 0], rel=0.15)
    assert _rel(est, measured) < 0.2
    assert np.sign(est[0, 0]) == np.sign(measured[0, 0]) == -1


def test_a_candidate_equal_to_the_row_gives_exactly_zero_everywhere(fork):
    # every estimator of a case (unroll needs a bank's trainer: its own-row zero is in test_unroll.py)
    names = [n for n in available() if "trainer" not in ESTIMATORS[n].needs]
    if "kronfluence" in sys.modules or _importable("kronfluence"):
        assert {"ekfac", "kfac"} <= set(names)
    df = estimate(names, fork.model, fork.x, fork.y, ROW, {"own": fork.own(), **fork.candidates}, fork.queries, 0,
                  lr=1e-3, optimizer=fork.opt, grad_clip=0.1, checkpoints=[(fork.model.state_dict(), 1e-3)] * 2)
    assert set(df.estimator) == set(names)
    own = df[df.candidate == "own"]
    assert len(own) == len(names) * len(fork.queries)
    assert (own.estimate == 0.0).all()  # exactly
    same_length = (df.estimator == "length") & (df.candidate == "full")  # T + 1 tokens, as the row
    assert (df[same_length].estimate == 0.0).all()
    assert (df[(df.candidate != "own") & ~same_length].estimate != 0.0).all()


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def test_tracin_cp_is_sgd_at_one_checkpoint_and_sums_over_checkpoints(fork):
    case = _case(fork)
    sgd = run("sgd", fork.model, case, lr=1e-3)
    state = {k: v.clone() for k, v in fork.model.state_dict().items()}
    assert np.array_equal(run("tracin-cp", fork.model, case, checkpoints=[(state, 1e-3)]), sgd)
    two = run("tracin-cp", fork.model, case, checkpoints=[(state, 1e-3), (state, 2e-3)])
    np.testing.assert_allclose(two, 3 * sgd, rtol=1e-12)
    later = {k: v + 0.01 * torch.randn_like(v) for k, v in state.items()}
    moved = run("tracin-cp", fork.model, case, checkpoints=[(state, 1e-3), (later, 1e-3)])
    assert not np.allclose(moved, 2 * sgd)
    assert all(torch.equal(fork.model.state_dict()[k], v) for k, v in state.items())  # the model is untouched


def test_cosine_is_minus_the_cosine(fork):
    case = _case(fork)
    grads = Gradients(fork.model, case)
    cos = run("cosine", fork.model, case, grads=grads)
    gq, d = grads.query("short"), grads.swap("short")
    assert cos[0, 0] == pytest.approx(-float(gq @ d / (gq.norm() * d.norm())), rel=1e-12)
    assert cos[0, 0] < 0 and np.all(np.abs(cos) <= 1)


def test_swap_gradient_uses_the_fixed_denominator_and_the_masked_row(fork):
    # ∇ℓ_c − ∇ℓ_r = N·(∇L(injected batch) − ∇L(batch)) with the fixed N = B·T
    case = _case(fork)
    grads = Gradients(fork.model, case)
    params = list(fork.model.parameters())
    xp, yp, mp = inject(fork.x, fork.y, ROW, fork.candidates["short"], 0)

    def flat(x, y, m):
        g = torch.autograd.grad(_ce_sum(fork.model, x, y, m) / (B * T), params)
        return torch.cat([t.reshape(-1) for t in g]).double()

    direct = (flat(xp, yp, mp) - flat(fork.x, fork.y, torch.ones(B, T, dtype=torch.bool))) * (B * T)
    assert float((grads.swap("short") - direct).norm()) < 1e-6 * float(direct.norm())  # float32 CE in masked_ce_sum
    g = flat(fork.x, fork.y, torch.ones(B, T, dtype=torch.bool))
    assert float((grads.batch() - g).norm()) < 1e-6 * float(g.norm())


def test_estimate_frame(fork):
    df = estimate(["sgd", "cosine"], fork.model, fork.x, fork.y, ROW, list(fork.candidates.values()),
                  fork.queries, 0, lr=1e-3)
    assert list(df.columns) == ["estimator", "candidate", "query", "estimate", "unit", "horizon", "label"]
    assert len(df) == 2 * 2 * 2
    assert list(df.candidate.unique()) == ["0", "1"]
    assert set(df[df.estimator == "cosine"].unit) == {"cosine"}
    assert set(df[df.estimator == "sgd"].unit) == {"nats/token"} and set(df.label) == {"estimator"}


def test_errors(fork, monkeypatch):
    case = _case(fork)
    with pytest.raises(SeedlabError, match=r"^estimator: must be one of sgd, adam, .*got 'tracein'$"):
        get_estimator("tracein")
    monkeypatch.setitem(sys.modules, "kronfluence", None)  # as if it were not installed
    for name in ("ekfac", "kfac"):
        with pytest.raises(SeedlabError, match=r"needs kronfluence, which is not installed: install seedlab\[attribution\]"):
            get_estimator(name)
        with pytest.raises(SeedlabError, match="install seedlab"):
            estimate([name], fork.model, fork.x, fork.y, ROW, fork.candidates, fork.queries, 0)
    assert "ekfac" not in available() and "sgd" in available()
    with pytest.raises(SeedlabError, match="^estimator 'adam': needs lr=, optimizer=$"):
        run("adam", fork.model, case)
    with pytest.raises(SeedlabError, match="^options: must be among .*, got learning_rate$"):
        run("sgd", fork.model, case, learning_rate=1e-3)
    with pytest.raises(SeedlabError, match="AdamW"):
        run("adam", fork.model, case, lr=1e-3, optimizer=torch.optim.SGD(fork.model.parameters(), lr=1e-3))
    with pytest.raises(SeedlabError, match="not the model's"):
        _, opt = fork.copy()
        run("adam", fork.model, case, lr=1e-3, optimizer=opt)
    with pytest.raises(SeedlabError, match="query 'long'"):
        Case.of(fork.x, fork.y, ROW, fork.candidates, {"long": list(range(T + 2))}, 0)
    with pytest.raises(SeedlabError, match="row"):
        Case.of(fork.x, fork.y, B, fork.candidates, fork.queries, 0)
    assert set(ESTIMATORS) == {"sgd", "adam", "adam-linear", "tracin", "tracin-cp", "cosine", "adam-cosine", "ekfac",
                               "kfac", "trak", "unroll", "unroll-readout", "unroll-tangent", "metagrad", "metagrad-trunc",
                               "random", "loss", "gradnorm", "length"}
    assert {n for n, e in ESTIMATORS.items() if e.label == "baseline"} == {"random", "loss", "gradnorm", "length"}
    assert {n for n, e in ESTIMATORS.items() if e.label == "reference"} == {"unroll", "unroll-readout", "unroll-tangent",
                                                                         "metagrad"}
    assert {n for n, e in ESTIMATORS.items() if e.label == "variant"} == {"adam-linear", "tracin-cp", "metagrad-trunc"}

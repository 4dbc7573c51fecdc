"""The bf16 training path (folded weights cast once per step) against the reference forward and autocast."""

import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.shortcut.config import ModelConfig
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.optim import EnsembleAdamW
from seedlab.shortcut.train import Bf16Step, autocast, train_epoch

CONFIGS = [{}, {"layers": 1, "heads": 1, "act": "gelu"}, {"causal": True}, {"layer_norm": False}]


def _model(S=3, **kw):
    m = EnsembleTransformer(ModelConfig(**kw), S, vocab=10, length=5, n_classes=2)
    m.init_members(list(range(100, 100 + S)))
    with torch.no_grad():  # away from the init's unit gains and zero biases, so the fold has work to do
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return m


def _data(S=3, B=40):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 10, (S, B, 5), generator=g)
    return x, (x[..., 0] > x[..., 1]).long()


@pytest.mark.parametrize("kw", CONFIGS)
def test_folded_forward_is_the_forward(kw):
    """In fp32 the folded weights give the forward's logits (up to rounding: the fold reorders products)."""
    m = _model(**kw)
    x, _ = _data()
    with torch.no_grad():
        torch.testing.assert_close(m.forward_folded(x, m.folded_weights()), m(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw", CONFIGS)
def test_bf16_step_gradient_is_the_autocast_gradient(kw):
    """Bf16Step's gradient (two pieces, weights cast once) is autocast's to bf16 rounding: its distances to
    autocast's and to the fp32 gradient are of the size of autocast's own distance to fp32 (measured:
    0.7-1.5x and 0.7-1.1x; that distance is 0.7-8% of the gradient's norm)."""
    m = _model(**kw)
    x, y = _data()
    grad = lambda: torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in m.parameters()])

    def reference(precision):
        m.zero_grad()
        for sl in (slice(0, 25), slice(25, 40)):
            with autocast(x.device, precision):
                loss, _ = m.losses(x[:, sl], y[:, sl])
            (loss.sum() / 40).backward()
        return grad()

    fp32, amp = reference("fp32"), reference("bf16")
    m.zero_grad()
    step = Bf16Step(m)
    for sl in (slice(0, 25), slice(25, 40)):
        step.backward(x[:, sl], y[:, sl], 40)
    step.finish()
    new = grad()
    assert all(p.grad.dtype == torch.float32 for p in m.parameters() if p.grad is not None)
    bf16_noise = (amp - fp32).norm()
    assert 0 < bf16_noise < 0.1 * fp32.norm()
    assert (new - amp).norm() < 2 * bf16_noise
    assert (new - fp32).norm() < 1.5 * bf16_noise


def test_fp32_training_never_takes_the_bf16_path(monkeypatch):
    """fp32 steps run the reference forward alone (their bits are the studies' results)."""
    m = _model(S=2)
    x, y = _data(S=2)
    opt = EnsembleAdamW(m.parameters(), lr=[1e-3] * 2, weight_decay=[0.1] * 2, beta1=[0.9] * 2, beta2=[0.999] * 2, eps=[1e-8] * 2)

    def refuse(*a, **k):
        raise AssertionError("fp32 took the folded path")

    monkeypatch.setattr(EnsembleTransformer, "forward_folded", refuse)
    train_epoch(m, opt, x, y, batch_size=40, chunk=16, precision="fp32")
    with pytest.raises(AssertionError):
        train_epoch(m, opt, x, y, batch_size=40, chunk=16, precision="bf16")


def test_folded_forward_refuses_hooks():
    m = _model()
    x, _ = _data()
    with m.hooks([("blocks.0.hook_resid_pre", lambda t, n: t)]), pytest.raises(SeedlabError):
        m.forward_folded(x, m.folded_weights())

"""seedlab.lm.trainer: a fork continues exactly as the original would; the saved state restores
bitwise and a corrupted one is refused (a tiny GPT, a few steps)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.model import PRESETS
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes

GCFG = PRESETS["mini"].model_copy(update={"n_embd": 32, "block_size": 16})
PASSAGE = [5, 6, 7, 8, 9, 10]


@dataclass
class Settings:
    steps: int = 12
    batch_size: int = 4
    micro_batch: int | None = 2  # two micro-batches per update: the accumulation path too
    peak_lr: float = 1e-2
    min_lr: float = 1e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    device: str = "cpu"
    precision: str = "fp32"
    warmup_steps: int = 3


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, 256, size=4000).astype(np.uint16)


def _trainer(tokens, seed=1):
    return Trainer(Settings(), GCFG, seed, tokens)


def _state(t: Trainer) -> dict[str, str]:
    """Hashes of everything the next update depends on: weights and AdamW state."""
    hashes = {f"model.{k}": h for k, h in tensor_hashes(t.weights()).items()}
    for i, st in t.opt.state_dict()["state"].items():
        hashes |= {f"opt.{i}.{k}": h for k, h in tensor_hashes({k: torch.as_tensor(v) for k, v in st.items()}).items()}
    return hashes | {"step": str(t.step)}


def test_fork_continues_bitwise_like_the_original_and_is_independent(tokens):
    a = _trainer(tokens)
    for _ in range(3):
        a.advance()
    b = a.fork()
    assert _state(b) == _state(a) and b.model is not a.model and b.opt is not a.opt
    # the fork's optimizer updates the fork's parameters, not the original's
    assert all(p is q for p, q in zip(b.params, b.model.parameters()))
    assert {id(p) for g in b.opt.param_groups for p in g["params"]} == {id(p) for p in b.model.parameters()}
    la = [a.advance() for _ in range(3)]
    lb = [b.advance() for _ in range(3)]
    assert la == lb and _state(a) == _state(b)
    # an injected row changes the fork alone
    c = a.fork()
    before = _state(a)
    c.advance({2: PASSAGE}, pad_id=0)
    assert _state(a) == before and _state(c) != before
    a.advance()
    assert _state(a) != _state(c)


def test_save_load_state_round_trip_is_bitwise(tokens, tmp_path):
    a = _trainer(tokens)
    losses = [a.advance() for _ in range(4)]
    path = tmp_path / "state.safetensors"
    a.save_state(path, losses)
    weights_at_4 = tensor_hashes(a.weights())
    b = _trainer(tokens)  # a fresh trainer of the same seed, at step 0
    assert b.load_state(path) == losses
    assert _state(b) == _state(a) and b.step == 4
    assert [a.advance() for _ in range(3)] == [b.advance() for _ in range(3)]
    assert _state(a) == _state(b)
    # and against a manifest of the weights
    c = _trainer(tokens)
    c.load_state(path, manifest={"4": weights_at_4})
    assert c.step == 4


def test_a_corrupted_state_file_is_refused(tokens, tmp_path):
    a = _trainer(tokens)
    a.advance()
    path = tmp_path / "state.safetensors"
    a.save_state(path, [1.0])
    good = path.read_bytes()
    raw = bytearray(good)
    raw[-100] ^= 0x01  # a byte of tensor data
    path.write_bytes(bytes(raw))
    with pytest.raises(SeedlabError, match=r"state\.safetensors: tensor '.+' does not match its recorded SHA-256"):
        _trainer(tokens).load_state(path)
    path.write_bytes(good[: len(good) // 2])  # torn
    with pytest.raises(SeedlabError, match=r"state\.safetensors: not a readable checkpoint"):
        _trainer(tokens).load_state(path)
    # intact file, but its weights are not the ones the manifest recorded for that step
    path.write_bytes(good)
    other = tensor_hashes(_trainer(tokens, seed=2).weights())
    with pytest.raises(SeedlabError, match=r"weights at step 1 do not match manifest\.json"):
        _trainer(tokens).load_state(path, manifest={"1": other})


def _flat_grads(t: Trainer) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).double() for p in t.params])


def test_the_injected_batch_differs_from_the_ordinary_one_by_the_row_alone(tokens):
    """One denominator (B·T) for every condition: g(injected) − g(ordinary) is the gradient of
    (passage row's CE sum − ordinary row's CE sum) / (B·T), the other rows are not rescaled."""
    from seedlab.lm.batches import get_batch, inject
    from seedlab.lm.model import masked_ce_sum

    t = _trainer(tokens)
    for _ in range(2):
        t.advance()
    row = 1
    loss_plain = t.backward()
    g_plain = _flat_grads(t)
    loss_inj = t.backward({row: PASSAGE}, pad_id=0)
    g_inj = _flat_grads(t)
    x, y = get_batch(tokens, t.seed, t.step, 4, GCFG.block_size)
    xp, yp, mp = inject(x, y, row, PASSAGE, 0)
    n = x.numel()

    def row_sum_grad(xr, yr, mr):
        t.model.zero_grad(set_to_none=True)
        logits, _ = t.model(xr)
        loss = masked_ce_sum(logits, yr, mr)
        loss.backward()
        return _flat_grads(t), float(loss.detach())

    g_p, ce_p = row_sum_grad(xp[row : row + 1], yp[row : row + 1], mp[row : row + 1])
    g_r, ce_r = row_sum_grad(x[row : row + 1], y[row : row + 1], torch.ones_like(mp[:1]))
    want = (g_p - g_r) / n
    assert float((g_inj - g_plain - want).norm()) < 1e-5 * float(want.norm())
    assert loss_inj - loss_plain == pytest.approx((ce_p - ce_r) / n, rel=1e-4, abs=1e-7)
    # and a passage that is the ordinary row's own tokens changes nothing at all
    own = torch.cat([x[row], y[row, -1:]]).tolist()
    t.backward({row: own}, pad_id=0)
    assert torch.equal(_flat_grads(t), g_plain)


def test_adam_step_predicts_the_trainers_update(tokens):
    """lm.gradients.AdamStep (float64, clipping and bias corrections) reproduces the weight change
    of the trainer's fused AdamW step, weight decay aside, from a state with nonzero moments."""
    from seedlab.lm.gradients import AdamStep

    t = _trainer(tokens)
    for _ in range(4):
        t.advance()
    before = [p.detach().clone().double() for p in t.params]
    adam = AdamStep(t.opt, t.params, lr=t.lr, grad_clip=Settings.grad_clip)
    t.backward()
    g = _flat_grads(t)
    lr = t.lr
    t.advance()  # recomputes the same gradient, then steps
    decay = {id(p): grp["weight_decay"] for grp in t.opt.param_groups for p in grp["params"]}
    moved = torch.cat([(p.detach().double() - b * (1 - lr * decay[id(p)])).reshape(-1) for p, b in zip(t.params, before)])
    want = adam.update(g)
    assert float((moved - want).norm()) < 1e-4 * float(want.norm())
    assert not adam.delta(g, g).any()


def test_bf16_on_cpu_runs_the_forward_in_bf16_keeps_fp32_state_and_is_bitwise_reproducible(tokens):
    runs = []
    for precision in ("bf16", "bf16", "fp32"):
        t = Trainer(Settings(precision=precision), GCFG, 1, tokens)
        seen = []
        hook = t.model.blocks[0].mlp.c_fc.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o.dtype))
        for _ in range(4):
            t.advance({0: PASSAGE})
        hook.remove()
        assert seen[0] == (torch.bfloat16 if precision == "bf16" else torch.float32)  # autocast acts on CPU too
        assert all(v.dtype == torch.float32 for v in t.weights().values())  # master weights stay fp32
        runs.append(_state(t))
    assert runs[0] == runs[1]  # bf16 on one machine: the same bits
    assert runs[0] != runs[2]  # ... and not fp32's

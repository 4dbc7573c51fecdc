"""Per-row gradient deltas (lm/gradients.py): exact zero for a row's own tokens, equal to autograd
of the two batch losses (whole batch and micro-batched)."""

from types import SimpleNamespace

import pytest
import torch

from seedlab.corpus import load
from seedlab.lm.batches import get_batch, inject
from seedlab.lm.gradients import gradient_delta
from seedlab.lm.model import PRESETS, masked_ce_sum
from seedlab.lm.trainer import Trainer

FAB = "Gizmo Harrington kept a small workshop behind the old library, where he mended clocks."
ROW, STEP, B, T = 1, 2, 3, 128  # the replaced row, updates before the batch, rows, tokens per row


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(twins_inputs):
    return load(twins_inputs[0])


def _state(corpus, seed):
    """A mini GPT after STEP updates (the trainer, nanoGPT's defaults), and the batch of step STEP."""
    settings = SimpleNamespace(steps=3, batch_size=B, micro_batch=None, peak_lr=6e-4, min_lr=6e-5, weight_decay=0.1,
                               beta1=0.9, beta2=0.95, grad_clip=1.0, device="cpu", precision="fp32", warmup_steps=STEP)
    gcfg = PRESETS["mini"].model_copy(update={"vocab_size": corpus.vocab_size, "block_size": T})
    trainer = Trainer(settings, gcfg, seed, corpus.train)
    while trainer.step < STEP:
        trainer.advance()
    x, y = get_batch(corpus.train, seed, STEP, B, T)
    return trainer.model.eval(), x, y


def test_injecting_the_rows_own_tokens_changes_nothing(corpus):
    model, x, y = _state(corpus, 0)
    r = ROW
    own = torch.cat([x[r], y[r, -1:]])  # the ordinary row as a passage of block_size + 1 tokens
    d = gradient_delta(model, x, y, r, own.tolist(), corpus.eot_id)
    assert d.passage_targets == x.shape[1]
    assert d.norm == 0.0 and not d.vec.any()  # exactly, not approximately
    assert d.grad_norm == d.base_grad_norm > 0


def test_delta_equals_direct_autograd_of_the_two_batch_losses(corpus):
    model, x, y = _state(corpus, 1)
    ids = corpus.encode(FAB)
    params = list(model.parameters())

    def grad(xb, yb, mb):  # the whole batch at once: its masked CE sum over B·T (the trainer's loss)
        logits, _ = model(xb)
        loss = masked_ce_sum(logits, yb, mb) / xb.numel()
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).double()

    xp, yp, mp = inject(x, y, ROW, ids, corpus.eot_id)
    direct = grad(xp, yp, mp) - grad(x, y, torch.ones_like(mp))
    for micro in (None, 1):
        d = gradient_delta(model, x, y, ROW, ids, corpus.eot_id, micro_batch=micro)
        assert d.passage_targets == len(ids) - 1
        assert d.norm == pytest.approx(float(direct.norm()), rel=1e-4)
        assert float((d.vec - direct).norm()) < 1e-4 * float(direct.norm())


def test_pair_stats_compare_deltas_and_the_passages_own_row_gradients(corpus):
    from seedlab.lm.gradients import BatchGradients, pair_stats

    model, x, y = _state(corpus, 0)
    bg = BatchGradients(model, x, y, ROW)
    a = bg.delta(corpus.encode(FAB), corpus.eot_id)
    b = bg.delta(corpus.encode("Jimmie Nicol played the drums for the Beatles on their 1964 tour."), corpus.eot_id)
    same = pair_stats(a, a)
    assert same["rel_norm_diff"] == same["rel_vec_diff"] == same["row_rel_norm_diff"] == 0.0
    assert same["cosine"] == pytest.approx(1.0) and same["row_cosine"] == pytest.approx(1.0)
    st = pair_stats(a, b)
    assert st["row_cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(a.row_grad, b.row_grad, dim=0)))
    assert 0 < st["rel_norm_diff"] and -1 < st["row_cosine"] < 1
    # Δ = row_grad − the ordinary row's term, the same for both passages
    assert float(((a.vec - a.row_grad) - (b.vec - b.row_grad)).norm()) < 1e-12 * float(a.vec.norm())

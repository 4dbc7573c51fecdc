"""Shared by the shortcut tests: hand-built ensembles with known circuits, and a tiny trained run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from seedlab.shortcut.config import EnsembleConfig, ModelConfig
from seedlab.shortcut.model import EnsembleTransformer

VOCAB, LENGTH, S = 10, 5, 2
# residual dimensions of the hand-built model (d_model = 8, 2 heads of d_head = 4)
VAL, READ, POS0, PAR, OUT = 0, 1, 2, 3, 4


def _zero_model(n_classes: int = 2) -> EnsembleTransformer:
    cfg = ModelConfig(layers=1, heads=2, d_model=8, d_ff=4, layer_norm=False)
    model = EnsembleTransformer(cfg, S, VOCAB, LENGTH, n_classes)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def _hand_built(q_scale: float = 1.0) -> EnsembleTransformer:
    """Head 0 attends to large values and writes parity to the readout; head 1 attends to position 0.

    - W_E[v] = (v in VAL, v mod 2 in PAR); W_E[READ token] has 1 in READ; W_pos[0] has 1 in POS0.
    - head 0: key = VAL, query at the readout = q_scale * READ -> attends to the max value;
      value = PAR, output -> OUT; W_U reads OUT as (class 1 - class 0).
    - head 1: key = 10 * POS0, query = 10 * READ -> attends to position 0; W_O = 0.
    """
    m = _zero_model()
    a = m.blocks[0].attn
    with torch.no_grad():
        v = torch.arange(VOCAB, dtype=torch.float32)
        m.embed.W_E[:, :VOCAB, VAL] = v
        m.embed.W_E[:, :VOCAB, PAR] = v % 2
        m.embed.W_E[:, VOCAB, READ] = 1.0
        m.pos_embed.W_pos[:, 0, POS0] = 1.0
        a.W_K[:, 0, VAL, 0] = 1.0
        a.W_Q[:, 0, READ, 0] = q_scale
        a.W_V[:, 0, PAR, 0] = 1.0
        a.W_O[:, 0, 0, OUT] = 1.0
        a.W_K[:, 1, POS0, 0] = 10.0
        a.W_Q[:, 1, READ, 0] = 10.0
        m.unembed.W_U[:, OUT, 1] = 1.0
        m.unembed.W_U[:, OUT, 0] = -1.0
    return m


def _x(B: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (S, B, LENGTH), generator=g)


@pytest.fixture
def hand():
    """The hand-built circuits: ``hand.model(q_scale)``, ``hand.zero(n_classes)``, inputs ``hand.x(B, seed)``,
    and the sizes and residual dimensions they use."""
    return SimpleNamespace(VOCAB=VOCAB, LENGTH=LENGTH, S=S, VAL=VAL, READ=READ, POS0=POS0, PAR=PAR, OUT=OUT,
                           zero=_zero_model, model=_hand_built, x=_x)


@pytest.fixture
def tiny_run(tmp_path):
    """``tiny_run(checkpoints)``: a 2-member, 2-layer ensemble trained for 4 epochs into ``tmp_path``."""
    from seedlab.shortcut.train import train_ensemble

    def train(checkpoints: list[int]):
        cfg = EnsembleConfig.model_validate(
            {
                "model": {"layers": 2, "heads": 2, "d_model": 16, "d_ff": 32},
                "data": {"n_train": 128, "n_val": 32, "n_adv": 32, "vocab": 10},
                "train": {"epochs": 4, "eval_every": 2, "checkpoint_epochs": checkpoints},
                "members": {"task": ["sum2-max"], "ratio": [0.9], "seed": [0, 1]},
            }
        )
        train_ensemble(cfg, tmp_path, progress=False)
        return tmp_path

    return train

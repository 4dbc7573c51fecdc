"""A text's mean next-token cross-entropy under a model (nats/token): how well the model predicts a
passage, a query or an injected row, every target counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from seedlab.lm.model import GPT


@torch.no_grad()
@torch.no_grad()
def text_ce(model: GPT, ids: Sequence[int], *, dtype: torch.dtype = torch.float64) -> float:
    """Mean cross-entropy of ``ids[1:]`` given ``ids[:-1]`` (one row, every position), from the model's
    logits cast to ``dtype`` on the model's device, in eval mode (the model's mode is restored).

    ``dtype=torch.float32`` is the model's own loss (``GPT.forward`` with targets, bitwise: twins measure's
    passage CE); the default float64 is the attribution study's query loss L_query (its bank, estimators and
    measured effects all read it here). No gradient is taken."""
    t = torch.as_tensor(list(ids), dtype=torch.int64).reshape(1, -1)
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    try:
        logits, _ = model(t[:, :-1].to(device))
    finally:
        model.train(was)
    return float(F.cross_entropy(logits[0].to(dtype), t[0, 1:].to(device)))

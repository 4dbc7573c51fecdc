"""Deterministic data order and the injected row.

The batch of step ``t`` is a pure function of ``(seed, t)``: its row offsets come
from ``numpy.random.default_rng([seed, t])``, a fresh generator per step, so no
state is carried between steps — resuming at any step, or computing steps out of
order, gives the same batches, and twins of one seed see identical data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from seedlab.errors import SeedlabError


def batch_indices(seed: int, step: int, *, n_tokens: int, batch_size: int, block_size: int) -> np.ndarray:
    """Start offsets [batch_size] (int64) of step ``step``'s rows, uniform in
    ``0 .. n_tokens - block_size - 1`` (each row needs ``block_size + 1`` tokens)."""
    if seed < 0 or step < 0:
        raise SeedlabError(f"seed/step: must be >= 0, got seed={seed!r}, step={step!r}")
    if batch_size < 1:
        raise SeedlabError(f"batch_size: must be >= 1, got {batch_size!r}")
    if n_tokens < block_size + 1:
        raise SeedlabError(f"corpus: {n_tokens} tokens, a row needs block_size+1 = {block_size + 1}")
    rng = np.random.default_rng([int(seed), int(step)])
    return rng.integers(0, n_tokens - block_size, size=batch_size, dtype=np.int64)


def get_batch(
    tokens: np.ndarray,
    seed: int,
    step: int,
    batch_size: int,
    block_size: int,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) int64 [batch_size, block_size]: ``x = tokens[o:o+T]``, ``y = tokens[o+1:o+T+1]``."""
    offsets = batch_indices(seed, step, n_tokens=len(tokens), batch_size=batch_size, block_size=block_size)
    rows = np.stack([np.asarray(tokens[o : o + block_size + 1], dtype=np.int64) for o in offsets])
    xy = torch.from_numpy(rows)
    x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
    if device is not None:
        x, y = x.to(device), y.to(device)
    return x, y


def check_passage(n: int, block_size: int, name: str = "passage") -> None:
    """A passage of ``n`` tokens must give at least one target and fit one row (block_size + 1 tokens)."""
    if n > block_size + 1:
        raise SeedlabError(f"{name}: {n} tokens do not fit a row of block_size+1 = {block_size + 1}")
    if n < 2:
        raise SeedlabError(f"{name}: needs at least 2 tokens (one next-token target), got {n}")


def inject(
    x: torch.Tensor, y: torch.Tensor, row: int, passage_ids: Sequence[int] | np.ndarray | torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Replace row ``row`` with a passage; returns new (x, y, loss_mask), inputs untouched.

    The row becomes ``x = passage[:-1]`` and ``y = passage[1:]``, each followed by
    ``pad_id`` up to the block size; ``loss_mask`` [B, T] bool is False exactly on
    that padding (the passage's ``len - 1`` next-token targets count, the filler
    does not). Padding sits after the passage, so under causal attention it cannot
    change the passage's own predictions."""
    B, T = x.shape
    p = torch.as_tensor(np.asarray(passage_ids), dtype=torch.int64).reshape(-1)
    n = p.numel()
    check_passage(n, T)
    if not 0 <= row < B:
        raise SeedlabError(f"row: must be in 0 .. {B - 1}, got {row!r}")
    x, y = x.clone(), y.clone()
    mask = torch.ones(B, T, dtype=torch.bool, device=x.device)
    p = p.to(x.device)
    x[row] = pad_id
    y[row] = pad_id
    x[row, : n - 1] = p[:-1]
    y[row, : n - 1] = p[1:]
    mask[row, n - 1 :] = False
    return x, y, mask


def replaced(
    x: torch.Tensor, y: torch.Tensor, rows: Mapping[int, Sequence[int]] | None, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch (x, y) with every row of ``rows`` ({row: token ids}) replaced by its passage (:func:`inject`),
    and the loss mask over it (False exactly on the passages' padding); ``rows`` None: the batch as it is."""
    mask = torch.ones_like(x, dtype=torch.bool)
    for row, passage in (rows or {}).items():
        x, y, only = inject(x, y, row, passage, pad_id)
        mask &= only
    return x, y, mask

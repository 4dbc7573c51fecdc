"""Linear centered kernel alignment (Kornblith et al. 2019) between two representations ``X``
[n, d1] and ``Y`` [n, d2] of the same n examples. With column-centered ``Xc, Yc``:
``CKA = ||Ycᵀ Xc||_F² / (||Xcᵀ Xc||_F · ||Ycᵀ Yc||_F)`` in [0, 1]; invariant to orthogonal
transforms, isotropic scaling and translation of either side, 1 for identical ones.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from seedlab.errors import SeedlabError


@torch.no_grad()
def linear_cka(x: Tensor, y: Tensor) -> float:
    """Linear CKA of representations x [..., d1] and y [..., d2] (leading dims flattened to n examples).

    Computed in float64; nan when either side is constant over the examples (CKA undefined)."""
    x, y = x.reshape(-1, x.shape[-1]).double(), y.reshape(-1, y.shape[-1]).double()
    if x.shape[0] != y.shape[0]:
        raise SeedlabError(f"linear_cka: representations of different example counts: {x.shape[0]} vs {y.shape[0]}")
    x, y = x - x.mean(0), y - y.mean(0)  # center each feature over the examples
    hsic = torch.linalg.matrix_norm(y.T @ x) ** 2  # ||Ycᵀ Xc||_F²
    norm = torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)
    return float(hsic / norm) if norm > 0 else math.nan

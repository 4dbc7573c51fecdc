"""Weight matching of two GPTs (lm/model.py) by permuting MLP neurons and attention heads.

Two models trained from different seeds can compute nearly the same function in different
bases ("gauge freedom"), which inflates the Euclidean distance between their weights. One exact
part of that freedom is a permutation, per layer, of

- the MLP's hidden units: ``mlp.c_fc`` rows (and bias) with ``mlp.c_proj`` columns, since GELU
  acts on each unit alone;
- the attention heads as whole units: head h's q, k and v rows of ``attn.c_attn`` (and bias),
  i.e. rows ``h·d .. (h+1)·d − 1`` of each of the three C-row blocks (d = C / n_head), with the
  same d input columns of ``attn.c_proj``; each head attends on its own.

The residual stream basis is NOT permuted: it is shared through ``wte`` (also the output head),
``wpe``, every layer norm and every block's input and output, so leaving it fixed keeps the
function exactly (:func:`permute`). What changes is only the order of the terms that
``c_proj`` sums, so a permuted model's outputs equal the original's up to float rounding.

:func:`match` finds the permutations of ``other`` that best align it to ``reference``, Git
Re-Basin's weight matching (Ainsworth et al. 2023): per unit, the vector of every weight the
permutation moves with it (its incoming row, bias, and outgoing column); linear assignment
(``scipy.optimize.linear_sum_assignment``) maximises the summed inner product of matched units'
vectors. With the residual basis fixed, every parameter is moved by at most one permutation
(one layer's MLP or one layer's heads), so the permutations do not interact: each is matched
independently, in one pass, and the result is the exact minimum of the Euclidean distance over
all these permutations (Git Re-Basin alternates between layers because its permutations share
tensors; ours do not). Since ``‖a − Pb‖² = ‖a‖² + ‖b‖² − 2⟨a, Pb⟩``, maximising the inner
product is minimising the distance; the identity is one candidate, so the aligned distance is
never larger than the raw one (in exact arithmetic; :func:`match` returns the identity on ties).

Not matched (so the aligned distance still over-states the distance up to the full symmetry
group): within a head, any invertible map of the q/k dimensions (with its inverse transpose on
the other side) and of the v dimensions (undone by ``c_proj``), and continuous symmetries.

Similarities are computed in float64 on the CPU; the permuted tensors keep their dtype and device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from scipy.optimize import linear_sum_assignment

from seedlab.lm.model import GPTConfig

StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LayerPerm:
    """One block's permutations: new unit i is old unit ``perm[i]`` (int64, on the CPU)."""

    mlp: torch.Tensor  # [4C] hidden units of the MLP
    heads: torch.Tensor  # [n_head] attention heads


def identity(gcfg: GPTConfig) -> list[LayerPerm]:
    """The permutations that change nothing, one per block."""
    return [LayerPerm(torch.arange(4 * gcfg.n_embd), torch.arange(gcfg.n_head)) for _ in range(gcfg.n_layer)]


def head_rows(heads: torch.Tensor, gcfg: GPTConfig) -> torch.Tensor:
    """The indices of the C features grouped by head, in the order of ``heads``: [C]."""
    d = gcfg.n_embd // gcfg.n_head
    return (heads[:, None] * d + torch.arange(d)).reshape(-1)


def permute(state: StateDict, perms: list[LayerPerm], gcfg: GPTConfig) -> StateDict:
    """A new state dict: in each block l, MLP units and heads reordered by ``perms[l]``; the same function.

    Tensors no permutation touches (embeddings, layer norms, the output biases of ``c_proj``) are
    the input's own tensor objects; the others are new tensors (exact copies, reordered)."""
    if len(perms) != gcfg.n_layer:
        raise ValueError(f"permute: need {gcfg.n_layer} layer permutations, got {len(perms)}")
    C = gcfg.n_embd
    out = dict(state)
    for l, p in enumerate(perms):
        a, m = f"blocks.{l}.attn", f"blocks.{l}.mlp"
        rows = head_rows(p.heads, gcfg)
        qkv = torch.cat([rows, C + rows, 2 * C + rows])  # head h's q, k and v rows move together
        out[f"{a}.c_attn.weight"] = _take(state[f"{a}.c_attn.weight"], qkv, 0)
        out[f"{a}.c_proj.weight"] = _take(state[f"{a}.c_proj.weight"], rows, 1)
        out[f"{m}.c_fc.weight"] = _take(state[f"{m}.c_fc.weight"], p.mlp, 0)
        out[f"{m}.c_proj.weight"] = _take(state[f"{m}.c_proj.weight"], p.mlp, 1)
        if gcfg.bias:
            out[f"{a}.c_attn.bias"] = _take(state[f"{a}.c_attn.bias"], qkv, 0)
            out[f"{m}.c_fc.bias"] = _take(state[f"{m}.c_fc.bias"], p.mlp, 0)
    return out


def _take(t: torch.Tensor, idx: torch.Tensor, dim: int) -> torch.Tensor:
    return t.index_select(dim, idx.to(t.device))


def unit_vectors(state: StateDict, l: int, gcfg: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Block l's units as rows of everything a permutation moves with them (float64, CPU):
    MLP [4C, 2C(+1)] (c_fc row, bias, c_proj column) and heads [n_head, 4·d·C(+3d)] (q, k, v rows,
    their biases, the head's c_proj columns). ``‖rows of a − rows of b‖²`` summed is exactly those
    tensors' squared distance."""
    C, H = gcfg.n_embd, gcfg.n_head
    d = C // H
    get = lambda k: state[k].detach().to("cpu", torch.float64)
    a, m = f"blocks.{l}.attn", f"blocks.{l}.mlp"
    mlp = [get(f"{m}.c_fc.weight"), get(f"{m}.c_proj.weight").T]  # [4C, C] each
    heads = [get(f"{a}.c_attn.weight").reshape(3, H, d, C).transpose(0, 1).reshape(H, -1),  # [H, 3dC]
             get(f"{a}.c_proj.weight").reshape(C, H, d).transpose(0, 1).reshape(H, -1)]  # [H, Cd]
    if gcfg.bias:
        mlp.insert(1, get(f"{m}.c_fc.bias")[:, None])
        heads.insert(1, get(f"{a}.c_attn.bias").reshape(3, H, d).transpose(0, 1).reshape(H, -1))
    return torch.cat(mlp, 1), torch.cat(heads, 1)


def assign(ref: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """The permutation p maximising ``Σ_i ⟨ref[i], other[p[i]]⟩`` (linear assignment); the identity
    when it is no worse (ties)."""
    sim = (ref @ other.T).numpy()  # [n, n] float64
    _, cols = linear_sum_assignment(sim, maximize=True)
    if sim.trace() >= sim[range(len(cols)), cols].sum():
        return torch.arange(len(cols))
    return torch.as_tensor(cols, dtype=torch.int64)


def match(reference: StateDict, other: StateDict, gcfg: GPTConfig) -> list[LayerPerm]:
    """The permutations of ``other``'s MLP units and heads, per layer, that bring it closest to
    ``reference`` (``permute(other, match(...))``). The residual basis is fixed, so each layer's MLP
    and heads are matched independently in one pass, and the result is the exact optimum over all
    such permutations (see the module docstring)."""
    perms = []
    for l in range(gcfg.n_layer):
        (rm, rh), (om, oh) = unit_vectors(reference, l, gcfg), unit_vectors(other, l, gcfg)
        perms.append(LayerPerm(mlp=assign(rm, om), heads=assign(rh, oh)))
    return perms


def aligned(reference: StateDict, other: StateDict, gcfg: GPTConfig) -> StateDict:
    """``other`` with its MLP units and heads permuted to match ``reference``: the same function as ``other``."""
    return permute(other, match(reference, other, gcfg), gcfg)

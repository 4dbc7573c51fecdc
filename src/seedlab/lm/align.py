"""Weight matching of two GPTs (lm/model.py) by permuting the residual stream, MLP neurons and attention heads.

Two models trained from different seeds can compute nearly the same function in different
bases ("gauge freedom"), which inflates the Euclidean distance between their weights. One exact
part of that freedom is a permutation of

- the residual stream's C features, one permutation shared by the whole model: the columns of
  ``wte`` (also the output head) and ``wpe``, the gain and bias of every layer norm (``ln_1``,
  ``ln_2`` of every block, ``ln_f``), the input columns of every matrix that reads the stream
  (``attn.c_attn``, ``mlp.c_fc``) and the output rows and biases of every one that writes it
  (``attn.c_proj``, ``mlp.c_proj``). LayerNorm is permutation-equivariant (its mean and variance
  are sums over the features, its gain and bias act per feature), and the residual additions
  are too, so permuting all of these jointly keeps the logits;
- per layer, the MLP's hidden units: ``mlp.c_fc`` rows (and bias) with ``mlp.c_proj`` columns,
  since GELU acts on each unit alone;
- per layer, the attention heads as whole units: head h's q, k and v rows of ``attn.c_attn``
  (and bias), i.e. rows ``h·d .. (h+1)·d − 1`` of each of the three C-row blocks (d = C / n_head),
  with the same d input columns of ``attn.c_proj``; each head attends on its own.

:func:`permute` applies such a :class:`Perms`. Only the order of the terms that the matrices and
layer norms sum changes, so a permuted model's outputs equal the original's up to float rounding.

:func:`match` finds the permutations of ``other`` that best align it to ``reference``: Git Re-Basin's
weight matching (Ainsworth et al. 2023, "Git Re-Basin: Merging Models modulo Permutation
Symmetries", Algorithm 1), maximising ``⟨reference, permute(other)⟩`` summed over every tensor.
Since permutations keep norms, ``‖a − Pb‖² = ‖a‖² + ‖b‖² − 2⟨a, Pb⟩``: maximising the inner product
is minimising the distance. The residual permutation is shared by every layer, as the residual
connections force (Verma & Elbayad 2024, "Merging Text Transformer Models from Different
Initializations", share one residual permutation across all layers, found there from activation
correlations; Imfeld et al. 2024, "Transformer Fusion with Optimal Transport", likewise carry one
alignment of the residual stream through the model, with soft transport maps; we keep hard
permutations, which are exact symmetries). Every matrix is then moved by two permutations (the
residual one and a head or neuron one), so the permutations interact and there is no
closed-form joint optimum. As in Git Re-Basin, the problem is solved by coordinate descent: each
sweep visits the 2L + 1 permutations (the residual one, each layer's heads, each layer's
neurons) in a random order (seeded), and solves each by linear assignment
(``scipy.optimize.linear_sum_assignment``) with the others held fixed:

- a hidden unit's (a head's) vector is everything its permutation moves with it (its incoming
  row(s), bias, outgoing column(s)), read from ``other`` with its current residual permutation
  applied; the cost of pair (i, j) is ``⟨ref unit i, other unit j⟩``;
- residual feature i's vector is its slice of every tensor the residual permutation moves: the
  columns ``wte[:, i]``, ``wpe[:, i]``, the layer norms' ``weight[i]``, ``bias[i]``, the input columns
  ``c_attn.weight[:, i]``, ``c_fc.weight[:, i]`` and the output rows and biases
  ``c_proj.weight[i, :]``, ``c_proj.bias[i]`` of every block, read from ``other`` with its current
  head and neuron permutations applied (:func:`residual_vectors`). The cost of pair (i, j) is
  ``S_ij = Σ_tensors ⟨ref slice i, other slice j⟩``, and the assignment maximises ``Σ_i S_{i, π(i)}``.

A step is taken only when it raises the inner product by more than ``tol·‖a‖·‖b‖`` (ties keep the
current permutation), and the descent stops after a sweep in which no permutation improves: a
coordinate-wise optimum (each permutation optimal given the others), a local optimum of the joint
problem, not necessarily the global one; or after ``max_iter`` sweeps (:class:`Matching` says which).
The objective never decreases. It starts from the identity, and at the end the aligned squared
distance is compared with the raw one (the identity is kept unless the matched model is strictly
closer), so the aligned distance is never larger than the raw distance.

Not matched (so the aligned distance still over-states the distance up to the full symmetry
group): within a head, any invertible map of the q/k dimensions (with its inverse transpose on
the other side) and of the v dimensions (undone by ``c_proj``), and continuous symmetries. (The
residual stream has no larger exact group than permutations: LayerNorm's per-feature gain and its
mean over the features break rotations and per-feature sign flips.)

Similarities are computed in float64 on the CPU; the permuted tensors keep their dtype and device.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from scipy.optimize import linear_sum_assignment

from seedlab.lm.model import GPTConfig

StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True, eq=False)
class LayerPerm:
    """One block's permutations: new unit i is old unit ``perm[i]`` (int64, on the CPU)."""

    mlp: torch.Tensor  # [4C] hidden units of the MLP
    heads: torch.Tensor  # [n_head] attention heads


@dataclass(frozen=True, eq=False)
class Perms:
    """Every permutation :func:`permute` applies: new residual feature i is old feature ``residual[i]``
    (shared by the whole model), and one :class:`LayerPerm` per block."""

    residual: torch.Tensor  # [C] residual stream features
    layers: tuple[LayerPerm, ...]

    def inverse(self) -> Perms:
        """The permutations that undo these: ``permute(permute(s, p), p.inverse()) == s``."""
        return Perms(torch.argsort(self.residual), tuple(LayerPerm(torch.argsort(p.mlp), torch.argsort(p.heads))
                                                         for p in self.layers))

    def is_identity(self) -> bool:
        same = lambda t: torch.equal(t, torch.arange(len(t)))
        return same(self.residual) and all(same(p.mlp) and same(p.heads) for p in self.layers)


@dataclass(frozen=True, eq=False)
class Matching:
    """What :func:`match` found: ``perms``; ``iterations``, the sweeps run (the last one, when
    ``converged``, improved no permutation); ``converged``, False when ``max_iter`` sweeps all improved;
    ``objective``, ``Σ⟨reference, permute(other, ·)⟩`` (float64) at the identity and after every sweep
    (non-decreasing; the descent's own record, also when the final check fell back to the identity)."""

    perms: Perms
    iterations: int
    converged: bool
    objective: tuple[float, ...]


def identity(gcfg: GPTConfig) -> Perms:
    """The permutations that change nothing."""
    return Perms(torch.arange(gcfg.n_embd),
                 tuple(LayerPerm(torch.arange(4 * gcfg.n_embd), torch.arange(gcfg.n_head)) for _ in range(gcfg.n_layer)))


def head_rows(heads: torch.Tensor, gcfg: GPTConfig) -> torch.Tensor:
    """The indices of the C features grouped by head, in the order of ``heads``: [C]."""
    d = gcfg.n_embd // gcfg.n_head
    return (heads[:, None] * d + torch.arange(d)).reshape(-1)


def _take(t: torch.Tensor, idx: torch.Tensor, dim: int) -> torch.Tensor:
    return t.index_select(dim, idx.to(t.device))


def _ln_keys(gcfg: GPTConfig) -> list[str]:
    names = [f"blocks.{l}.{n}" for l in range(gcfg.n_layer) for n in ("ln_1", "ln_2")] + ["ln_f"]
    return [f"{n}.{p}" for n in names for p in (("weight", "bias") if gcfg.bias else ("weight",))]


def _permute_residual(state: StateDict, res: torch.Tensor, gcfg: GPTConfig) -> StateDict:
    """``state`` with its residual features reordered by ``res`` (only the tensors that carry them replaced)."""
    out = dict(state)
    for k in ("wte.weight", "wpe.weight"):
        out[k] = _take(state[k], res, 1)
    for k in _ln_keys(gcfg):
        out[k] = _take(state[k], res, 0)
    for l in range(gcfg.n_layer):
        a, m = f"blocks.{l}.attn", f"blocks.{l}.mlp"
        for k in (f"{a}.c_attn.weight", f"{m}.c_fc.weight"):  # read the stream: input columns
            out[k] = _take(state[k], res, 1)
        for k in (f"{a}.c_proj", f"{m}.c_proj"):  # write it: output rows and biases
            out[f"{k}.weight"] = _take(state[f"{k}.weight"], res, 0)
            if gcfg.bias:
                out[f"{k}.bias"] = _take(state[f"{k}.bias"], res, 0)
    return out


def _move_units(state: StateDict, into: str, out_of: str, rows: torch.Tensor, columns: torch.Tensor,
                gcfg: GPTConfig) -> StateDict:
    """Hidden units reordered: rows ``rows`` of the layer that writes them (``into``: weight and bias) and columns
    ``columns`` of the layer that reads them (``out_of``)."""
    out = dict(state)
    out[f"{into}.weight"] = _take(state[f"{into}.weight"], rows, 0)
    out[f"{out_of}.weight"] = _take(state[f"{out_of}.weight"], columns, 1)
    if gcfg.bias:
        out[f"{into}.bias"] = _take(state[f"{into}.bias"], rows, 0)
    return out


def _permute_heads(state: StateDict, l: int, heads: torch.Tensor, gcfg: GPTConfig) -> StateDict:
    C, a = gcfg.n_embd, f"blocks.{l}.attn"
    rows = head_rows(heads, gcfg)
    qkv = torch.cat([rows, C + rows, 2 * C + rows])  # head h's q, k and v rows move together
    return _move_units(state, f"{a}.c_attn", f"{a}.c_proj", qkv, rows, gcfg)


def _permute_mlp(state: StateDict, l: int, units: torch.Tensor, gcfg: GPTConfig) -> StateDict:
    m = f"blocks.{l}.mlp"
    return _move_units(state, f"{m}.c_fc", f"{m}.c_proj", units, units, gcfg)


def permute(state: StateDict, perms: Perms, gcfg: GPTConfig) -> StateDict:
    """A new state dict: residual features reordered by ``perms.residual`` and, in each block l, MLP units
    and heads by ``perms.layers[l]``; the same function.

    The three kinds act on different axes, so their order does not matter. Every tensor of the GPT is
    moved by some permutation; the result's tensors are new (exact copies, reordered)."""
    if not isinstance(perms, Perms):
        raise TypeError(f"permute: need a Perms (residual and per-layer permutations), got {type(perms).__name__}")
    if len(perms.layers) != gcfg.n_layer or len(perms.residual) != gcfg.n_embd:
        raise ValueError(f"permute: need {gcfg.n_layer} layer permutations and {gcfg.n_embd} residual features, "
                         f"got {len(perms.layers)} and {len(perms.residual)}")
    out = _permute_residual(state, perms.residual, gcfg)
    for l, p in enumerate(perms.layers):
        out = _permute_mlp(_permute_heads(out, l, p.heads, gcfg), l, p.mlp, gcfg)
    return out


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


def residual_vectors(state: StateDict, gcfg: GPTConfig) -> torch.Tensor:
    """The C residual features as rows of everything the residual permutation moves with them (float64,
    CPU): [C, V + T + (2L+1)(1+bias) + L·(3C + 4C + C + 4C + 2·bias)], i.e. ``wte[:, i]``, ``wpe[:, i]``, every
    layer norm's gain (and bias) i, and per block ``c_attn.weight[:, i]``, ``c_fc.weight[:, i]``,
    ``attn.c_proj.weight[i]`` (and bias), ``mlp.c_proj.weight[i]`` (and bias). ``‖rows of a − rows of b‖²``
    summed is exactly the squared distance of those tensors: all but the biases of c_attn and c_fc."""
    get = lambda k: state[k].detach().to("cpu", torch.float64)
    cols = [get("wte.weight").T, get("wpe.weight").T] + [get(k)[:, None] for k in _ln_keys(gcfg)]
    for l in range(gcfg.n_layer):
        a, m = f"blocks.{l}.attn", f"blocks.{l}.mlp"
        cols += [get(f"{a}.c_attn.weight").T, get(f"{m}.c_fc.weight").T]
        for k in (f"{a}.c_proj", f"{m}.c_proj"):
            cols.append(get(f"{k}.weight"))
            if gcfg.bias:
                cols.append(get(f"{k}.bias")[:, None])
    return torch.cat(cols, 1)


def _solve(sim: torch.Tensor, tol: float) -> tuple[torch.Tensor | None, float]:
    """Linear assignment on ``sim`` [n, n] (float64): the permutation p maximising ``Σ_i sim[i, p[i]]``
    and its gain over the identity; ``(None, 0.0)`` when that gain is not above ``tol``."""
    s = sim.numpy()
    _, cols = linear_sum_assignment(s, maximize=True)
    gain = float(s[range(len(cols)), cols].sum() - s.trace())
    if not gain > tol:
        return None, 0.0
    return torch.as_tensor(cols, dtype=torch.int64), gain


def assign(ref: torch.Tensor, other: torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """The permutation p maximising ``Σ_i ⟨ref[i], other[p[i]]⟩`` (linear assignment); the identity
    unless it is better by more than ``tol`` (ties keep the identity)."""
    p, _ = _solve(ref @ other.T, tol)
    return torch.arange(len(ref)) if p is None else p


def _inner(a: StateDict, b: StateDict) -> float:
    return float(sum((a[k] * b[k]).sum() for k in a))


def _sq_distance(a: StateDict, b: StateDict) -> float:
    return float(sum(((a[k] - b[k]) ** 2).sum() for k in a))


def match(reference: StateDict, other: StateDict, gcfg: GPTConfig, *, seed: int = 0, max_iter: int = 100,
          tol: float = 1e-12) -> Matching:
    """The permutations of ``other``'s residual features, heads and MLP units that bring it closest to
    ``reference`` (``permute(other, match(...).perms)``), by coordinate descent from the identity (see the
    module docstring): each sweep solves the 2L + 1 permutations in an order drawn from ``seed``, one at a
    time with the others fixed; a step must raise the inner product by more than ``tol·‖reference‖·‖other‖``.
    Stops after a sweep that improves nothing (``converged``) or after ``max_iter`` sweeps. Deterministic
    for a given seed. The identity is returned unless the result is strictly closer than it."""
    if max_iter < 1:
        raise ValueError(f"match: max_iter must be >= 1, got {max_iter}")
    ref = {k: v.detach().to("cpu", torch.float64) for k, v in reference.items()}
    raw = {k: v.detach().to("cpu", torch.float64) for k, v in other.items()}
    eps = tol * (_inner(ref, ref) * _inner(raw, raw)) ** 0.5
    L = gcfg.n_layer
    res = torch.arange(gcfg.n_embd)
    mlp, heads = [torch.arange(4 * gcfg.n_embd)] * L, [torch.arange(gcfg.n_head)] * L
    coords = [("residual", -1)] + [(kind, l) for l in range(L) for kind in ("heads", "mlp")]
    rng = random.Random(seed)
    ref_res = residual_vectors(ref, gcfg)
    ref_units = [unit_vectors(ref, l, gcfg) for l in range(L)]
    cur = raw  # permute(raw, current perms), kept up to date one permutation at a time
    objective = [_inner(ref, cur)]
    converged, it = False, 0
    while it < max_iter and not converged:
        it += 1
        improved = False
        for kind, l in rng.sample(coords, len(coords)):
            if kind == "residual":
                q, _ = _solve(ref_res @ residual_vectors(cur, gcfg).T, eps)
                if q is not None:
                    res, cur = res[q], _permute_residual(cur, q, gcfg)
            else:
                i = 0 if kind == "mlp" else 1
                q, _ = _solve(ref_units[l][i] @ unit_vectors(cur, l, gcfg)[i].T, eps)
                if q is not None and kind == "mlp":
                    mlp[l], cur = mlp[l][q], _permute_mlp(cur, l, q, gcfg)
                elif q is not None:
                    heads[l], cur = heads[l][q], _permute_heads(cur, l, q, gcfg)
            improved |= q is not None
        objective.append(_inner(ref, cur))
        converged = not improved
    perms = Perms(res, tuple(LayerPerm(m, h) for m, h in zip(mlp, heads)))
    if not perms.is_identity() and not _sq_distance(ref, cur) < _sq_distance(ref, raw):
        perms = identity(gcfg)  # float rounding only: the raw model is no farther than the matched one
    return Matching(perms, it, converged, tuple(objective))


def aligned(reference: StateDict, other: StateDict, gcfg: GPTConfig, *, seed: int = 0, max_iter: int = 100,
            tol: float = 1e-12) -> StateDict:
    """``other`` with its residual features, heads and MLP units permuted to match ``reference``
    (:func:`match`): the same function as ``other``, never farther from ``reference``."""
    return permute(other, match(reference, other, gcfg, seed=seed, max_iter=max_iter, tol=tol).perms, gcfg)

"""One language-model training run, advanced one optimizer update at a time.

A :class:`Trainer` holds a GPT and its AdamW and consumes the batch of ``(seed, step)``
(a pure function of the two, lm/batches.py) at every :meth:`~Trainer.advance`, optionally
with one row replaced by a given token sequence (the twins' injected passage). It saves and
restores its *complete* state (weights, AdamW moments and step counts, the losses so far)
with every tensor's SHA-256 checked, and :meth:`~Trainer.fork` copies it: the shared prefix
of a design is trained once and forked at the injection step.

What it needs from a study's config is :class:`Settings` (any object with those attributes:
the twins config is one). Under torchrun every rank runs the same trainer on its own rows of
each batch (lm/distributed.py).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import get_batch, inject, replaced
from seedlab.lm.distributed import World
from seedlab.lm.model import GPT, GPTConfig, masked_ce_sum
from seedlab.lm.schedule import lr_of
from seedlab.store import read_verified, tensor_hashes, write_safetensors

#: AdamW's per-parameter moments, as its state names them (:meth:`Trainer.moments`)
MOMENTS = ("exp_avg", "exp_avg_sq")

#: the attention kernels training may use on CUDA: all deterministic under
#: ``torch.use_deterministic_algorithms(True)`` (flash and memory-efficient then take their
#: deterministic backward; cuDNN attention has none, so it is left out)
SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def autocast(device: torch.device, precision: str):
    """bf16: ``torch.autocast`` to bfloat16 on ``device``'s type; fp32: nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def attention_kernels(device: torch.device):
    """On CUDA, only the attention kernels of :data:`SDPA_BACKENDS` (deterministic backward); elsewhere nothing."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, b) for b in SDPA_BACKENDS])


class Settings(Protocol):
    """The training hyperparameters a :class:`Trainer` reads (units in the twins config)."""

    steps: int  # optimizer updates of the whole run (the schedule's end unless decay_steps is set)
    batch_size: int  # rows per batch, over all ranks
    micro_batch: int | None  # rows per forward/backward on one rank; None: all of them
    peak_lr: float
    min_lr: float
    weight_decay: float  # on matrices and embeddings only (nanoGPT's grouping)
    beta1: float
    beta2: float
    grad_clip: float  # global gradient-norm clip
    device: str  # "auto", "cpu", "cuda", "cuda:N"
    precision: Literal["fp32", "bf16"]
    # optional: ``optimizer`` ("adamw", the default when absent, or "sgd": plain SGD, no momentum)
    # optional: ``decay_steps`` (the update count where the cosine reaches min_lr; absent or None: ``steps``)

    @property
    def warmup_steps(self) -> int: ...  # linear warm-up length (updates)


#: loss weights of replaced rows at one step ({row: w}; None or absent: 1)
Weights = Mapping[int, float] | None
#: rows of one step's batch removed from its loss (weight 0, no text: :meth:`Trainer.backward`); None or empty: none
Removed = Collection[int] | None


def without_rows(mask: torch.Tensor, removed: Removed, rows: Mapping[int, Sequence[int]] | None = None) -> torch.Tensor:
    """The loss mask [B, T] with every row of ``removed`` left out (False on the whole row): a removed row stays in
    the batch's forward, its loss weight is 0. A removed row that is also replaced (``rows``), or one the batch does
    not have, is a one-line error. ``removed`` empty: ``mask`` itself."""
    if not removed:
        return mask
    B = mask.shape[0]
    bad = next((r for r in sorted(removed) if not 0 <= r < B), None)
    if bad is not None:
        raise SeedlabError(f"removed rows: row {bad} is not in a batch of rows 0 .. {B - 1}")
    both = sorted(set(removed) & set(rows or {}))
    if both:
        raise SeedlabError(f"removed rows: row {both[0]} is both replaced and removed")
    mask = mask.clone()
    mask[sorted(removed)] = False
    return mask


def split_weighted(rows: Mapping[int, Sequence[int]] | None, weights: Weights
                   ) -> tuple[dict[int, Sequence[int]] | None, dict[int, tuple[Sequence[int], float]]]:
    """(rows replaced as they are, {row: (token ids, w)} of the rows with a weight w != 1)."""
    w = {r: float(v) for r, v in (weights or {}).items() if float(v) != 1.0}
    stray = sorted(set(w) - set(rows or {}))
    if stray:
        raise SeedlabError(f"row weights: row {stray[0]} has a weight but no passage")
    bad = next((v for v in w.values() if not 0 < v <= 1), None)
    if bad is not None:
        raise SeedlabError(f"row weights: a weight must lie in (0, 1], got {bad!r}")
    plain = {r: t for r, t in (rows or {}).items() if r not in w}
    return plain or None, {r: (rows[r], w[r]) for r in w}


@torch.no_grad()
def add_deltas(grads: Sequence[torch.Tensor], deltas: Sequence[torch.Tensor]) -> None:
    """``g += d`` in place for each pair, leaving ``g``'s bits where ``d`` is 0 (a sum with +0.0 would
    turn a -0.0 into +0.0: a passage equal to its row must leave the gradient exactly as it was)."""
    for g, d in zip(grads, deltas):
        g.copy_(torch.where(d == 0, g, g + d))


def add_gradient_delta(grads: Sequence[torch.Tensor], delta: Sequence[torch.Tensor]) -> None:
    """A gradient-channel perturbation added to the raw gradients (:func:`add_deltas`, each delta moved to its
    gradient's device and dtype first); one delta per gradient, else a one-line error."""
    if len(delta) != len(grads):
        raise SeedlabError(f"gradient delta: {len(delta)} tensors for {len(grads)} parameters")
    add_deltas(grads, [d.to(g.device, g.dtype) for g, d in zip(grads, delta)])


class Trainer:
    """One model + optimizer, advanced step by step on the (seed, step) batches of ``tokens``."""

    def __init__(self, cfg: Settings, gcfg: GPTConfig, seed: int, tokens: np.ndarray, world: World = World()):
        self.cfg, self.seed, self.tokens, self.world, self.step = cfg, seed, tokens, world, 0
        self.device = world.device(cfg.device)
        self.model = GPT(gcfg).to(self.device).init_from_seed(seed)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        kind = getattr(cfg, "optimizer", "adamw")  # a config without the field trains with AdamW
        if kind == "sgd":  # plain SGD (no momentum; the decay is torch's coupled L2 on the same group)
            self.opt: torch.optim.Optimizer = torch.optim.SGD(groups, lr=cfg.peak_lr)
        elif kind == "adamw":
            self.opt = torch.optim.AdamW(
                groups, lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2),
                fused=True,  # one kernel per step on CPU and GPU (nanoGPT's GPU choice); deterministic
            )
        else:
            raise SeedlabError(f"optimizer: must be adamw or sgd, got {kind!r}")
        self.params = list(self.model.parameters())

    def advance(self, rows: Mapping[int, Sequence[int]] | None = None, *, pad_id: int = 0,
                weights: Weights = None, grad_delta: Sequence[torch.Tensor] | None = None,
                removed: Removed = None) -> float:
        """One update on batch (seed, step) — with ``rows`` ({row: token ids}) replaced, each with its
        loss weight in ``weights`` ({row: w}, 1 where absent), the rows of ``removed`` left out of the loss,
        and ``grad_delta`` (one tensor per parameter, ``self.params``' order) added to the raw gradient — and
        its loss: :meth:`backward`, then gradient clipping and AdamW at this step's learning rate."""
        loss = self.backward(rows, pad_id=pad_id, weights=weights, grad_delta=grad_delta, removed=removed)
        lr = self.lr
        for g in self.opt.param_groups:
            g["lr"] = lr
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.opt.step()
        self.step += 1
        return loss

    @property
    def lr(self) -> float:
        """The learning rate of the next update (step ``self.step``; lm/schedule.py ``lr_of``)."""
        return lr_of(self.cfg, self.step)

    def backward(self, rows: Mapping[int, Sequence[int]] | None = None, *, pad_id: int = 0,
                 weights: Weights = None, grad_delta: Sequence[torch.Tensor] | None = None,
                 removed: Removed = None) -> float:
        """The raw gradient of batch (seed, step), with ``rows`` ({row: token ids}: a passage in each
        of those rows, lm/batches.py ``inject``) replaced, into every parameter's ``.grad`` (summed
        over ranks); returns the batch's loss. Nothing else changes.

        The loss is the masked CE *sum* over this rank's rows divided by ``N = B·T``, the
        target positions of the whole *ordinary* batch, for every batch: an injected passage
        shorter than a row leaves its padding out of the sum but not out of ``N``, so the
        injected batch's gradient differs from the ordinary one's by the row alone,
        ``(∇ℓ_passage − ∇ℓ_row) / N`` (lm/gradients.py), and the other rows' gradients are not
        rescaled. With gradients summed over ranks and micro-batches the update is that of the
        whole batch's loss however the rows are split. The returned loss is that same sum / N
        (for an ordinary batch: its mean CE per token).

        A row with a loss weight w < 1 in ``weights`` is not replaced in the batch: the ordinary
        batch's gradient is taken, and then :meth:`row_deltas` adds w·(∇ℓ_passage − ∇ℓ_row)/N, the
        gradient of (Σ_{i≠r} ℓ_i + (1 − w)·ℓ_row + w·ℓ_passage)/N (and w·(ℓ_passage − ℓ_row)/N to the
        loss), before the gradients are summed over ranks. w = 1 is the plain replacement above, bit
        for bit; a passage equal to the row it weighs leaves the run bitwise the ordinary one.

        A **removed** row (``removed``: rows of this batch) is the row's loss weight set to 0 with no text in its
        place: it stays in the batch's forward, its loss mask is False on the whole row (:func:`without_rows`), so
        the loss is Σ_{i∉removed} ℓ_i / N with N = B·T *unchanged* — not the mean of a batch of B − 1 rows, which
        would rescale every other row by B/(B − 1). That is w_i = 0 in (Σ_i w_i ℓ_i)/N, the parametrisation whose
        derivative at w = 1 attribution/estimators/metagrad.py computes (a removal is Δw = −1). No removal: the ordinary
        batch, bit for bit. A removed row cannot also be replaced.

        ``grad_delta`` (one tensor per parameter, ``self.params``' order; forks/arms.py's gradient-channel
        perturbations) is added to the raw gradient where a row's own difference enters it: after the
        batch's backward and the weighted rows, before the sum over ranks (on rank 0 only, so the summed
        gradient holds it once) and so before clipping and AdamW; the loss is unchanged. Where it is 0 the
        gradient keeps its bits (:func:`add_deltas`)."""
        cfg, block = self.cfg, self.model.config.block_size
        rows, weighted = split_weighted(rows, weights)
        x, y, mask = replaced(*get_batch(self.tokens, self.seed, self.step, cfg.batch_size, block), rows, pad_id)
        mask = without_rows(mask, removed, {**(rows or {}), **weighted})
        n = x.numel()  # N = B·T for every condition (see the docstring)
        mine = self.world.rows(cfg.batch_size)
        micro = cfg.micro_batch or (mine.stop - mine.start)
        self.opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for i in range(mine.start, mine.stop, micro):
            xs, ys, ms = (t[i : i + micro].to(self.device) for t in (x, y, mask))
            with autocast(self.device, cfg.precision), attention_kernels(self.device):
                logits, _ = self.model(xs)
            part = masked_ce_sum(logits, ys, ms) / n
            part.backward()
            total += part.detach()
        if weighted:
            deltas, dloss = self.row_deltas(weighted, pad_id=pad_id)
            add_deltas([p.grad for p in self.params], deltas)
            total = total + dloss
        if grad_delta is not None and self.world.main:
            add_gradient_delta([p.grad for p in self.params], grad_delta)
        self.world.all_reduce_grads(self.params)
        return self.world.sum(total)

    def row_deltas(self, weighted: Mapping[int, tuple[Sequence[int], float]], *, pad_id: int = 0
                   ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """What weighted rows add to the ordinary batch of this step: per parameter (``self.params``'
        order) Σ_r w_r·(∇ℓ_passage − ∇ℓ_row)/N, and Σ_r w_r·(ℓ_passage − ℓ_row)/N, for ``weighted``
        ({row: (token ids, w)}) on this rank's rows (zeros for rows of other ranks).

        Each row's two losses are taken one row at a time, by the same forward and backward: a
        passage equal to the row gives a difference of exactly 0."""
        cfg, block = self.cfg, self.model.config.block_size
        x, y = get_batch(self.tokens, self.seed, self.step, cfg.batch_size, block)
        n, mine = x.numel(), self.world.rows(cfg.batch_size)
        deltas = [torch.zeros_like(p) for p in self.params]
        dloss = torch.zeros((), device=self.device)
        for r, (passage, w) in sorted(weighted.items()):
            if not mine.start <= r < mine.stop:
                continue
            xr, yr = x[r : r + 1], y[r : r + 1]
            gc, lc = self._row_gradient(*inject(xr, yr, 0, passage, pad_id), n)
            go, lo = self._row_gradient(xr, yr, torch.ones_like(yr, dtype=torch.bool), n)
            for d, a, b in zip(deltas, gc, go):
                d += (a - b) * w
            dloss += (lc - lo) * w
        return deltas, dloss

    def _row_gradient(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, n: int
                      ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """∇(masked CE sum of one row / n) per parameter, and that loss (nothing else changes)."""
        x, y, mask = (t.to(self.device) for t in (x, y, mask))
        with autocast(self.device, self.cfg.precision), attention_kernels(self.device):
            logits, _ = self.model(x)
        loss = masked_ce_sum(logits, y, mask) / n
        return torch.autograd.grad(loss, self.params), loss.detach()

    def weights(self) -> dict[str, torch.Tensor]:
        """The model's state dict (tensor names = the checkpoint files' names)."""
        return self.model.state_dict()

    def moments(self) -> dict[str, dict[str, torch.Tensor]] | None:
        """AdamW's moments, ``{"exp_avg": {name: tensor}, "exp_avg_sq": {name: tensor}}`` per parameter (the model's
        parameter names; views into the optimizer's state: copy what you keep); None for an optimizer that keeps
        none (SGD) or before its first update."""
        states = [self.opt.state.get(p) for p in self.params]
        if not all(st and all(k in st for k in MOMENTS) for st in states):
            return None
        names = [n for n, _ in self.model.named_parameters()]
        return {k: {n: st[k] for n, st in zip(names, states)} for k in MOMENTS}

    def save_state(self, path: Path, losses: list[float]) -> None:
        """The complete training state (weights, AdamW moments and step counts, losses so far),
        with every tensor's SHA-256 in the file's metadata."""
        t = {f"model.{k}": v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        for i, st in self.opt.state_dict()["state"].items():
            for k, v in st.items():
                t[f"opt.{i}.{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).detach().cpu().contiguous()
        t["losses"] = torch.tensor(losses, dtype=torch.float64)
        write_safetensors(path, t, {"step": str(self.step)}, hashed=True)

    def load_state(self, path: Path, manifest: dict[str, dict[str, str]] | None = None) -> list[float]:
        """Restore a state file (its hashes checked; its weights also against ``manifest``)."""
        t, meta = read_verified(path)
        self.step = int(meta["step"])
        weights = {k[6:]: v for k, v in t.items() if k.startswith("model.")}
        if manifest is not None and str(self.step) in manifest and tensor_hashes(weights) != manifest[str(self.step)]:
            raise SeedlabError(f"{path}: its weights at step {self.step} do not match manifest.json (corrupted checkpoint)")
        self.model.load_state_dict(weights)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in t.items():
            if k.startswith("opt."):
                _, i, name = k.split(".", 2)
                state.setdefault(int(i), {})[name] = v
        self.opt.load_state_dict({"state": state, "param_groups": self.opt.state_dict()["param_groups"]})
        return t["losses"].tolist()

    def fork(self) -> Trainer:
        """A copy with its own model and optimizer state (deep-copied together, so the
        optimizer's references point at the copy's parameters)."""
        twin = copy.copy(self)
        twin.model, twin.opt = copy.deepcopy((self.model, self.opt))
        twin.params = list(twin.model.parameters())
        return twin

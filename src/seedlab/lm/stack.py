"""Runs as an axis: A training runs of one GPT shape and one schedule in one set of tensors.

A :class:`Stack` holds the weights and AdamW moments of A runs with a leading run axis (``[A, *shape]``
for every tensor of lm/model.py's GPT) and advances them together: each run on its own batch
(the ordinary batch of its seed and the step, with its own rows replaced), one batched matmul per
projection for all of them, one fused optimizer step, each run's gradient clipped by its own norm.
It is the hot path of a fork design (forks/loop.py), whose arms differ in one row of one batch and
otherwise share everything but their bits.

    x      = W_E[a][idx[a]] + W_pos[a]                  idx [A, B, T]      (one embedding lookup for all A)
    for each block:
        x  = x + c_proj(attn(LN_1(x)))                  every projection one baddbmm over the run axis
        x  = x + c_proj(gelu(c_fc(LN_2(x))))            attention: one SDPA over A·B sequences
    logits = LN_f(x) W_E[a]ᵀ                            the tied head, one bmm
    loss_a = masked CE sum of run a / (B·T)             lm/trainer.py ``Trainer.backward``'s loss, per run

**Bitwise the solo run.** Every op is chosen so that run a's numbers are those of lm/trainer.py's
``Trainer`` on the same run, bit for bit, on CPU in fp32 (tested: ``tests/lm/test_stack.py``): a
batched matmul of [A, n, k] by [A, k, m] is A gemms of the solo shape; the layer norms run per
run (one kernel per run: a layer norm with per-run gains is not bitwise the fused one); the loss is
each run's own sum; the clip is each run's own global norm; fused AdamW is elementwise. So a run
does not depend on its neighbours, its position or how many runs are stacked (the replica control
and the own-row control hold inside a stack), and a stack resumes from per-run state files written
in the solo format. On CUDA and in bf16 the kernels make no such promise: forks/loop.py compares
the stack with a solo run and records what it found.

A run leaves and enters the stack as a solo :class:`~seedlab.lm.trainer.Trainer`
(:meth:`Stack.member`, :meth:`Stack.put`): a perturbation, an observer's forward pass and a
checkpoint all see the solo object they would see in the serial loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from seedlab.errors import SeedlabError
from seedlab.lm.batches import get_batch, replaced
from seedlab.lm.model import GPTConfig
from seedlab.lm.schedule import lr_of
from seedlab.lm.trainer import (MOMENTS, Removed, Settings, Trainer, Weights, add_deltas, add_gradient_delta,
                                attention_kernels, autocast, split_weighted, without_rows)

Rows = Mapping[int, Sequence[int]] | None  # one run's replaced rows at a step ({row: token ids}; None: none)


class Stack:
    """A solo trainers' runs (same config, shape, device and step) stacked on a leading axis.

    ``Stack(trainers)`` copies their weights and optimizer state; the trainers are not used again."""

    def __init__(self, trainers: Sequence[Trainer], *, group_runs: int | None = None, head_runs: int | None = None):
        if not trainers:
            raise SeedlabError("stack: no runs to stack")
        first = trainers[0]
        self.cfg: Settings = first.cfg
        self.gcfg: GPTConfig = first.model.config
        self.tokens, self.device, self.world = first.tokens, first.device, first.world
        self.seeds = [t.seed for t in trainers]
        group, head = groups(first.device, first.cfg, self.gcfg, len(trainers))
        #: runs whose forward and backward run together (:meth:`_group`), the last group padded to it: a design
        #: passes one value for all its stacks, so every run of it is computed in groups of the same size
        self.group_runs = group_runs or min(group, len(trainers))
        #: runs whose logits are computed together (:meth:`_head`): by default a divisor of ``group_runs`` (no padding)
        self.head_runs = min(head_runs, self.group_runs) if head_runs else max(k for k in range(1, min(head, self.group_runs) + 1) if self.group_runs % k == 0)
        self.exact_ln = first.device.type == "cpu"  # per-run layer norms (bitwise the solo kernel) or one batched one (:func:`_ln`)
        self.step = first.step
        if self.world.size != 1:
            raise SeedlabError("stack: runs stack on one process only (under torchrun the arms run serially)")
        for t in trainers:
            if t.step != self.step or t.model.config != self.gcfg or t.cfg is not self.cfg or t.device != self.device:
                raise SeedlabError("stack: every run must have the same config, shape, device and step")
        self.names = [n for n, _ in first.model.named_parameters()]
        dims = {n: p.dim() for n, p in first.model.named_parameters()}
        #: the solo optimizer's parameter order (its state's indices): matrices and embeddings (decayed), then the rest
        self.opt_order = [n for n in self.names if dims[n] >= 2] + [n for n in self.names if dims[n] < 2]
        per = [dict(t.model.named_parameters()) for t in trainers]
        self.p = {n: torch.nn.Parameter(torch.stack([m[n].detach() for m in per])) for n in self.names}
        self.params = list(self.p.values())
        decay = [self.p[n] for n in self.opt_order if dims[n] >= 2]
        rest = [self.p[n] for n in self.opt_order if dims[n] < 2]
        self.opt = type(first.opt)([{"params": decay, "weight_decay": first.opt.param_groups[0]["weight_decay"]},
                                    {"params": rest, "weight_decay": 0.0}], **_defaults(first.opt))
        self._load_opt([t.opt.state_dict()["state"] for t in trainers])
        self._batches: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def size(self) -> int:
        """A: the runs stacked."""
        return len(self.seeds)

    def guarantee(self) -> dict:
        """What this stack promises of its runs' bits on the machine it runs on (the environment record
        names the machine): on a CPU in fp32, every run computed in groups of ``group_runs`` (the last
        padded) with head chunks of ``head_runs`` and its own layer norms, so its kernels and their shapes
        are the same at every position; elsewhere the kernels promise nothing and only the replica control
        and the solo check say what held."""
        exact = self.device.type == "cpu" and self.cfg.precision == "fp32"
        return {"group_runs": self.group_runs, "head_runs": self.head_runs,
                "layer_norm": "per run" if self.exact_ln else "one for all runs",
                "guarantee": ("the same kernels and shapes at every position (groups padded to one size)" if exact else
                              "none from the kernels (the replica control and the solo check record what held)")}

    # ------------------------------------------------------------------ state in and out
    def _load_opt(self, states: list[dict[int, dict[str, torch.Tensor]]]) -> None:
        """The solo optimizers' states (indexed in :attr:`opt_order`), stacked per tensor."""
        if not states[0]:
            if any(states):
                raise SeedlabError("stack: some runs have optimizer state and some none")
            return
        for j, n in enumerate(self.opt_order):
            st = {}
            for key in states[0][j]:
                parts = [s[j][key] for s in states]
                if key == "step":
                    if any(not torch.equal(parts[0], x) for x in parts):
                        raise SeedlabError("stack: every run must have taken the same number of optimizer steps")
                    st[key] = parts[0].clone()
                else:
                    st[key] = torch.stack(parts).to(self.device)
            self.opt.state[self.p[n]] = st

    def member(self, i: int) -> Trainer:
        """Run ``i`` as a solo trainer: a copy of its weights and optimizer state at this step."""
        solo = Trainer(self.cfg, self.gcfg, self.seeds[i], self.tokens, self.world)
        with torch.no_grad():
            for n, q in solo.model.named_parameters():
                q.copy_(self.p[n][i])
        state = {}
        for j, n in enumerate(self.opt_order):
            st = self.opt.state.get(self.p[n])
            if st:
                state[j] = {k: (v.clone() if k == "step" else v[i].clone()) for k, v in st.items()}
        if state:
            solo.opt.load_state_dict({"state": state, "param_groups": solo.opt.state_dict()["param_groups"]})
        solo.step = self.step
        return solo

    def weights(self, i: int) -> dict[str, torch.Tensor]:
        """Run ``i``'s weights (views into the stack: hash or copy them, do not keep them)."""
        return {n: self.p[n].detach()[i] for n in self.names}

    def moments(self, i: int) -> dict[str, dict[str, torch.Tensor]] | None:
        """Run ``i``'s AdamW moments as ``Trainer.moments`` gives a solo run's (views into the stack: copy what you
        keep); None for an optimizer that keeps none, or before the first update."""
        states = [self.opt.state.get(self.p[n]) for n in self.names]
        if not all(st and all(k in st for k in MOMENTS) for st in states):
            return None
        return {k: {n: st[k][i] for n, st in zip(self.names, states)} for k in MOMENTS}

    @torch.no_grad()
    def put(self, i: int, trainer: Trainer) -> None:
        """Run ``i``'s weights set to ``trainer``'s (after a perturbation); its optimizer state is kept."""
        for n, q in trainer.model.named_parameters():
            self.p[n][i].copy_(q.detach())

    # ------------------------------------------------------------------ training
    @property
    def lr(self) -> float:
        """The learning rate of the next update (every run's: one schedule)."""
        return lr_of(self.cfg, self.step)

    def advance(self, rows: Sequence[Rows], *, pad_id: int = 0, weights: Sequence[Weights] | None = None,
                grad_deltas: Sequence[Sequence[torch.Tensor] | None] | None = None,
                removed: Sequence[Removed] | None = None) -> list[float]:
        """One update of every run: run a on the batch of (its seed, this step) with ``rows[a]`` replaced
        (each row with its loss weight in ``weights[a]``, as ``Trainer.backward`` weighs it), the rows of
        ``removed[a]`` left out of its loss (as ``Trainer.backward`` removes them) and
        ``grad_deltas[a]`` (None: nothing; else one tensor per parameter, the solo model's ``parameters()``
        order) added to its raw gradient after the weighted rows, as ``Trainer.backward`` adds it; each run's
        gradient clipped by its own global norm, then one AdamW step. Returns each run's loss."""
        if len(rows) != self.size or (weights is not None and len(weights) != self.size) or (
                grad_deltas is not None and len(grad_deltas) != self.size) or (
                removed is not None and len(removed) != self.size):
            raise SeedlabError(f"stack: {len(rows)} runs' rows for a stack of {self.size}")
        split = [split_weighted(r, w) for r, w in zip(rows, weights or [None] * self.size)]
        # a weighted row's difference from the ordinary row, taken by the run's solo trainer before the update
        extra = {a: self.member(a).row_deltas(weighted, pad_id=pad_id) for a, (_, weighted) in enumerate(split) if weighted}
        gone = [None] * self.size if removed is None else list(removed)
        for (plain, weighted), r in zip(split, gone):  # refused before any run's gradient is touched
            without_rows(torch.ones(self.cfg.batch_size, 1, dtype=torch.bool), r, {**(plain or {}), **weighted})
        losses = self.backward([plain for plain, _ in split], pad_id=pad_id, removed=gone)
        for a, (deltas, dloss) in extra.items():
            add_deltas([self.p[n].grad[a] for n in self.names], deltas)  # names: the solo model's parameters() order
            losses[a] = float(torch.tensor(losses[a], dtype=torch.float32) + dloss.cpu())
        for a, delta in enumerate(grad_deltas or []):
            if delta is not None:  # where Trainer.backward adds it: after the weighted rows, before the clip
                add_gradient_delta([self.p[n].grad[a] for n in self.names], delta)
        for g in self.opt.param_groups:
            g["lr"] = self.lr
        self._clip()
        self.opt.step()
        self.step += 1
        self._batches.clear()
        return losses

    def backward(self, rows: Sequence[Rows], *, pad_id: int = 0, removed: Sequence[Removed] | None = None) -> list[float]:
        """Every run's raw gradient (as ``Trainer.backward``: the masked CE sum over the rows / B·T,
        micro-batch by micro-batch; ``removed[a]``: rows of run a left out of its loss) into the stacked
        ``.grad``; returns each run's loss."""
        T = self.gcfg.block_size
        batches = [replaced(*self._batch(seed), mine, pad_id) for seed, mine in zip(self.seeds, rows)]
        if removed is not None:
            batches = [(x, y, without_rows(m, r, mine)) for (x, y, m), r, mine in zip(batches, removed, rows)]
        x, y, mask = (torch.stack(t).to(self.device) for t in zip(*batches))  # [A, B, T]
        A, B = x.shape[:2]
        n = B * T
        for q in self.params:  # every run's slice is written by its group (:meth:`_group`): nothing to zero
            if q.grad is None:
                q.grad = torch.empty_like(q)
        losses = [self._group(c, x, y, mask, n) for c in range(0, A, self.group_runs)]
        return torch.cat(losses).tolist()

    def _group(self, first: int, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
        """Forward and backward of ``group_runs`` runs from ``first`` (their activations stay in cache),
        micro-batch by micro-batch, their gradients written into the stack's ``.grad``; returns their losses.
        A group past the stack's end is padded with copies of its last run (computed, then dropped), so
        every run's kernels see the same shapes whatever its position and the stack's size (:func:`_rows`)."""
        B, micro = x.shape[1], self.cfg.micro_batch or x.shape[1]
        real = min(self.group_runs, self.size - first)
        runs = _rows(first, real, self.group_runs)
        p = {k: v.detach()[runs].requires_grad_() for k, v in self.p.items()}  # this group's own leaves
        x, y, mask = x[runs], y[runs], mask[runs]
        wte, total = p["wte.weight"], 0
        for i in range(0, B, micro):
            table = wte.detach().requires_grad_()  # the embedding's use of the tied table: its gradient kept apart
            with autocast(self.device, self.cfg.precision), attention_kernels(self.device):
                h = self.trunk(x[:, i:i + micro], p | {"wte.weight": table})  # [runs, b, T, C]
            g_h, g_head, part = self._head(h.detach(), wte.detach(), y[:, i:i + micro], mask[:, i:i + micro], n)
            h.backward(g_h)
            g = g_head + table.grad  # as autograd sums a tied tensor's two uses (commutative: the same bits)
            if wte.grad is None:
                wte.grad = g
            else:
                wte.grad += g  # micro-batches accumulate as Trainer.backward's do
            total = total + part
        with torch.no_grad():
            for k, v in p.items():
                self.p[k].grad[first:first + real] = v.grad[:real]
        return total[:real]

    def _head(self, h: torch.Tensor, wte: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, n: int):
        """The tied head and the loss, forward and backward, ``head_runs`` runs at a time (their logits,
        [runs, b·T, vocab], the step's largest tensor, stay in cache). Returns the gradient of the runs'
        summed loss with respect to ``h`` and to the head's use of the token table, and each run's loss."""
        g_h, g_w, parts = [], [], []
        for c in range(0, h.shape[0], self.head_runs):
            real = min(self.head_runs, h.shape[0] - c)
            runs = _rows(c, real, self.head_runs)  # padded as :meth:`_group` pads
            hc, wc = h[runs].requires_grad_(), wte[runs].requires_grad_()
            with torch.enable_grad(), autocast(self.device, self.cfg.precision):
                logits = torch.bmm(hc.flatten(1, 2), wc.transpose(1, 2))  # [runs, b·T, V]
                part = _masked_ce_sums(logits, y[runs], mask[runs]) / n
            part.sum().backward()
            g_h.append(hc.grad[:real]), g_w.append(wc.grad[:real]), parts.append(part.detach()[:real])
        return torch.cat(g_h), torch.cat(g_w), torch.cat(parts)

    def _batch(self, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ordinary batch of (seed, this step), read once for every run of that seed."""
        key = (seed, self.step)
        if key not in self._batches:
            self._batches[key] = get_batch(self.tokens, seed, self.step, self.cfg.batch_size, self.gcfg.block_size)
        return self._batches[key]

    @torch.no_grad()
    def _clip(self) -> None:
        """``clip_grad_norm_`` per run: each run's global norm over its tensors, each run's coefficient."""
        grads = [self.p[n].grad for n in self.names]  # the order Trainer.advance clips them in (model.parameters())
        A = self.size
        norms = torch.stack([torch.linalg.vector_norm(g.reshape(A, -1), dim=1) for g in grads], dim=1)  # [A, tensors]
        total = torch.stack([torch.linalg.vector_norm(norms[a]) for a in range(A)])
        coef = torch.clamp(self.cfg.grad_clip / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.view(A, *([1] * (g.dim() - 1))))

    def trunk(self, idx: torch.Tensor, p: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """``idx`` [A, B, T] int64 -> the final layer norm's output [A, B, T, C]: run a's GPT on its rows
        up to the head (``p``: the runs' tensors, default the stack's own)."""
        A, B, T = idx.shape
        p, L, H = self.p if p is None else p, self.gcfg.n_layer, self.gcfg.n_head
        table = p["wte.weight"]
        V, C = table.shape[1:]
        offset = (torch.arange(A, device=idx.device) * V).view(A, 1, 1)
        x = F.embedding(idx + offset, table.reshape(A * V, C)) + p["wpe.weight"][:, None, :T]
        for l in range(L):
            b = f"blocks.{l}."
            h = _ln(p, x, b + "ln_1", self.exact_ln)
            q, k, v = _linear(p, h, b + "attn.c_attn").split(C, dim=-1)
            heads = lambda t: t.reshape(A * B, T, H, C // H).transpose(1, 2)  # [A·B, head, T, d_head]
            z = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
            x = x + _linear(p, z.transpose(1, 2).contiguous().view(A, B, T, C), b + "attn.c_proj")
            h = F.gelu(_linear(p, _ln(p, x, b + "ln_2", self.exact_ln), b + "mlp.c_fc"))
            x = x + _linear(p, h, b + "mlp.c_proj")
        return _ln(p, x, "ln_f", self.exact_ln)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx`` [A, B, T] int64 -> logits [A, B, T, vocab]: run a's GPT on its rows."""
        A, B, T = idx.shape
        h = self.trunk(idx)
        return torch.bmm(h.view(A, B * T, -1), self.p["wte.weight"].transpose(1, 2)).view(A, B, T, -1)



def _rows(first: int, real: int, size: int) -> slice | torch.Tensor:
    """The positions of a group of ``size`` runs from ``first`` of which ``real`` exist: a slice (a view)
    when the group is whole, else those runs and copies of the last one up to ``size``. A kernel's path may
    depend on how many runs it holds (a library gemm of one matrix can split its sum across threads where
    one of several does not: the replica alone in the last group of a stack once differed from its twin on
    an Intel Xeon at 2 threads), so no run is ever computed in a smaller group than its neighbours."""
    if real == size:
        return slice(first, first + size)
    return torch.tensor([*range(first, first + real)] + [first + real - 1] * (size - real))


def _linear(p: Mapping[str, torch.Tensor], x: torch.Tensor, name: str) -> torch.Tensor:
    """nn.Linear per run: [A, ..., in] -> [A, ..., out], one batched matmul (A gemms of the solo shape)."""
    A, W, bias = x.shape[0], p[name + ".weight"], p.get(name + ".bias")
    flat = x.reshape(A, -1, x.shape[-1])
    out = torch.bmm(flat, W.transpose(1, 2)) if bias is None else torch.baddbmm(bias.unsqueeze(1), flat, W.transpose(1, 2))
    return out.view(*x.shape[:-1], W.shape[1])


def _ln(p: Mapping[str, torch.Tensor], x: torch.Tensor, name: str, exact: bool = True) -> torch.Tensor:
    """nn.LayerNorm per run. ``exact``: one kernel per run, so each run's bits are its solo run's (a layer
    norm with per-run gains applied after is not bitwise the fused kernel); else (CUDA, where a kernel per
    run is a launch per run) one normalization for all runs, then each run's gain and bias: the same for
    every position of the axis, so runs in a stack still cannot differ by where they sit."""
    if not exact:
        w, b = p[name + ".weight"], p.get(name + ".bias")
        shape = (x.shape[0], *[1] * (x.dim() - 2), x.shape[-1])
        y = F.layer_norm(x, x.shape[-1:]) * w.view(shape)
        return y if b is None else y + b.view(shape)
    w, b = p[name + ".weight"].unbind(), p.get(name + ".bias")
    b = [None] * len(w) if b is None else b.unbind()  # unbind, not x[a]: one backward node, not A zero-filled copies
    return torch.stack([F.layer_norm(xa, xa.shape[-1:], wa, ba) for xa, wa, ba in zip(x.unbind(), w, b)])


def groups(device: torch.device, cfg: Settings, gcfg: GPTConfig, runs: int) -> tuple[int, int]:
    """(runs whose forward and backward run together, runs whose logits are computed together) in a stack of
    ``runs``. On a CPU, a few at a time keep the activations in cache: ~4,096 tokens through the blocks and
    ~1,024 through the head (the best of benchmarks/arm_axis.py's sizes for the bank's 512-token and the
    twins' 2,048-token batches); on a GPU every launch counts, so all at once."""
    if device.type != "cpu":
        return runs, runs
    tokens = (cfg.micro_batch or cfg.batch_size) * gcfg.block_size
    return max(1, 4096 // tokens), max(1, 1024 // tokens)


def _masked_ce_sums(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """lm/model.py ``masked_ce_sum`` of every run at once: [A, ..., V], [A, ...], [A, ...] -> [A]
    (one cross-entropy over every row; each run's sum over its own positions, bitwise its solo sum)."""
    A = logits.shape[0]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.flatten(), reduction="none")
    return torch.where(mask.flatten(), ce, torch.zeros_like(ce)).view(A, -1).sum(dim=1)


def _defaults(opt: torch.optim.Optimizer) -> dict:
    """The constructor arguments of a solo trainer's optimizer (lm/trainer.py), to build the stack's alike."""
    d = opt.defaults
    if isinstance(opt, torch.optim.AdamW):
        return {"lr": d["lr"], "betas": d["betas"], "fused": d.get("fused") or None}
    if isinstance(opt, torch.optim.SGD):
        return {"lr": d["lr"]}
    raise SeedlabError(f"stack: no stacked form of the optimizer {type(opt).__name__}")

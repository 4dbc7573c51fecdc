"""The baseline a researcher would write for the twins model: nanoGPT's ``train.py`` loop.

The same ``GPT`` (seeded with ``init_from_seed``), AdamW with nanoGPT's two param groups
(decay on tensors with dim >= 2), random batches drawn as nanoGPT's ``get_batch`` does
(``torch.randint`` offsets into the token array), ``logits, loss = model(x, y)``,
backward, clip, step, the learning rate set every step. No per-step loss readout (nanoGPT
reads ``loss.item()`` only every ``log_interval`` steps). Used only by benchmarks.

Two of nanoGPT's knobs, as a user would turn them:

- ``cfg.precision == "bf16"``: nanoGPT's ``ctx``, ``torch.autocast(device, dtype=torch.bfloat16)``
  around forward + loss; weights, gradients and AdamW stay fp32 (the master weights), and no
  GradScaler (bf16 has fp32's exponent range). nanoGPT's own ``ctx`` is a ``nullcontext`` on CPU;
  here autocast is on wherever bf16 is asked for, as in seedlab's ``Trainer``.
- ``micro``: rows per forward/backward, the batch's gradient accumulated over ``batch_size // micro``
  micro-batches (nanoGPT's ``gradient_accumulation_steps``, each micro-batch its own ``get_batch``
  and each loss divided by their number).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from seedlab.lm.model import GPT, GPTConfig
from seedlab.lm.schedule import lr_at


def get_batch(data: np.ndarray, batch_size: int, block_size: int, device: torch.device, generator: torch.Generator):
    """nanoGPT's get_batch: random offsets, one row per offset, pinned + non-blocking on CUDA."""
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


class PlainGPTLoop:
    """``step()`` = one nanoGPT training iteration; ``cfg`` is a TwinsConfig (lr schedule, AdamW, clip,
    precision); ``micro``: rows per micro-batch (None: the whole batch in one forward/backward)."""

    def __init__(self, cfg, gcfg: GPTConfig, seed: int, data: np.ndarray, device: torch.device, micro: int | None = None):
        self.cfg, self.data, self.device, self.it = cfg, data, device, 0
        self.block = gcfg.block_size
        self.micro = micro or cfg.batch_size
        if cfg.batch_size % self.micro:
            raise ValueError(f"micro: must divide batch_size {cfg.batch_size}, got {self.micro}")
        self.accum = cfg.batch_size // self.micro  # nanoGPT's gradient_accumulation_steps
        self.model = GPT(gcfg).to(device).init_from_seed(seed)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        nodecay = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": nodecay, "weight_decay": 0.0}]
        extra = {"fused": True} if device.type == "cuda" else {}  # as nanoGPT's configure_optimizers
        self.opt = torch.optim.AdamW(groups, lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2), **extra)
        bf16 = cfg.precision == "bf16"
        self.ctx = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        self.warmup = cfg.warmup or cfg.injection_step
        self.gen = torch.Generator().manual_seed(seed)
        self.x, self.y = get_batch(data, self.micro, self.block, device, self.gen)

    def step(self) -> torch.Tensor:
        """One update; returns the last micro-batch's mean loss (not read: no host sync)."""
        cfg = self.cfg
        lr = lr_at(self.it, peak_lr=cfg.peak_lr, warmup=self.warmup, total=cfg.steps, min_lr=cfg.min_lr,
                   decay=cfg.decay_steps)
        for g in self.opt.param_groups:
            g["lr"] = lr
        for _ in range(self.accum):
            with self.ctx:
                logits, loss = self.model(self.x, self.y)
            self.x, self.y = get_batch(self.data, self.micro, self.block, self.device, self.gen)  # prefetch
            (loss / self.accum).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.it += 1
        return loss.detach()

"""The baseline a researcher would write for the twins model: nanoGPT's ``train.py`` loop.

The same ``GPT`` (seeded with ``init_from_seed``), AdamW with nanoGPT's two param groups
(decay on tensors with dim >= 2), random batches drawn as nanoGPT's ``get_batch`` does
(``torch.randint`` offsets into the token array), ``logits, loss = model(x, y)``,
backward, clip, step, the learning rate set every step. No per-step loss readout (nanoGPT
reads ``loss.item()`` only every ``log_interval`` steps). Used only by benchmarks.
"""

from __future__ import annotations

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
    """``step()`` = one nanoGPT training iteration; ``cfg`` is a TwinsConfig (lr schedule, AdamW, clip)."""

    def __init__(self, cfg, gcfg: GPTConfig, seed: int, data: np.ndarray, device: torch.device):
        self.cfg, self.data, self.device, self.it = cfg, data, device, 0
        self.block = gcfg.block_size
        self.model = GPT(gcfg).to(device).init_from_seed(seed)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        nodecay = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": nodecay, "weight_decay": 0.0}]
        extra = {"fused": True} if device.type == "cuda" else {}  # as nanoGPT's configure_optimizers
        self.opt = torch.optim.AdamW(groups, lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2), **extra)
        self.warmup = cfg.warmup or cfg.injection_step
        self.gen = torch.Generator().manual_seed(seed)
        self.x, self.y = get_batch(data, cfg.batch_size, self.block, device, self.gen)

    def step(self) -> torch.Tensor:
        cfg = self.cfg
        lr = lr_at(self.it, peak_lr=cfg.peak_lr, warmup=self.warmup, total=cfg.steps, min_lr=cfg.min_lr)
        for g in self.opt.param_groups:
            g["lr"] = lr
        logits, loss = self.model(self.x, self.y)
        self.x, self.y = get_batch(self.data, cfg.batch_size, self.block, self.device, self.gen)  # prefetch
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.it += 1
        return loss.detach()  # not read: no host sync

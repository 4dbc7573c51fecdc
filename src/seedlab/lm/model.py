"""A GPT in the spirit of nanoGPT's ``model.py``: tied embeddings, learned positions, pre-LN.

State-dict keys are plain and stable (they become safetensors tensor names)::

    wte.weight  wpe.weight  ln_f.weight  ln_f.bias
    blocks.{l}.ln_1.*  blocks.{l}.attn.c_attn.*  blocks.{l}.attn.c_proj.*
    blocks.{l}.ln_2.*  blocks.{l}.mlp.c_fc.*     blocks.{l}.mlp.c_proj.*

The output head is ``wte.weight`` itself (no ``lm_head`` module), so no tensor is
stored twice and safetensors never sees shared storage.

Hook points (:class:`~seedlab.hooks.HookPoint`, parameter-free, so the keys above do not
change) carry TransformerLens's names, for ``run_with_hooks`` / ``run_with_cache``::

    hook_embed [B, T, d]  hook_pos_embed [T, d]  (the same for every row)
    blocks.{l}.hook_resid_pre   blocks.{l}.hook_attn_out   blocks.{l}.hook_resid_mid
    blocks.{l}.hook_mlp_out     blocks.{l}.hook_resid_post                        [B, T, d]
    blocks.{l}.attn.hook_q/hook_k/hook_v/hook_z                                   [B, T, head, d_head]
    blocks.{l}.mlp.hook_pre/hook_post                                             [B, T, 4d]
    ln_final.hook_normalized                                                      [B, T, d]

``hook_z`` is the attention output per head, before ``c_proj``. Attention runs in one
fused ``scaled_dot_product_attention`` call, which never forms the pattern: there is no
``hook_attn_scores`` / ``hook_pattern`` (and no ``hook_result``). The final layer norm's
parameters keep nanoGPT's name ``ln_f``; its output hook is TransformerLens's
``ln_final.hook_normalized``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from seedlab.hooks import HookedModule, HookPoint
from seedlab.lm.gptconfig import PRESETS, GPTConfig, param_count  # noqa: F401 (the model's shapes, torch-free)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v of all heads
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.hook_q, self.hook_k, self.hook_v, self.hook_z = HookPoint(), HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head)  # [B, T, head, d_head]
        q, k, v = self.hook_q(heads(q)), self.hook_k(heads(k)), self.hook_v(heads(v))
        p = self.dropout if self.training else 0.0
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, head, T, d_head]
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        z = self.hook_z(y.transpose(1, 2))  # [B, T, head, d_head]
        return self.resid_drop(self.c_proj(z.contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(self.hook_post(F.gelu(self.hook_pre(self.c_fc(x))))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint(), HookPoint()
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln_1(x))))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln_2(x))))


class _FinalNormHooks(nn.Module):
    """Holds ``hook_normalized`` under TransformerLens's name ``ln_final`` (the LN itself is ``ln_f``)."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_normalized = HookPoint()


class GPT(HookedModule):
    """``GPT(cfg, seed=None)``; with a seed the weights come from :meth:`init_from_seed`.

    Without one they are torch's defaults (global RNG): call ``init_from_seed`` before
    training. Build on ``torch.device("meta")`` to inspect shapes without memory."""

    def __init__(self, cfg: GPTConfig, seed: int | None = None):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token table, also the output head
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)  # learned positions
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.hook_embed, self.hook_pos_embed = HookPoint(), HookPoint()
        self.ln_final = _FinalNormHooks()
        if seed is not None:
            self.init_from_seed(seed)

    @torch.no_grad()
    def init_from_seed(self, seed: int) -> GPT:
        """nanoGPT's init, drawn on the CPU from ``torch.Generator().manual_seed(seed)`` in
        state-dict order, then copied to each parameter's device: the same seed gives
        bitwise-identical weights on any device. Weights ~ N(0, 0.02²), residual
        projections (``*.c_proj.weight``) ~ N(0, (0.02/√(2·n_layer))²), biases 0, LN gains 1."""
        g = torch.Generator(device="cpu").manual_seed(int(seed))
        proj_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                w = torch.normal(0.0, proj_std, p.shape, generator=g)
            elif name.endswith("weight") and p.dim() == 2:  # Linear and Embedding tables
                w = torch.normal(0.0, 0.02, p.shape, generator=g)
            elif ".ln_" in name or name.startswith("ln_"):
                w = torch.ones(p.shape) if name.endswith("weight") else torch.zeros(p.shape)
            else:  # Linear biases
                w = torch.zeros(p.shape)
            p.copy_(w.to(p.dtype))
        return self

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied table counted once); ``non_embedding`` drops ``wpe`` as nanoGPT does."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def residuals(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream after each block (``blocks.{l}.hook_resid_post``, detached), [B, T, d] each.

        One forward pass, read from its cache (the logits are computed too)."""
        names = [f"blocks.{l}.hook_resid_post" for l in range(self.config.n_layer)]
        _, cache = self.run_with_cache(idx, names)
        return [cache[n] for n in names]

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``idx`` [B, T] int64 -> (logits [B, T, vocab], loss or None).

        loss = mean cross-entropy (nats/token) over the target positions where
        ``loss_mask`` [B, T] is True; ``loss_mask=None`` counts every position."""
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens exceeds block_size={self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.hook_embed(self.wte(idx)) + self.hook_pos_embed(self.wpe(pos)))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_final.hook_normalized(self.ln_f(x)), self.wte.weight)  # tied output head
        if targets is None:
            return logits, None
        if loss_mask is None:
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        m = loss_mask.to(torch.bool)
        return logits, masked_ce_sum(logits, targets, m) / m.sum().clamp_min(1)


def masked_ce_sum(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the next-token cross-entropy (nats, fp32) over the positions where ``mask`` [B, T] is True.

    The twins trainer divides it by the targets of the *whole* batch, so that row splits over
    ranks and micro-batches give the whole batch's mean-loss update."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return torch.where(mask.flatten(), ce, torch.zeros_like(ce)).sum()

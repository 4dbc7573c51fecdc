"""The baseline a researcher would write: one nn.Module per seed, torch.optim.AdamW, a loop.

Same math as seedlab's ensemble member (pre-LN encoder, readout token last, ReLU MLP,
N(0, init_std) weights), written the ordinary way. Used only by benchmarks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, d_ff), nn.ReLU(), nn.Linear(d_ff, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, d))
        return x + self.mlp(self.ln2(x))


class PlainTransformer(nn.Module):
    def __init__(self, vocab: int, length: int, n_classes: int, layers: int = 2, heads: int = 2, d: int = 64, d_ff: int = 128, init_std: float = 0.02):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab + 1, d)
        self.pos = nn.Parameter(torch.zeros(length + 1, d))
        self.blocks = nn.ModuleList(Block(d, heads, d_ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, n_classes)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=init_std)
            elif "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = torch.cat([x, x.new_full((x.shape[0], 1), self.vocab)], 1)
        h = self.embed(tokens) + self.pos
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.ln_f(h[:, -1]))


def train_plain(seeds, x, y, epochs: int, lr: float = 1e-3, weight_decay: float = 0.1, **model_kw) -> list[PlainTransformer]:
    """Full-batch training, one seed after another: the reference loop."""
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = PlainTransformer(**model_kw)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        for _ in range(epochs):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        models.append(model)
    return models

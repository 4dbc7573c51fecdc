"""The GPT's shape as a config, and the shipped shapes: no torch, so configs and reports load without it
(the model itself: lm/model.py, which re-exports these names)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from seedlab.config import Strict

Pos = Annotated[int, Field(gt=0)]


class GPTConfig(Strict):
    """A GPT's shape (nanoGPT's GPT-2): what seedlab.lm.model.GPT builds."""

    n_layer: Pos = Field(description="transformer blocks")
    n_head: Pos = Field(description="attention heads per block (must divide n_embd)")
    n_embd: Pos = Field(description="residual width, in features")
    block_size: Pos = Field(description="context length, in tokens (rows are block_size tokens)")
    vocab_size: Pos = Field(description="token ids 0 .. vocab_size-1 (50304 = GPT-2's 50257 padded to a multiple of 64)")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(0.0, description="probability; keep 0 for bitwise-deterministic twins")
    bias: bool = Field(True, description="biases in Linear and LayerNorm (GPT-2: yes)")

    @model_validator(mode="after")
    def _heads_divide(self) -> GPTConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head: must divide n_embd={self.n_embd}, got {self.n_head}")
        return self


PRESETS: dict[str, GPTConfig] = {
    "gpt2-124m": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
    "mini": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=257),  # CPU seconds
    # mini at twice the width (d 128), the head width kept (32 features: 4 heads): the twins' scale axis
    # (preset twins/scale-wide-b64)
    "mini-wide": GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=257),
    # mini at twice the width (d 128) with mini's head count kept (2 heads, each 64 features wide): the width
    # alone, the heads fixed (preset twins/scale-wide-heads-b64)
    "mini-wide-heads": GPTConfig(n_layer=2, n_head=2, n_embd=128, block_size=64, vocab_size=257),
}


def param_count(cfg: GPTConfig, non_embedding: bool = False) -> int:
    """Parameters of ``GPT(cfg)`` computed from the config alone (no tensors allocated).

    ``non_embedding=True`` leaves out the position table, as nanoGPT's report does
    (the token table stays in: it is also the output head)."""
    d, b = cfg.n_embd, int(cfg.bias)
    ln = d + b * d
    block = 2 * ln + (d * 3 * d + b * 3 * d) + (d * d + b * d) + (d * 4 * d + b * 4 * d) + (4 * d * d + b * d)
    n = cfg.vocab_size * d + cfg.block_size * d + cfg.n_layer * block + ln
    return n - cfg.block_size * d if non_embedding else n

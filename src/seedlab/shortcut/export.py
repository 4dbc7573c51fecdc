"""Export one ensemble member to TransformerLens (``pip install 'seedlab[lens]'``).

Our parameter names and shapes are TransformerLens's (minus the member axis), so a
member's state dict loads into a ``HookedTransformer`` as it is. TransformerLens
unembeds every position; our classifier reads the last one (the readout token), so

    lens_logits(tokens)[:, -1] == our_logits(x)     with tokens = x followed by the readout token
"""

from __future__ import annotations

import warnings

import torch

from seedlab.errors import SeedlabError
from seedlab.shortcut.model import EnsembleTransformer


def to_hooked_transformer(model: EnsembleTransformer, member: int):
    """A ``transformer_lens.HookedTransformer`` computing member ``member``'s function."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        raise SeedlabError("export: TransformerLens is not installed (pip install 'seedlab[lens]')") from None
    c = model.cfg
    cfg = HookedTransformerConfig(
        n_layers=c.layers,
        d_model=c.d_model,
        n_ctx=model.length + 1,
        d_head=c.d_model // c.heads,
        n_heads=c.heads,
        d_mlp=c.d_ff,
        d_vocab=model.vocab + 1,
        d_vocab_out=model.n_classes,
        act_fn=c.act,
        normalization_type="LN" if c.layer_norm else None,
        attention_dir="causal" if c.causal else "bidirectional",
        positional_embedding_type="standard",
        default_prepend_bos=False,
        device="cpu",
    )
    with warnings.catch_warnings():  # 3.x warns that 4.0 drops HookedTransformer; we pin <4
        warnings.simplefilter("ignore", DeprecationWarning)
        lens = HookedTransformer(cfg)
    missing, unexpected = lens.load_state_dict(model.member_state(member), strict=False)
    params = {k for k, _ in lens.named_parameters()}
    if unexpected or params & set(missing):
        raise SeedlabError(f"export: weights do not map onto TransformerLens (missing {sorted(params & set(missing))[:3]})")
    return lens.eval()


def lens_tokens(model: EnsembleTransformer, x: torch.Tensor) -> torch.Tensor:
    """One member's inputs [B, length] -> TransformerLens tokens [B, length + 1] (readout token last)."""
    return torch.cat([x, x.new_full((x.shape[0], 1), model.vocab)], 1)

"""A member exported to TransformerLens computes the same logits."""

import pytest
import torch

from seedlab.shortcut.config import ModelConfig
from seedlab.shortcut.export import lens_tokens, to_hooked_transformer
from seedlab.shortcut.model import EnsembleTransformer

pytest.importorskip("transformer_lens")


@pytest.mark.parametrize("layers,heads,act,causal", [(1, 1, "relu", False), (2, 2, "gelu", False), (2, 2, "relu", True)])
def test_transformerlens_export_reproduces_logits(layers, heads, act, causal):
    m = EnsembleTransformer(ModelConfig(layers=layers, heads=heads, act=act, causal=causal, init_std=0.2), 3, 10, 5, 3)
    m.init_members([4, 5, 6])
    with torch.no_grad():  # non-trivial biases and LN parameters too
        for name, p in m.named_parameters():
            if not name.rsplit(".", 1)[-1].startswith("W_"):
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randint(0, 10, (3, 32, 5))
    ours = m(x)
    lens = to_hooked_transformer(m, 1)
    theirs = lens(lens_tokens(m, x[1]))[:, -1]
    torch.testing.assert_close(theirs, ours[1], atol=1e-5, rtol=1e-4)
    # and TransformerLens's own cache uses the same activation names
    _, cache = lens.run_with_cache(lens_tokens(m, x[1]))
    _, ours_cache = m.run_with_cache(x)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"], ours_cache["blocks.0.attn.hook_pattern"][1], atol=1e-5, rtol=1e-4)

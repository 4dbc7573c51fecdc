"""seedlab.lm.export: a GPT exported as a transformers GPT2LMHeadModel computes the same logits."""

from __future__ import annotations

import json

import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.export import to_hf
from seedlab.lm.model import GPT, PRESETS, GPTConfig

transformers = pytest.importorskip("transformers")

NO_BIAS = GPTConfig(n_layer=3, n_head=4, n_embd=32, block_size=64, vocab_size=257, bias=False)


def _perturbed(cfg: GPTConfig, seed: int) -> GPT:
    """Seeded init, then noise on every tensor so LN gains/biases are not 1/0 and biases not 0."""
    model = GPT(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def _load(folder):
    hf, info = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # still tied
    return hf.eval()


def _max_diff(model: GPT, hf, batch: int = 2, seed: int = 0) -> float:
    T = model.config.block_size
    idx = torch.randint(0, model.config.vocab_size, (batch, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ours, theirs = model(idx)[0], hf(idx).logits
    assert theirs.shape == ours.shape and theirs.dtype == torch.float32
    return (ours - theirs).abs().max().item()


@pytest.mark.parametrize("cfg", [PRESETS["mini"], NO_BIAS], ids=["mini", "no-bias"])
def test_export_matches_logits(cfg, tmp_path):
    model = _perturbed(cfg, seed=5)
    out = to_hf(model, tmp_path / "hf")
    assert out == tmp_path / "hf"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    conf = json.loads((out / "config.json").read_text())
    assert conf["activation_function"] == "gelu" and conf["n_positions"] == cfg.block_size
    assert conf["vocab_size"] == cfg.vocab_size and conf.get("tie_word_embeddings", True) is True  # 4.x omits defaults
    hf = _load(out)
    assert _max_diff(model, hf) < 1e-5
    # the default attention (sdpa) and the eager path agree too
    eager = transformers.GPT2LMHeadModel.from_pretrained(out, attn_implementation="eager").eval()
    assert _max_diff(model, eager, seed=1) < 1e-5


def test_export_is_not_trivially_equal():
    """Guard on the test itself: GPT-2's tanh GELU would differ, so the comparison has teeth."""
    from seedlab.lm.export import hf_config, hf_state_dict

    model = _perturbed(PRESETS["mini"], seed=5)
    hcfg = hf_config(model.config)
    hcfg.activation_function = "gelu_new"
    hf = transformers.GPT2LMHeadModel(hcfg).eval()
    hf.load_state_dict(hf_state_dict(model))
    assert _max_diff(model, hf) > 1e-5


def test_missing_transformers_is_one_line(monkeypatch, tmp_path):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(SeedlabError, match=r"pip install 'seedlab\[hf\]'"):
        to_hf(GPT(PRESETS["mini"], seed=0), tmp_path / "x")

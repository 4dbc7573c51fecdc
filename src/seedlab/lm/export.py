"""Export a seedlab GPT as a Hugging Face ``transformers`` GPT-2 folder.

``to_hf(model, out)`` writes ``out/config.json`` and ``out/model.safetensors`` (plus the
``generation_config.json`` that ``save_pretrained`` adds for a generative model); load it
anywhere ``transformers`` is installed (``pip install 'seedlab[hf]'``) with::

    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(out).eval()
    logits = model(idx).logits          # == seedlab's GPT(cfg)(idx)[0], float32, within ~1e-6

From a twins run: ``seedlab twins export DIR --seed K --out HF`` (the checkpoint is checked
against the run's manifest first). No tokenizer is written: the corpus folder holds it (``meta.json``,
``tokenizer.json`` for ``bpe``); pass ``eot_id`` to set ``bos``/``eos_token_id``.

The mapping is exact, not approximate: seedlab's GPT is GPT-2's architecture (pre-LN,
learned positions, tied head, LayerNorm eps 1e-5, attention scaled by 1/sqrt(head_dim))
except that its MLP uses the exact erf GELU, so the export sets
``activation_function="gelu"`` rather than GPT-2's tanh ``"gelu_new"``. HF's ``Conv1D``
stores weights as [in, out], the transpose of ``nn.Linear``'s; a ``bias=False`` model gets
zero biases (HF GPT-2 always has them), which computes the same function. Dropout
probabilities are all 0 in the export.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from seedlab.errors import SeedlabError
from seedlab.lm.model import GPT, GPTConfig

#: the files an export folder holds (save_pretrained also adds generation_config.json)
HF_FILES = ("config.json", "model.safetensors")
_NEED = "export needs transformers: pip install 'seedlab[hf]'"


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise SeedlabError(_NEED) from None
    return transformers


def hf_config(cfg: GPTConfig, eot_id: int | None = None, **extra: Any) -> Any:
    """The ``GPT2Config`` that computes what ``GPT(cfg)`` computes (``extra`` is stored in config.json)."""
    t = _transformers()
    return t.GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.block_size,
        n_ctx=cfg.block_size,  # not a GPT2Config argument any more; kept in config.json for old readers
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=4 * cfg.n_embd,
        activation_function="gelu",  # exact erf GELU, as F.gelu (GPT-2's own is the tanh "gelu_new")
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        scale_attn_weights=True,  # 1/sqrt(head_dim), as scaled_dot_product_attention
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        tie_word_embeddings=True,
        bos_token_id=eot_id,  # GPT2Config's default 50256 is outside a small vocabulary
        eos_token_id=eot_id,
        architectures=["GPT2LMHeadModel"],
        **extra,
    )


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """``model``'s weights under ``GPT2LMHeadModel``'s names (Linear weights transposed for Conv1D)."""
    cfg, sd = model.config, model.state_dict()
    out: dict[str, torch.Tensor] = {}

    def put(hf: str, ours: str, width: int, linear: bool = False) -> None:
        w = sd[ours + ".weight"]
        out[hf + ".weight"] = w.t().contiguous() if linear else w
        b = sd.get(ours + ".bias")
        out[hf + ".bias"] = b if b is not None else torch.zeros(width, dtype=w.dtype, device=w.device)

    d = cfg.n_embd
    out["transformer.wte.weight"] = sd["wte.weight"]
    out["transformer.wpe.weight"] = sd["wpe.weight"]
    for i in range(cfg.n_layer):
        h, b = f"transformer.h.{i}", f"blocks.{i}"
        put(f"{h}.ln_1", f"{b}.ln_1", d)
        put(f"{h}.attn.c_attn", f"{b}.attn.c_attn", 3 * d, linear=True)
        put(f"{h}.attn.c_proj", f"{b}.attn.c_proj", d, linear=True)
        put(f"{h}.ln_2", f"{b}.ln_2", d)
        put(f"{h}.mlp.c_fc", f"{b}.mlp.c_fc", 4 * d, linear=True)
        put(f"{h}.mlp.c_proj", f"{b}.mlp.c_proj", d, linear=True)
    put("transformer.ln_f", "ln_f", d)
    out["lm_head.weight"] = sd["wte.weight"]  # tied: the same tensor as transformer.wte.weight
    return out


def to_hf(model: GPT, out: str | Path, *, eot_id: int | None = None, metadata: dict[str, Any] | None = None) -> Path:
    """Write ``model`` as a ``GPT2LMHeadModel`` folder (``config.json`` + ``model.safetensors``); returns ``out``.

    ``metadata`` (e.g. a checkpoint's step / seed / condition) goes into config.json under
    ``"seedlab"``. Raises :class:`SeedlabError` if transformers is missing or a weight has
    no place in the HF model (strict: every HF parameter must be filled)."""
    t = _transformers()
    cfg = model.config
    extra = {"seedlab": dict(metadata)} if metadata else {}
    hcfg = hf_config(cfg, eot_id=eot_id, **extra)
    hf = t.GPT2LMHeadModel(hcfg).eval()  # real tensors: meta-built 4.x models keep meta mask buffers
    state = {k: v.detach().to("cpu", torch.float32) for k, v in hf_state_dict(model).items()}
    try:  # strict: every HF parameter filled, nothing left over (non-persistent buffers are not keys)
        hf.load_state_dict(state, strict=True)
    except RuntimeError as err:
        msg = " ".join(str(err).strip().splitlines()[:3])
        raise SeedlabError(f"export: weights do not map onto GPT2LMHeadModel ({msg})") from None
    if hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr():
        raise SeedlabError("export: lm_head is not tied to transformer.wte")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    bars = t.utils.logging.is_progress_bar_enabled()
    t.utils.logging.disable_progress_bar()  # 5.x draws a "Writing model shards" bar even for one file
    try:
        hf.save_pretrained(out)  # safetensors is the default (and, in 5.x, the only) format
    finally:
        if bars:
            t.utils.logging.enable_progress_bar()
    for w in out.glob("*.safetensors"):  # safetensors writes 0600; give the weights config.json's (umask) mode
        shutil.copymode(out / "config.json", w)
    return out

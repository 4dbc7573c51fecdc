"""``seedlab twins export``: one checkpoint of a twins run, hash-checked, as a Hugging Face
``GPT2LMHeadModel`` folder with the same logits (``pip install 'seedlab[hf]'``)."""

from __future__ import annotations

from pathlib import Path

from seedlab.lm.export import HF_FILES, to_hf
from seedlab.lm.model import GPT
from seedlab.store import refuse_overwrite
from seedlab.twins.rundir import open_run


def export_checkpoint(run: Path, out: Path, *, seed: int, condition: str, step: int | None = None, force: bool = False) -> int:
    """Write ``condition`` of ``seed`` after ``step`` updates (default: the final step) into ``out`` as
    config.json + model.safetensors; existing files are refused unless ``force``. Returns the step."""
    design = open_run(run)
    step = design.cfg.steps if step is None else step
    refuse_overwrite([out / name for name in HF_FILES], force)
    model = GPT(design.gcfg)
    model.load_state_dict(design.weights(seed, condition, step))
    to_hf(model, out, eot_id=design.corpus.eot_id, metadata={"run": str(run), "seed": seed, "condition": condition, "step": step})
    return step

"""A tiny GPT after a few real AdamW updates (nonzero moments), the batch of the next step,
candidates and queries: shared by the attribution tests (float64 weights, so that measured
loss differences of 1e-8 are far above round-off)."""

from __future__ import annotations

import copy
import gc
from dataclasses import dataclass

import pytest
import torch

from seedlab.lm.model import GPT, GPTConfig, masked_ce_sum

B, T, V = 16, 16, 64  # rows, tokens per row, vocabulary
ROW = 3  # the replaced row


@dataclass
class Fork:
    """The fork point: model at θ_s, its AdamW before step s, the batch of step s."""

    model: GPT
    opt: torch.optim.AdamW
    x: torch.Tensor
    y: torch.Tensor
    candidates: dict[str, list[int]]
    queries: dict[str, list[int]]
    B: int = B
    T: int = T
    row: int = ROW

    def own(self) -> list[int]:
        """The replaced row as a passage: the candidate that changes nothing."""
        return torch.cat([self.x[ROW], self.y[ROW, -1:]]).tolist()

    def copy(self) -> tuple[GPT, torch.optim.AdamW]:
        """A copy of model and optimizer (state deep-copied: load_state_dict would alias the tensors)."""
        model = copy.deepcopy(self.model)
        opt = adamw(model)
        opt.load_state_dict(copy.deepcopy(self.opt.state_dict()))
        return model, opt


@pytest.fixture(scope="module", autouse=True)
def _cheap_gc():
    """kronfluence runs gc.collect() ten times per analysis (~0.6 s each over the heap of a
    test session); objects frozen into the permanent generation are not traversed again."""
    gc.freeze()
    yield
    gc.unfreeze()


def adamw(model: GPT, lr: float = 1e-2) -> torch.optim.AdamW:
    """The trainer's optimizer: decay on matrices, fused AdamW, nanoGPT's betas."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), fused=True)


@pytest.fixture(scope="module")
def fork(one_thread) -> Fork:
    g = torch.Generator().manual_seed(1)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        r = torch.randint(0, V, (B, T + 1), generator=g)
        return r[:, :-1], r[:, 1:]

    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=T, vocab_size=V), seed=0).double()
    opt = adamw(model)
    for _ in range(5):
        x, y = batch()
        opt.zero_grad()
        (masked_ce_sum(model(x)[0], y, torch.ones_like(x, dtype=torch.bool)) / x.numel()).backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    x, y = batch()
    short = torch.randint(0, V, (9,), generator=g).tolist()  # 8 targets, padded and masked in its row
    full = torch.randint(0, V, (T + 1,), generator=g).tolist()
    other = torch.randint(0, V, (12,), generator=g).tolist()
    return Fork(model, opt, x, y, {"short": short, "full": full}, {"short": short, "other": other})


# --------------------------------------------------------------------------- a tiny bank (test_bank.py, test_report.py)

#: a bank small enough for seconds: GPT mini on 32-byte rows, 4 rows a batch, s = 4, 10 updates after it
TINY_BANK = {
    "model": "mini", "block_size": 32, "batch_size": 4, "steps": 14, "injection_step": 4, "seeds": [0, 1],
    "horizons": [1, 3, "mid", "end"], "peak_lr": 1e-2, "threads": 1,
    "candidates": {"file": "candidates.txt", "heldout": 3, "own_row": True},
    "queries": {"heldout": 2, "probes": "probes.jsonl"},
    "attribute": {"influence_at": "injection"},
}
TINY_PASSAGES = "Gizmo mends clocks.\n\nReturns a list of names.\n\nq8#Lm vP!2 zx&Rt\n"
TINY_PROBES = '{"name": "probe-gizmo", "text": "Gizmo mends a clock."}\n'


def write_design(folder, corpus, **over):
    """A bank config (TINY_BANK with ``over`` merged into it) and its passage files in ``folder``; returns the config's path."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "candidates.txt").write_text(TINY_PASSAGES)
    (folder / "probes.jsonl").write_text(TINY_PROBES)
    cfg = {**TINY_BANK, "corpus": str(corpus), **over}
    (folder / "design.yaml").write_text(yaml.safe_dump(cfg))
    return folder / "design.yaml"


@pytest.fixture(scope="session")
def tiny_bank(tmp_path_factory, twins_inputs):
    """TINY_BANK trained and attributed with every installed estimator (EK-FAC at θ_s). Returns the
    folder holding ``design.yaml``, its passage files and the bank ``bank/``. Read it, never change it."""
    from seedlab.attribution.estimators.attribute import attribute
    from seedlab.attribution.bank.run import run_bank
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.config import load_config

    before = torch.get_num_threads()
    base = tmp_path_factory.mktemp("bank")
    cfg, folder = load_config(AttributionConfig, "attribution", write_design(base, twins_inputs[0]))
    run_bank(cfg, base / "bank", base=folder, progress=False)
    gc.freeze()  # what training left on the heap: kronfluence's many gc.collect() calls need not walk it (_cheap_gc)
    attribute(base / "bank", progress=False)
    torch.set_num_threads(before)
    return base


@pytest.fixture
def design(bank_design, twins_inputs, tmp_path):
    """``design(**over)``: TINY_BANK with ``over``, its files in tmp_path: (config, its folder)."""
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.config import load_config

    def make(**over):
        return load_config(AttributionConfig, "attribution", bank_design.write(tmp_path, twins_inputs[0], **over))

    return make


@pytest.fixture(scope="session")
def bank_design():
    """``.config``: TINY_BANK; ``.write(folder, corpus, **over)``: write_design (conftest modules are not importable)."""
    from types import SimpleNamespace

    return SimpleNamespace(config=TINY_BANK, write=write_design)

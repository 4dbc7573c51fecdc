"""Shared by the shortcut tests: hand-built ensembles with known circuits, and a tiny trained run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from seedlab.shortcut.config import EnsembleConfig, ModelConfig
from seedlab.shortcut.model import EnsembleTransformer

VOCAB, LENGTH, S = 10, 5, 2
# residual dimensions of the hand-built model (d_model = 8, 2 heads of d_head = 4)
VAL, READ, POS0, PAR, OUT = 0, 1, 2, 3, 4


def _zero_model(n_classes: int = 2) -> EnsembleTransformer:
    cfg = ModelConfig(layers=1, heads=2, d_model=8, d_ff=4, layer_norm=False)
    model = EnsembleTransformer(cfg, S, VOCAB, LENGTH, n_classes)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def _hand_built(q_scale: float = 1.0) -> EnsembleTransformer:
    """Head 0 attends to large values and writes parity to the readout; head 1 attends to position 0.

    - W_E[v] = (v in VAL, v mod 2 in PAR); W_E[READ token] has 1 in READ; W_pos[0] has 1 in POS0.
    - head 0: key = VAL, query at the readout = q_scale * READ -> attends to the max value;
      value = PAR, output -> OUT; W_U reads OUT as (class 1 - class 0).
    - head 1: key = 10 * POS0, query = 10 * READ -> attends to position 0; W_O = 0.
    """
    m = _zero_model()
    a = m.blocks[0].attn
    with torch.no_grad():
        v = torch.arange(VOCAB, dtype=torch.float32)
        m.embed.W_E[:, :VOCAB, VAL] = v
        m.embed.W_E[:, :VOCAB, PAR] = v % 2
        m.embed.W_E[:, VOCAB, READ] = 1.0
        m.pos_embed.W_pos[:, 0, POS0] = 1.0
        a.W_K[:, 0, VAL, 0] = 1.0
        a.W_Q[:, 0, READ, 0] = q_scale
        a.W_V[:, 0, PAR, 0] = 1.0
        a.W_O[:, 0, 0, OUT] = 1.0
        a.W_K[:, 1, POS0, 0] = 10.0
        a.W_Q[:, 1, READ, 0] = 10.0
        m.unembed.W_U[:, OUT, 1] = 1.0
        m.unembed.W_U[:, OUT, 0] = -1.0
    return m


def _x(B: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (S, B, LENGTH), generator=g)


@pytest.fixture
def hand():
    """The hand-built circuits: ``hand.model(q_scale)``, ``hand.zero(n_classes)``, inputs ``hand.x(B, seed)``,
    and the sizes and residual dimensions they use."""
    return SimpleNamespace(VOCAB=VOCAB, LENGTH=LENGTH, S=S, VAL=VAL, READ=READ, POS0=POS0, PAR=PAR, OUT=OUT,
                           zero=_zero_model, model=_hand_built, x=_x)


@pytest.fixture
def tiny_run(tmp_path):
    """``tiny_run(checkpoints)``: a 2-member, 2-layer ensemble trained for 4 epochs into ``tmp_path``."""
    from seedlab.shortcut.train import train_ensemble

    def train(checkpoints: list[int]):
        cfg = EnsembleConfig.model_validate(
            {
                "model": {"layers": 2, "heads": 2, "d_model": 16, "d_ff": 32},
                "data": {"n_train": 128, "n_val": 32, "n_adv": 32, "vocab": 10},
                "train": {"epochs": 4, "eval_every": 2, "checkpoint_epochs": checkpoints},
                "members": {"task": ["sum2-max"], "ratio": [0.9], "seed": [0, 1]},
            }
        )
        train_ensemble(cfg, tmp_path, progress=False)
        return tmp_path

    return train


# ---------------------------------------------------------------- a whole sweep folder, synthetic (no training)

#: the demo's grid (Makefile `demo`: the preset quick with 8 seeds): (layers, ratio) -> members that generalize
DEMO_OUTCOMES = {(2, 0.5): 2, (2, 0.9): 3, (1, 0.5): 1, (1, 0.9): 1}


def write_demo_sweep(out, outcomes=None, *, seeds: int = 8, heads: int = 2, task: str = "sum2-max", wd: float = 0.1,
                     epochs: int = 300, eval_every: int = 10, checkpoints=(0, 50, 100, 200, 300), every: int = 50):
    """Every file ``seedlab shortcut report`` reads, shaped like the demo sweep's (the preset quick: sum2-max at
    r = 0.5 and 0.9, 1L and 2L with ``heads`` heads, ``seeds`` members per cell): sweep.yaml, summary, curves,
    gradients, gradients_heads, circuits and patching. ``outcomes[(layers, ratio)]``: how many of a cell's members
    generalize (:data:`DEMO_OUTCOMES` by default); member-level values are drawn from one seeded generator. Returns the
    summary."""
    import json

    import numpy as np
    import pandas as pd

    from seedlab.shortcut import analyze, gradients
    from seedlab.shortcut.interventions import DIRECTIONS, PATHS
    from seedlab.shortcut.pairs import KINDS
    from seedlab.shortcut.train import GENERALIZED

    rng = np.random.default_rng(0)
    outcomes = DEMO_OUTCOMES if outcomes is None else outcomes
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.yaml").write_text(
        f"data: {{length: 3, vocab: 32, n_train: 1024, n_val: 256, n_adv: 256}}\n"
        f"train: {{epochs: {epochs}, eval_every: {eval_every}, gradients: {{enabled: true, every: {every}}}}}\n")
    evals = np.arange(0, epochs + 1, eval_every)
    rows, curves, grads, per_head, circuits, patching = [], [], [], [], [], []
    member = 0
    for (layers, ratio), k in outcomes.items():
        for seed in range(seeds):
            gen = seed < k
            learned = int(rng.choice([20, 30, 40]))
            gen_epoch = int(learned + 10 * rng.integers(3, 20)) if gen else None
            kept = gen and seed % 3 != 2
            peak = 1.0 if gen else float(rng.uniform(0.2, 0.7))
            final = 1.0 if kept else (0.9 if gen else peak - 0.1)
            rows.append(dict(job=f"job-{layers}L", member=member, task=task, ratio=ratio, layers=layers, heads=heads,
                             weight_decay=wd, lr=3e-3, seed=seed, generalized=gen, gen_epoch=gen_epoch,
                             final_val_acc=1.0, final_adv_acc=final, retained=kept, final_train_acc=1.0,
                             final_train_loss=0.01, peak_adv_acc=peak, final_epoch=epochs, shortcut_epoch=learned,
                             phase2_epoch=gen_epoch - 30 if gen else None,
                             adv_prefix_max=256 if gen else int(rng.integers(0, 40))))
            for e in evals:
                val = min(1.0, e / learned)
                adv = 1.0 if gen and e >= gen_epoch and (kept or e < epochs) else min(peak, 0.1 + e / 600)
                curves += [(f"job-{layers}L", member, int(e), s, a, 1 - a) for s, a in (("train", val), ("val", val),
                                                                                        ("adv", adv))]
            for e in range(0, epochs + 1, every):
                dip = -0.5 if e else 0.3
                cos = dip * (0.3 if gen and e >= 200 else 1) + rng.normal(0, 0.05)
                loss = 0.5 if e == 0 else 0.01
                expected = ratio / (1 - ratio)
                grads.append(dict(member=member, epoch=e, cosine=cos, pair_cosine=0.2 * cos, norm_consistent=1.0,
                                  norm_anti=expected, share_consistent=ratio, share_anti=1 - ratio,
                                  per_example_ratio=expected * rng.uniform(0.5, 2), expected_ratio=expected,
                                  loss_consistent=loss, loss_anti=2.0, logit_grad_ratio=expected * rng.uniform(0.8, 2)))
                for layer in range(layers):
                    for head in range(heads):
                        own = (layer, head) == (0, 0)
                        c = cos if own else rng.normal(-0.05, 0.02)
                        per_head.append(dict(member=member, epoch=e, layer=layer, head=head, cosine=c, pair_cosine=c / 3))
            for e in checkpoints:
                for layer in range(layers):
                    for head in (*range(heads), -1):
                        own = (layer, head) == (0, 0)
                        values = {c: float(rng.uniform(-0.3, 0.3)) for c in analyze.COLUMNS[4:]}
                        values |= dict(qk_rho_value=0.9 if own and e else 0.1, attn_pos0=0.1, probe_rows=512.0,
                                       probe_sum=rng.uniform(0.5, 1), probe_sum_chance=0.5, probe_shortcut_chance=0.5)
                        if head == -1:
                            values |= {c: np.nan for c in ("qk_rho_value", "attn_pos0", "qk_w_rho_value", "qk_w_pos0",
                                                           "ov_rho_residue", "qk_uniform_ablation_val",
                                                           "qk_uniform_ablation_adv", "qk_mean_ablation_val",
                                                           "qk_mean_ablation_adv", "ov_mean_ablation_val",
                                                           "ov_mean_ablation_adv")}
                        circuits.append(dict(member=member, epoch=e, layer=layer, head=head, **values))
                        for kind in KINDS:
                            for path in PATHS:
                                for direction in DIRECTIONS:
                                    q = np.sort(rng.uniform(-0.2, 1, 5))
                                    patching.append(dict(
                                        member=member, epoch=e, layer=layer, head=head, pairs=kind, path=path,
                                        direction=direction, n_pairs=64, n_small_gap=int(rng.integers(0, 8)),
                                        **{f"frac_q{p}": v for p, v in zip(("10", "25", "50", "75", "90"), q)},
                                        frac_mean=q.mean(), frac_ratio_of_means=q.mean(), dld_q25=q[1], dld_q50=q[2],
                                        dld_q75=q[3], gap_q50=2.0, ld_clean_q50=1.0, ld_corrupt_q50=-1.0))
            member += 1
    summary = pd.DataFrame(rows)
    for c in ("gen_epoch", "phase2_epoch"):
        summary[c] = summary[c].astype("Int64")
    summary.to_parquet(out / "summary.parquet", index=False)
    for job in summary["job"].unique():  # what generalized meant when the jobs trained
        (out / "jobs" / job).mkdir(parents=True, exist_ok=True)
        (out / "jobs" / job / "meta.json").write_text(json.dumps({"generalized": GENERALIZED}))
    pd.DataFrame(curves, columns=["job", "member", "epoch", "split", "acc", "loss"]).to_parquet(out / "curves.parquet")
    pd.DataFrame(grads, columns=gradients.COLUMNS).to_parquet(out / "gradients.parquet", index=False)
    pd.DataFrame(per_head, columns=gradients.HEAD_COLUMNS).to_parquet(out / "gradients_heads.parquet", index=False)
    pd.DataFrame(circuits)[analyze.COLUMNS].to_parquet(out / "circuits.parquet", index=False)
    pd.DataFrame(patching)[analyze.PATCHING_COLUMNS].to_parquet(out / "patching.parquet", index=False)
    return summary


@pytest.fixture
def demo_sweep(tmp_path):
    """``demo_sweep(outcomes=None, **kw)``: :func:`write_demo_sweep` into ``tmp_path / "sweep"``; returns the folder."""

    def write(outcomes=None, **kw):
        write_demo_sweep(tmp_path / "sweep", outcomes, **kw)
        return tmp_path / "sweep"

    return write


@pytest.fixture(scope="session")
def demo_sweep_writer():
    """:func:`write_demo_sweep` itself, for fixtures of a wider scope than ``demo_sweep``'s."""
    return write_demo_sweep

"""Every circuit measure of every checkpoint of a run or sweep folder -> ``circuits.parquet`` and ``patching.parquet``.

``circuits.parquet``: one row per (member, epoch, layer, head): head 0..H-1 are the attention
heads, head = -1 is the layer's MLP. Columns (:data:`COLUMNS`):

- fingerprints (:mod:`seedlab.shortcut.fingerprints`, nan on MLP rows except the probes):
  ``qk_rho_value``, ``attn_pos0`` (activation-based QK, on the data), ``qk_w_rho_value``,
  ``qk_w_pos0`` (weight-based QK: the readout query against every value's key),
  ``ov_rho_residue`` (OV, direct path to the unembedding), ``probe_sum``,
  ``probe_shortcut`` (cross-validated linear-probe accuracy of the sum residue / the
  shortcut residue from the component's write at the readout; heads and MLPs);
- ablations (:mod:`seedlab.shortcut.interventions`), accuracy changes (ablated - clean) on
  the split named: ``zero_ablation_*``, ``mean_ablation_*`` (whole component), and per head
  ``qk_uniform_ablation_*``, ``qk_mean_ablation_*`` (pattern -> uniform / its mean, OV kept),
  ``ov_mean_ablation_*`` (values -> their mean, pattern kept); nan on MLP rows;
- ``resample_val_into_adv`` / ``resample_adv_into_val``: row-paired patching of val row i
  into adv row i (and the reverse) as a fraction of the full difference of batch means
  (:func:`~seedlab.shortcut.interventions.patch`). The rows share neither label nor
  content, so this is a resample-ablation score, not counterfactual patching.

``patching.parquet``: matched-pair activation patching (:func:`~seedlab.shortcut.interventions.pair_patching`
on :func:`~seedlab.shortcut.pairs.make_pairs`), one row per (member, epoch, layer, head,
direction) with ``direction`` in ``clean_to_corrupt`` / ``corrupt_to_clean`` and the per-pair
distribution (:data:`PATCHING_COLUMNS`, defined in
:meth:`~seedlab.shortcut.interventions.PairPatching.summary`).

Checkpoints are read through the run folder, every tensor checked against its recorded
SHA-256. Counterfactual pairs are held out: neither side is in any member's training split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from seedlab.config import load_yaml, parse
from seedlab.errors import SeedlabError
from seedlab.shortcut.config import EnsembleConfig, Member
from seedlab.shortcut.fingerprints import ov_fingerprint, probe_fingerprint, qk_fingerprint, qk_weight_fingerprint
from seedlab.shortcut.interventions import (
    MIN_GAP,
    PATH_ABLATIONS,
    QUANTILES,
    ablate,
    cached_run,
    pair_patching,
    patch,
    path_ablate,
)
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.pairs import check_pairs_feasible, make_pairs
from seedlab.shortcut.rundir import RunDir, SweepDir, open_folder
from seedlab.shortcut.sweep import finished_jobs
from seedlab.shortcut.tasks import get_task
from seedlab.shortcut.train import member_data
from seedlab.store import write_parquet

KEYS = ["member", "epoch", "layer", "head"]
COLUMNS = [
    *KEYS,
    "qk_rho_value",
    "attn_pos0",
    "qk_w_rho_value",
    "qk_w_pos0",
    "ov_rho_residue",
    "probe_sum",
    "probe_shortcut",
    "zero_ablation_val",
    "zero_ablation_adv",
    "mean_ablation_val",
    "mean_ablation_adv",
    "qk_uniform_ablation_val",
    "qk_uniform_ablation_adv",
    "qk_mean_ablation_val",
    "qk_mean_ablation_adv",
    "ov_mean_ablation_val",
    "ov_mean_ablation_adv",
    "resample_val_into_adv",
    "resample_adv_into_val",
]
PATCHING_COLUMNS = [
    *KEYS,
    "direction",
    "n_pairs",
    "n_small_gap",
    *(f"frac_q{round(100 * q):02d}" for q in QUANTILES),
    "frac_mean",
    "frac_ratio_of_means",
    "dld_q25",
    "dld_q50",
    "dld_q75",
    "gap_q50",
    "ld_clean_q50",
    "ld_corrupt_q50",
]


class Analyses(NamedTuple):
    circuits: pd.DataFrame  # COLUMNS
    patching: pd.DataFrame  # PATCHING_COLUMNS


def load_checkpoint(run: RunDir, cfg: EnsembleConfig, epoch: int) -> tuple[EnsembleTransformer, list[Member]]:
    """The ensemble saved at ``epoch`` (hash-checked), in eval mode, and its members."""
    state, meta = run.load_checkpoint(epoch)
    members = [Member(**m) for m in json.loads(meta["members"])] if "members" in meta else cfg.expand()
    n_classes = get_task(members[0].task).n_classes
    model = EnsembleTransformer(cfg.model, len(members), cfg.data.vocab, cfg.data.length, n_classes)
    model.load_state_dict(state)
    model.eval()
    return model, members


def check_analyzable(run: RunDir) -> tuple[EnsembleConfig, list[int]]:
    """The run's config and checkpoint epochs; a one-line error when it has no checkpoints or no pairs exist."""
    epochs = run.checkpoint_epochs()
    if not epochs:
        raise SeedlabError(f"{run.root}: no checkpoints (set train.checkpoint_epochs)")
    cfg = parse(EnsembleConfig, load_yaml(run.config_path))
    for task in sorted({m.task for m in cfg.expand()}):
        check_pairs_feasible(task, cfg.data.length, cfg.data.vocab)
    return cfg, epochs


def member_pairs(cfg: EnsembleConfig, members: list[Member], train_x: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """Each member's ``n`` counterfactual pairs, stacked: ``clean``, ``corrupt`` [S, n, length], ``y`` [S, n].

    One set of pairs per task (from the data seed), none of whose sequences is in the
    training split of any member of that task (``train_x`` [S, n_train, length]).
    """
    d = cfg.data
    by_task = {}
    for task in sorted({m.task for m in members}):
        seen = np.concatenate([train_x[i].numpy() for i, m in enumerate(members) if m.task == task])
        by_task[task] = make_pairs(task, n, length=d.length, vocab=d.vocab, seed=d.data_seed, exclude=seen)
    stack = lambda f: torch.from_numpy(np.stack([getattr(by_task[m.task], f) for m in members]))
    return {"clean": stack("clean"), "corrupt": stack("corrupt"), "y": stack("y")}


def _long(arrays: dict[str, np.ndarray], epoch: int, H: int) -> pd.DataFrame:
    """{column: [S, layers, heads + 1]} -> one row per (member, layer, head); the MLP is head -1."""
    S, Ly, Hp = next(iter(arrays.values())).shape
    s_, l_, h_ = np.meshgrid(np.arange(S), np.arange(Ly), np.arange(Hp), indexing="ij")
    keys = {"member": s_.ravel(), "epoch": epoch, "layer": l_.ravel(), "head": np.where(h_ == H, -1, h_).ravel()}
    return pd.DataFrame({**keys, **{k: np.asarray(v, dtype=np.float64).ravel() for k, v in arrays.items()}})


def _with_mlp(per_head: np.ndarray) -> np.ndarray:
    """[S, layers, heads] -> [S, layers, heads + 1]: nan on the MLP rows, which have no such measure."""
    return np.concatenate([per_head, np.full((*per_head.shape[:2], 1), np.nan)], -1)


def measure_checkpoint(model: EnsembleTransformer, members: list[Member], data: dict, pairs: dict, epoch: int,
                       rows: int) -> Analyses:
    """Every measure of one checkpoint on the first ``rows`` val/adv rows and the members' pairs."""
    H = model.cfg.heads
    xv, yv = data["val"][0][:, :rows], data["val"][1][:, :rows]
    xa, ya = data["adv"][0][:, :rows], data["adv"][1][:, :rows]
    both = torch.cat([xv, xa], 1)  # the label and the shortcut agree on val and disagree on adv
    shortcut = torch.stack([torch.from_numpy(get_task(m.task).shortcut_feature(both[i].numpy())) for i, m in enumerate(members)])
    qk = qk_fingerprint(model, both)
    qk_w = qk_weight_fingerprint(model)
    per_head = {
        "qk_rho_value": qk["qk_rho_value"],
        "attn_pos0": qk["attn_pos0"],
        "qk_w_rho_value": qk_w["qk_w_rho_value"],
        "qk_w_pos0": qk_w["qk_w_pos0"],
        "ov_rho_residue": ov_fingerprint(model, both, model.n_classes),
    }
    run = {"val": cached_run(model, xv), "adv": cached_run(model, xa)}  # the clean runs every measure shares
    for kind in PATH_ABLATIONS:
        per_head[f"{kind}_ablation_val"] = path_ablate(model, xv, yv, kind, run["val"])
        per_head[f"{kind}_ablation_adv"] = path_ablate(model, xa, ya, kind, run["adv"])
    cols = {k: _with_mlp(v) for k, v in per_head.items()}
    cols |= probe_fingerprint(model, both, {"sum": torch.cat([yv, ya], 1), "shortcut": shortcut})
    for kind in ("zero", "mean"):
        cols[f"{kind}_ablation_val"] = ablate(model, xv, yv, kind, run["val"])
        cols[f"{kind}_ablation_adv"] = ablate(model, xa, ya, kind, run["adv"])
    cols["resample_val_into_adv"] = patch(model, xv, xa, ya, src=run["val"], dst=run["adv"])
    cols["resample_adv_into_val"] = patch(model, xa, xv, yv, src=run["adv"], dst=run["val"])
    circuits = _long(cols, epoch, H)[COLUMNS]
    summary = pair_patching(model, pairs["clean"], pairs["corrupt"], pairs["y"]).summary(MIN_GAP)
    patching = pd.concat([_long(stats, epoch, H).assign(direction=d) for d, stats in summary.items()], ignore_index=True)
    patching = patching.astype({"n_pairs": "int64", "n_small_gap": "int64"})[PATCHING_COLUMNS]
    return Analyses(circuits, patching)


def analyze_run(run_dir: str | Path, n: int = 512) -> Analyses:
    """All circuit measures for every checkpoint of a run folder: (circuits, patching) DataFrames.

    Data: the first ``rows = min(n, n_val, n_adv)`` rows of each member's validation split
    (all shortcut-consistent) and adversarial split (all anti-shortcut), for the ablations
    and the resample scores; the val and adv rows together for the fingerprints and probes
    (where the sum residue and the shortcut residue disagree on half the rows); ``rows``
    counterfactual pairs per member for the matched-pair patching. A one-line
    :class:`SeedlabError` when the run has no checkpoints, or its tasks have no
    counterfactual pairs at its length/vocabulary.
    """
    run = RunDir(run_dir)
    cfg, epochs = check_analyzable(run)
    circuits, patching = [], []
    inputs: dict[str, tuple[dict, dict, int]] = {}  # the data and pairs of each member list (task, ratio per member)
    for epoch in epochs:
        model, members = load_checkpoint(run, cfg, epoch)
        key = json.dumps([(m.task, m.ratio) for m in members])
        if key not in inputs:
            data = member_data(cfg, members)
            rows = min(n, data["val"][0].shape[1], data["adv"][0].shape[1])
            inputs[key] = (data, member_pairs(cfg, members, data["train"][0], rows), rows)
        data, pairs, rows = inputs[key]
        c, p = measure_checkpoint(model, members, data, pairs, epoch, rows)
        circuits.append(c)
        patching.append(p)
    ints = dict.fromkeys(KEYS, "int64")
    return Analyses(pd.concat(circuits, ignore_index=True).astype(ints), pd.concat(patching, ignore_index=True).astype(ints))


def write_analyses(run_dir: str | Path, n: int = 512) -> dict[str, Path]:
    """:func:`analyze_run` written to the folder's ``circuits.parquet`` and ``patching.parquet``.

    A sweep folder is analyzed job by job (jobs with checkpoints), with the sweep's global
    member ids, as in its summary.parquet, and a ``job`` column first. Every job is checked
    before any is analyzed, and nothing is written unless every job succeeded.
    """
    folder = open_folder(run_dir)
    if not isinstance(folder, SweepDir):
        result = analyze_run(folder.root, n=n)
    else:
        jobs = [(key, run, offset) for key, run, offset in finished_jobs(folder) if run.checkpoint_epochs()]
        if not jobs:
            raise SeedlabError(f"{folder.root}: no checkpoints in any finished job (set train.checkpoint_epochs)")
        for _, run, _ in jobs:
            check_analyzable(run)
        parts = []
        for key, run, offset in jobs:
            res = analyze_run(run.root, n=n)
            for df in res:
                df["member"] += offset
                df.insert(0, "job", key)
            parts.append(res)
        result = Analyses(*(pd.concat([p[i] for p in parts], ignore_index=True) for i in range(2)))
    return {"circuits": write_parquet(folder.circuits_path, result.circuits),
            "patching": write_parquet(folder.patching_path, result.patching)}


def write_circuits(run_dir: str | Path, n: int = 512) -> Path:
    """:func:`write_analyses`, returning the ``circuits.parquet`` path (``patching.parquet`` is written beside it)."""
    return write_analyses(run_dir, n)["circuits"]

"""Every circuit measure of every checkpoint of a run or sweep folder -> ``circuits.parquet``.

One row per (member, epoch, layer, head): head 0..H-1 are the attention heads, head = -1 is
the layer's MLP. The fingerprints come from :mod:`seedlab.shortcut.fingerprints`, the
ablations and patching fractions from :mod:`seedlab.shortcut.interventions`. Checkpoints
are read through the run folder, every tensor checked against its recorded SHA-256.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from seedlab.config import load_yaml, parse
from seedlab.errors import SeedlabError
from seedlab.shortcut.config import EnsembleConfig, Member
from seedlab.shortcut.fingerprints import ov_fingerprint, qk_fingerprint
from seedlab.shortcut.interventions import ablate, patch
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.rundir import RunDir, SweepDir, open_folder
from seedlab.shortcut.sweep import finished_jobs
from seedlab.shortcut.tasks import get_task
from seedlab.shortcut.train import member_data
from seedlab.store import write_parquet

COLUMNS = [
    "member",
    "epoch",
    "layer",
    "head",
    "qk_rho_value",
    "attn_pos0",
    "ov_rho_residue",
    "zero_ablation_val",
    "zero_ablation_adv",
    "mean_ablation_val",
    "mean_ablation_adv",
    "patch_val_to_adv",
    "patch_adv_to_val",
]


def load_checkpoint(run: RunDir, cfg: EnsembleConfig, epoch: int) -> tuple[EnsembleTransformer, list[Member]]:
    """The ensemble saved at ``epoch`` (hash-checked), in eval mode, and its members."""
    state, meta = run.load_checkpoint(epoch)
    members = [Member(**m) for m in json.loads(meta["members"])] if "members" in meta else cfg.expand()
    n_classes = get_task(members[0].task).n_classes
    model = EnsembleTransformer(cfg.model, len(members), cfg.data.vocab, cfg.data.length, n_classes)
    model.load_state_dict(state)
    model.eval()
    return model, members


def analyze_run(run_dir: str | Path, n: int = 512) -> pd.DataFrame:
    """All circuit measures for every checkpoint of a run folder, as one long DataFrame.

    Data: the first ``rows = min(n, n_val, n_adv)`` rows of each member's validation split
    (all shortcut-consistent) and adversarial split (all anti-shortcut); the same rows
    serve ablation and the row-paired patching. Fingerprints (``qk_rho_value``,
    ``attn_pos0``, ``ov_rho_residue``) are computed on the val and adv rows together.
    ``*_ablation_{val,adv}`` are accuracy changes (ablated - clean) on that split;
    ``patch_val_to_adv`` patches val (source) activations into adv (destination) runs and
    ``patch_adv_to_val`` the reverse (fractions as defined in
    :func:`seedlab.shortcut.interventions.patch`).

    One row per (member, epoch, layer, head) with head in 0..H-1 and head = -1 for the
    layer's MLP (fingerprint columns are nan on MLP rows). Columns: :data:`COLUMNS`.
    """
    run = RunDir(run_dir)
    epochs = run.checkpoint_epochs()
    if not epochs:
        raise SeedlabError(f"{run.root}: no checkpoints (set train.checkpoint_epochs)")
    cfg = parse(EnsembleConfig, load_yaml(run.config_path))
    frames = []
    data_for: dict[str, dict] = {}  # the splits of each member list (task, ratio per member)
    for epoch in epochs:
        model, members = load_checkpoint(run, cfg, epoch)
        key = json.dumps([(m.task, m.ratio) for m in members])
        if key not in data_for:
            data_for[key] = member_data(cfg, members)
        data = data_for[key]
        rows = min(n, data["val"][0].shape[1], data["adv"][0].shape[1])
        xv, yv = data["val"][0][:, :rows], data["val"][1][:, :rows]
        xa, ya = data["adv"][0][:, :rows], data["adv"][1][:, :rows]
        both = torch.cat([xv, xa], 1)
        qk = qk_fingerprint(model, both)
        ov = ov_fingerprint(model, both, get_task(members[0].task).n_classes)
        cols = {
            "zero_ablation_val": ablate(model, xv, yv, "zero"),
            "zero_ablation_adv": ablate(model, xa, ya, "zero"),
            "mean_ablation_val": ablate(model, xv, yv, "mean"),
            "mean_ablation_adv": ablate(model, xa, ya, "mean"),
            "patch_val_to_adv": patch(model, xv, xa, ya),
            "patch_adv_to_val": patch(model, xa, xv, yv),
        }
        S, Ly, H = model.S, model.cfg.layers, model.cfg.heads
        fp = {"qk_rho_value": _with_mlp(qk["qk_rho_value"]), "attn_pos0": _with_mlp(qk["attn_pos0"]),
              "ov_rho_residue": _with_mlp(ov)}
        s_, l_, h_ = np.meshgrid(np.arange(S), np.arange(Ly), np.arange(H + 1), indexing="ij")
        df = pd.DataFrame(
            {
                "member": s_.ravel(),
                "epoch": epoch,
                "layer": l_.ravel(),
                "head": np.where(h_ == H, -1, h_).ravel(),
                **{k: v.ravel() for k, v in fp.items()},
                **{k: v.ravel() for k, v in cols.items()},
            }
        )
        frames.append(df[COLUMNS])
    out = pd.concat(frames, ignore_index=True)
    return out.astype({"member": "int64", "epoch": "int64", "layer": "int64", "head": "int64"})


def _with_mlp(fingerprint: np.ndarray) -> np.ndarray:
    """[S, layers, heads] -> [S, layers, heads + 1]: nan on the MLP rows, which have no fingerprint."""
    return np.concatenate([fingerprint, np.full((*fingerprint.shape[:2], 1), np.nan)], -1)


def write_circuits(run_dir: str | Path, n: int = 512) -> Path:
    """:func:`analyze_run` written to the folder's ``circuits.parquet``; returns that path.

    A sweep folder is analyzed job by job (jobs with checkpoints), with the sweep's global
    member ids, as in its summary.parquet.
    """
    folder = open_folder(run_dir)
    if not isinstance(folder, SweepDir):
        return write_parquet(folder.circuits_path, analyze_run(folder.root, n=n))
    parts = []
    for key, run, offset in finished_jobs(folder):
        if run.checkpoint_epochs():
            df = analyze_run(run.root, n=n)
            df["member"] += offset
            df.insert(0, "job", key)
            parts.append(df)
    if not parts:
        raise SeedlabError(f"{folder.root}: no checkpoints in any finished job (set train.checkpoint_epochs)")
    return write_parquet(folder.circuits_path, pd.concat(parts, ignore_index=True))

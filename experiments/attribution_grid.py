"""The size axis through training (issue 31 §2): every cell of the rows-per-batch B × peak lr grid, then the table.

B ∈ {8, 32, 128} × lr ∈ {1e-2, 1e-3}, each cell presets/attribution/grid.yaml with ``--set batch_size=B`` (and at
lr 1e-3 ``--set peak_lr=1e-3 --set min_lr=1e-4``), named ``b{B}-lr{lr}`` (b8-lr1e-2 .. b128-lr1e-3). Per cell:

    seedlab attribution bank grid --out OUT/<cell> --jobs J --set batch_size=B [...]
    seedlab attribution attribute OUT/<cell> --jobs J --estimator unroll ... --estimator length
    seedlab attribution report OUT/<cell>

then its summary (attribution/analyses/grid.py ``summarise``) into OUT/summaries/<cell>/ with each stage's wall time, copied
to KEEP/<cell>/ with ``--keep KEEP`` (a small folder to commit; a cell kept there is skipped, so the grid can be
spread over sessions). The bank resumes a folder it started; attribute is skipped when attribution.parquet already
holds every estimator. Last, OUT/grid.md (attribution/report/grid.py) from every cell summarised (in KEEP or OUT),
with the law's ε_nl fixed from ``--reference`` (a size-axis bank folder, or a kept summary of one), and the table
and the law as OUT/grid-table.csv, OUT/grid-law.csv.

    python experiments/attribution_grid.py --out runs/grid --keep docs/results/grid --reference runs/attribution-size8
    python experiments/attribution_grid.py --cells b8-lr1e-2,b32-lr1e-3 --seeds 0,1 --dry-run
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

BATCHES = (8, 32, 128)
LRS = (1e-2, 1e-3)
PRESET = "grid"
ESTIMATORS = ("unroll", "unroll-tangent", "unroll-readout", "sgd", "adam", "tracin", "cosine", "adam-cosine", "random",
              "loss", "gradnorm", "length")


def lr_name(lr: float) -> str:
    """1e-2 -> "1e-2" (the cell's name; ``f"{lr:.0e}"`` would write 1e-02)."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def cell_name(batch: int, lr: float) -> str:
    return f"b{batch}-lr{lr_name(lr)}"


#: every cell: name -> (B, lr), in the grid's order
CELLS = {cell_name(b, lr): (b, lr) for lr in LRS for b in BATCHES}


def sets(batch: int, lr: float, seeds: list[int] | None) -> list[str]:
    """The cell's ``--set`` overrides of the preset (lr 1e-2 is the preset's own; the decay keeps its 10x ratio)."""
    out = [f"batch_size={batch}"]
    if lr != 1e-2:
        out += [f"peak_lr={lr_name(lr)}", f"min_lr={lr_name(lr / 10)}"]
    if seeds is not None:
        out += [f"seeds=[{','.join(map(str, seeds))}]"]
    return out


def commands(cell: str, out: Path, jobs: int, seeds: list[int] | None) -> dict[str, list[str]]:
    """The cell's three stages as command lines (``python -m seedlab``: the same interpreter as this script)."""
    batch, lr = CELLS[cell]
    folder = str(out / cell)
    seedlab = [sys.executable, "-m", "seedlab", "attribution"]
    bank = [*seedlab, "bank", PRESET, "--out", folder, "--jobs", str(jobs)]
    for s in sets(batch, lr, seeds):
        bank += ["--set", s]
    attribute = [*seedlab, "attribute", folder, "--jobs", str(jobs)]
    for e in ESTIMATORS:
        attribute += ["--estimator", e]
    return {"bank": bank, "attribute": attribute, "report": [*seedlab, "report", folder]}


def _attributed(folder: Path) -> bool:
    """attribution.parquet holds every estimator of :data:`ESTIMATORS` (the attribute stage is done)."""
    path = folder / "attribution.parquet"
    if not path.is_file():
        return False
    import pandas as pd

    return set(ESTIMATORS) <= set(pd.read_parquet(path, columns=["estimator"]).estimator.unique())


def run_cell(cell: str, args, seeds: list[int] | None) -> bool:
    """The cell's stages, its summary and its copy (seedlab/cells.py ``run_cell``); False when a stage failed (its
    exit code printed). The attribute stage is skipped when attribution.parquet holds every estimator already."""
    from seedlab import cells
    from seedlab.attribution.analyses.grid import summarise
    from seedlab.attribution.bank.rundir import BankDir, read_attributed

    skip = {"attribute": "attribution.parquet holds every estimator already"} if _attributed(args.out / cell) else {}
    resumed = {"bank"} if BankDir(args.out / cell).started() else set()  # timed as "bank (resumed)": this call's part
    return cells.run_cell(cell, commands(cell, args.out, args.jobs, seeds),
                          lambda: summarise(read_attributed(args.out / cell), cell), out=args.out, keep=args.keep,
                          skip=skip, resumed=resumed)


def available(out: Path, keep: Path | None) -> list:
    """Every cell summarised, in the grid's order: KEEP/<cell> first, else OUT/summaries/<cell>."""
    from seedlab.attribution.analyses.grid import Cell
    from seedlab.cells import summaries

    found = summaries(out, keep)
    return [Cell.from_dir(found[cell]) for cell in CELLS if cell in found]


def write_grid(args, reference: tuple[dict, str] | None) -> Path:
    """OUT/grid.md, OUT/grid-table.csv and (with a reference) OUT/grid-law.csv from every cell summarised."""
    from seedlab.attribution.analyses import grid
    from seedlab.attribution.report.grid import grid_report
    from seedlab.attribution.bank.rundir import GridDir

    where = GridDir(args.out)
    where.root.mkdir(parents=True, exist_ok=True)
    cells = available(args.out, args.keep)
    t = grid.table(cells)
    law = None
    if reference is not None:
        law = grid.law(cells, *reference)
        law.to_csv(where.table("law"), index=False)
    t.to_csv(where.table("table"), index=False)
    where.report.write_text(grid_report(cells, t, law, grid.effect_of(t)))
    return where.report


def main(argv: list[str] | None = None) -> int:
    from seedlab.cells import parse_seeds, skip_kept

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/grid"), help="the cells' bank folders, OUT/<cell>")
    p.add_argument("--cells", default=",".join(CELLS),
                   help=f"a subset, comma-separated (default all: {','.join(CELLS)})")
    p.add_argument("--seeds", type=parse_seeds, help="override the preset's seeds, e.g. 0,1,2,3")
    p.add_argument("--jobs", type=int, default=2, help="seeds at once in each seedlab command")
    p.add_argument("--reference", type=Path, help="the law's ε_nl: a size-axis bank folder or a kept summary of one")
    p.add_argument("--keep", type=Path, help="copy each cell's summary to KEEP/<cell>; a cell kept there is skipped")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    chosen = [c.strip() for c in args.cells.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CELLS]
    if unknown:
        p.error(f"--cells: unknown {', '.join(unknown)} (the cells: {', '.join(CELLS)})")
    if args.reference and not args.reference.exists():
        p.error(f"--reference: {args.reference} does not exist")
    reference = None
    if args.reference and not args.dry_run:  # read first: a wrong reference fails before hours of training
        from seedlab.attribution.analyses.grid import read_reference
        from seedlab.errors import SeedlabError

        try:
            reference = read_reference(args.reference)
        except SeedlabError as e:
            p.error(f"--reference: {e}")
    for cell in chosen:
        if skip_kept(args.keep, cell):
            continue
        if args.dry_run:
            print(f"# {cell}")
            for cmd in commands(cell, args.out, args.jobs, args.seeds).values():
                print(shlex.join(cmd))
            print(f"# summarise {args.out / cell} -> {args.out / 'summaries' / cell}"
                  + (f", kept in {args.keep / cell}" if args.keep else ""))
            continue
        if not run_cell(cell, args, args.seeds):
            return 1
    if args.dry_run:
        print(f"# grid.md -> {args.out / 'grid.md'}" + (f" (ε_nl from {args.reference})" if args.reference else ""))
        return 0
    print(f"grid: {write_grid(args, reference)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

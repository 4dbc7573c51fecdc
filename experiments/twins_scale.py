"""The twins' scale axis (issue 32 §3): every cell of the scale table, one after another, then the table, its trends
and a figure per measure.

The cells are the presets twins/scale-* (:data:`CELLS`): rows per batch B ∈ {16, 64, 256} (scale-b16, scale-b64,
scale-b256), 1,000 updates after the injection at B = 16 (scale-b16-long), the schedule apart from the steps
(scale-b16-floor: 1,000 updates after s on scale-b16's decay, then the floor; scale-b16-longdecay: 200 updates on
scale-b16-long's decay), the peak rate (scale-b16-lr3e-3, scale-b16-lr1e-3: min_lr = peak / 10) and the wider model
at B = 64 (scale-wide-b64: d 128 with 4 heads of 32 at mini's rate; scale-wide-heads-b64: d 128 with mini's 2 heads,
64 wide, at 5e-3, lr ∝ 1/width); a cell may also be a YAML config file (its name: the file's stem). Per cell:

    seedlab twins run <preset> --out OUT/<cell> --set threads=T [--set seeds=[...]] [--set ...]
    seedlab twins measure OUT/<cell>          (OMP_NUM_THREADS=T)

then its summary (twins/scale.py ``summarise``) into OUT/summaries/<cell>/ with each stage's wall time, copied to
KEEP/<cell>/ with ``--keep KEEP`` (a small folder to commit). A cell kept in KEEP is skipped; a cell whose folder is
measured with nothing missing (measures.json) is not trained or measured again; ``twins run`` itself resumes a
folder it started. Last, from every cell summarised (KEEP first, then OUT/summaries), the table, the trends and the
paper extrapolation (REPORT/scale-{table,trends,paper}.csv), a figure per measure and REPORT/scale.md, REPORT =
``--report`` (default: KEEP, else OUT).

The table's cost (docs/benchmarks.md, "The twins' scale axis"): every cell measured, 6.2 h in all with two torch
threads, one training job at a time (~0.4 h of it pauses for tests). It ran in session-sized chunks:

    python experiments/twins_scale.py --cells scale-b256 --seeds 0,1,2,3 --threads 2 \
        --out runs/scale --keep docs/results/twins-scale --no-progress                 # 2.6 h
    python experiments/twins_scale.py --cells scale-wide-b64 --threads 2 \
        --out runs/scale --keep docs/results/twins-scale --no-progress                 # ~1.1 h
    python experiments/twins_scale.py --cells scale-b16-long --seeds 0,1,2,3 --threads 2 \
        --out runs/scale --keep docs/results/twins-scale --no-progress                 # ~44 min

(the second to finish renders every kept cell; ``--render`` renders again without running anything).

The confirmatory step: ``--predict batch_size=128 --predict-seeds 8,9,10,11,12,13`` writes REPORT/scale-prediction.json
and REPORT/scale-preregistration.md from the kept cells (the measure the trend says moves most, twins/scale.py
``predict``; refused once written); ``--confirm`` then runs that cell (confirm-<axis><level>, from the family cell
nearest the level, its text kept by ``--preregistration`` before the first step), keeps it, and renders the verdict.
The confirmatory cell is never part of the fit.

A folder trained and measured by another command (a pre-registered design, run with its own ``--preregistration``)
joins the table as a cell with ``--adopt NAME=FOLDER``: summarised as it is (refused unless measured with nothing
missing), never trained or measured again, kept under NAME; ``--adopt-stage run=SECONDS`` records the wall time its
own command took (its clock is not the driver's). E.g. the pre-registered dose run at peak lr 5e-3, the rate axis's
fourth level (docs/preregistration/twins-dose.md):

    python experiments/twins_scale.py --adopt dose-b16-lr5e-3=runs/dose-confirm --adopt-stage run=2100 \
        --keep docs/results/twins-scale --out runs/scale
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

#: the shipped cells, in the table's order
CELLS = ("scale-b16", "scale-b64", "scale-b256", "scale-b16-after300", "scale-b16-after500", "scale-b16-long",
         "scale-b16-floor", "scale-b16-longdecay", "scale-b16-lr3e-3", "scale-b16-lr1e-3", "scale-wide-b64",
         "scale-wide-heads-b64")
CONFIRM = "confirm-"
_AXIS_TAG = {"batch_size": "b", "after": "after", "schedule": "decay", "rate": "lr"}


def cell_name(spec: str) -> str:
    """A preset's name, or a YAML file's stem."""
    return Path(spec).stem if spec.endswith((".yaml", ".yml")) else spec


def confirm_name(axis: str, at: int | float) -> str:
    return f"{CONFIRM}{_AXIS_TAG.get(axis, axis)}{at:g}"


def commands(spec: str, folder: Path, threads: int, sets: list[str], progress: bool,
             preregistration: Path | None = None) -> dict[str, list[str]]:
    """The cell's two stages as command lines (``python -m seedlab``: the same interpreter as this script)."""
    seedlab = [sys.executable, "-m", "seedlab", "twins"]
    run = [*seedlab, "run", spec, "--out", str(folder), "--set", f"threads={threads}"]
    for s in sets:
        run += ["--set", s]
    if preregistration is not None:
        run += ["--preregistration", str(preregistration)]
    measure = [*seedlab, "measure", str(folder)]
    if not progress:
        run.append("--no-progress")
        measure.append("--no-progress")
    return {"run": run, "measure": measure}


def measured(folder: Path) -> bool:
    """The folder is measured with nothing missing (its measures.json says so)."""
    path = folder / "measures.json"
    return path.is_file() and not json.loads(path.read_text()).get("missing", ["?"])


def run_cell(spec: str, args, sets: list[str], name: str | None = None, preregistration: Path | None = None) -> bool:
    """The cell's stages, its summary and its copy (seedlab/cells.py ``run_cell``); False when a stage failed (its
    exit code printed). Run and measure are skipped when the folder is measured with nothing missing; a run that
    resumes a started folder is timed as "run (resumed)" (that invocation's time alone)."""
    from seedlab import cells
    from seedlab.twins.rundir import Measured, RunDir
    from seedlab.twins.scale import summarise

    name = name or cell_name(spec)
    folder = args.out / name
    stages = commands(spec, folder, args.threads, sets, args.progress, preregistration)
    skip = dict.fromkeys(stages, f"{folder} is measured with nothing missing") if measured(folder) else {}
    resumed = {"run"} if RunDir(folder).started() else set()
    return cells.run_cell(name, stages, lambda: summarise(Measured.read(folder), name, preset=spec), out=args.out,
                          keep=args.keep, skip=skip, env=os.environ | {"OMP_NUM_THREADS": str(args.threads)},
                          resumed=resumed)


def adopt(spec: str, args) -> Path:
    """``NAME=FOLDER``: the measured twins folder summarised as the cell NAME (seedlab/cells.py ``run_cell`` with no
    stage to run, ``--adopt-stage`` as its recorded stages) into OUT/summaries/NAME and KEEP/NAME; refused (one
    line) unless FOLDER is measured with nothing missing, or when NAME is kept already. The cell's folder."""
    from seedlab import cells
    from seedlab.errors import SeedlabError
    from seedlab.twins.rundir import Measured
    from seedlab.twins.scale import summarise

    name, eq, folder = spec.partition("=")
    if not eq or not name or not folder:
        raise SeedlabError(f"--adopt: NAME=FOLDER, e.g. dose-b16-lr5e-3=runs/dose-confirm, got {spec!r}")
    folder = Path(folder)
    if not measured(folder):
        raise SeedlabError(f"--adopt: {folder} is not measured with nothing missing (seedlab twins measure {folder})")
    if args.keep and (args.keep / name).exists():
        raise SeedlabError(f"--adopt: {args.keep / name} is kept already (a kept cell is not rewritten)")
    stages = {}
    for s in args.adopt_stages:
        stage, eq, seconds = s.partition("=")
        try:
            if not eq or not stage:
                raise ValueError(s)
            stages[stage] = round(float(seconds), 1)
        except ValueError:
            raise SeedlabError(f"--adopt-stage: STAGE=SECONDS, e.g. run=2100, got {s!r}") from None
    cells.run_cell(name, {}, lambda: summarise(Measured.read(folder), name, preset=name), out=args.out,
                   keep=args.keep, recorded=stages)
    return args.keep / name if args.keep else args.out / cells.SUMMARIES / name


def available(out: Path, keep: Path | None) -> list:
    """Every cell summarised: KEEP/<cell> first, else OUT/summaries/<cell>; shipped cells in :data:`CELLS`' order,
    then the others by name."""
    from seedlab.cells import summaries
    from seedlab.twins.scale import Cell

    found = summaries(out, keep)
    order = sorted(found, key=lambda n: (CELLS.index(n) if n in CELLS else len(CELLS), n))
    return [Cell.from_dir(found[n]) for n in order]


def report_dir(args) -> Path:
    return args.report or args.keep or args.out


def render(args) -> Path:
    """The table, trends, paper extrapolation, figures and scale.md from every cell summarised; the confirmatory
    cell (if any) only for the verdict."""
    from seedlab.twins import scale, trends
    from seedlab.twins.report_scale import write_scale
    from seedlab.twins.rundir import ScaleDir

    where = ScaleDir(report_dir(args))
    where.root.mkdir(parents=True, exist_ok=True)
    cells = available(args.out, args.keep)
    fitted = [c for c in cells if not c.name.startswith(CONFIRM)]
    dr = scale.draws(fitted)
    t, tr, paper = scale.table(dr), trends.trends(dr), trends.paper_extrapolation(dr)
    t.to_csv(where.table("table"), index=False)
    tr.to_csv(where.table("trends"), index=False)
    paper.to_csv(where.table("paper"), index=False)
    prediction = verdict = beside = None
    if where.prediction.is_file():
        prediction = trends.Prediction.from_json(where.prediction)
        new = [c for c in cells if c.name == confirm_name(prediction.axis, prediction.at)]
        if new:
            new_draws = scale.draws(new)
            verdict = trends.confirm(prediction, new_draws, new[0].name)
            where.verdict.write_text(json.dumps(verdict, indent=1, default=float) + "\n")
            beside = scale.table(new_draws)  # the confirmatory cell's nulls, beside the verdict (not part of its rule)
            beside.to_csv(where.table("confirm"), index=False)
    where.report.write_text(write_scale(fitted, t, tr, paper, where, prediction, verdict, beside))
    return where.report


def predict(args) -> Path:
    """The confirmatory prediction from the kept cells, written once (module doc)."""
    from seedlab.errors import SeedlabError
    from seedlab.twins import scale, trends
    from seedlab.twins.rundir import ScaleDir

    where = ScaleDir(report_dir(args))
    if where.prediction.is_file():
        raise SeedlabError(f"--predict: {where.prediction} is written already (a pre-registration is not rewritten)")
    axis, _, level = args.predict.partition("=")
    try:
        at = float(level) if axis == "rate" else int(level)
    except ValueError:
        raise SeedlabError(f"--predict: AXIS=LEVEL with an integer level (a number for rate), e.g. batch_size=128, "
                           f"got {args.predict!r}") from None
    cells = [c for c in available(args.out, args.keep) if not c.name.startswith(CONFIRM)]
    p = trends.predict(scale.draws(cells), axis, at, args.predict_seeds or [], measure=args.predict_measure)
    where.root.mkdir(parents=True, exist_ok=True)
    where.preregistration.write_text(trends.preregistration_text(p))
    p.to_json(where.prediction)
    return where.preregistration


def main(argv: list[str] | None = None) -> int:
    from seedlab.cells import parse_seeds, skip_kept
    from seedlab.errors import SeedlabError

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/scale"), help="the cells' run folders, OUT/<cell>")
    p.add_argument("--cells", default=",".join(CELLS),
                   help=f"comma-separated presets or YAML files (default: {','.join(CELLS)})")
    p.add_argument("--seeds", type=parse_seeds, help="override every cell's seeds, e.g. 0,1,2,3")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each seedlab command (default 1)")
    p.add_argument("--set", dest="sets", action="append", default=[], help="an override for every cell's run, e.g. corpus=DIR")
    p.add_argument("--keep", type=Path, help="copy each cell's summary to KEEP/<cell>; a cell kept there is skipped")
    p.add_argument("--report", type=Path, help="where the table, figures and scale.md go (default: KEEP, else OUT)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--render", action="store_true", help="only render from the kept cells")
    p.add_argument("--predict", help="AXIS=LEVEL: pre-register the confirmatory prediction (batch_size, after, schedule "
                                     "or rate)")
    p.add_argument("--predict-seeds", type=parse_seeds, help="its fresh seeds, e.g. 8,9,10,11,12,13")
    p.add_argument("--predict-measure", help="the measure to predict (default: the one the trend says moves most)")
    p.add_argument("--adopt", action="append", default=[],
                   help="NAME=FOLDER: a folder measured by another command joins the table as the cell NAME")
    p.add_argument("--adopt-stage", dest="adopt_stages", action="append", default=[],
                   help="STAGE=SECONDS: the adopted folder's wall time for a stage, e.g. run=2100 (its command's clock)")
    p.add_argument("--confirm", action="store_true", help="run the pre-registered confirmatory cell and render its verdict")
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads: at least 1, got {args.threads}")
    specs = [c.strip() for c in args.cells.split(",") if c.strip()]
    unknown = [c for c in specs if c not in CELLS and not (c.endswith((".yaml", ".yml")) and Path(c).is_file())]
    if unknown:
        p.error(f"--cells: unknown {', '.join(unknown)} (the cells: {', '.join(CELLS)}, or YAML files)")
    sets = list(args.sets) + ([f"seeds=[{','.join(map(str, args.seeds))}]"] if args.seeds else [])
    try:
        if args.predict:
            print(f"pre-registered: {predict(args)}", flush=True)
            return 0
        if args.adopt:
            for spec in args.adopt:
                print(f"adopted: {adopt(spec, args)}", flush=True)
            print(f"scale: {render(args)}", flush=True)
            return 0
        if args.confirm:
            from seedlab.twins.rundir import ScaleDir
            from seedlab.twins.trends import Prediction

            where = ScaleDir(report_dir(args))
            pr = Prediction.from_json(where.prediction)
            name = confirm_name(pr.axis, pr.at)
            if args.dry_run:
                for cmd in commands(pr.preset, args.out / name, args.threads, [*args.sets, *pr.sets], args.progress,
                                    where.preregistration).values():
                    print(shlex.join(cmd))
                return 0
            if not skip_kept(args.keep, name):
                if not run_cell(pr.preset, args, [*args.sets, *pr.sets], name, where.preregistration):
                    return 1
            print(f"scale: {render(args)}", flush=True)
            return 0
        if not args.render:
            for spec in specs:
                name = cell_name(spec)
                if skip_kept(args.keep, name):
                    continue
                if args.dry_run:
                    print(f"# {name}")
                    for cmd in commands(spec, args.out / name, args.threads, sets, args.progress).values():
                        print(shlex.join(cmd))
                    continue
                if not run_cell(spec, args, sets):
                    return 1
        if args.dry_run:
            print(f"# scale.md -> {report_dir(args) / 'scale.md'}")
            return 0
        print(f"scale: {render(args)}", flush=True)
    except SeedlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

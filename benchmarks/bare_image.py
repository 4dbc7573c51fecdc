"""The lent GPU machine's bare image simulated on this machine, to run the GPU check's dry run in it.

    python benchmarks/bare_image.py DIR [--run]

In DIR it makes what the lent machine offers the check, from what is installed here (no network):

- ``python/``: a fresh ``venv --without-pip`` of this machine's Python, whose only packages are those the image
  lists (benchmarks/gpu_wheels.py ``IMAGE``) and this environment holds — linked one by one from its
  site-packages into ``image/`` (a folder shared with a package the image lacks is made afresh and only the
  image package's entries linked), ``image/`` added by a ``.pth`` (``site.addsitedir``). The image's torch is
  2.11; this one's is the pinned build (a CPU wheel of 2.11 would be a download). Packages the image lists
  that are not installed here are absent: the check uses none of them.
- ``.whl/``: the carried wheels (``gpu_wheels.py --from-installed`` for this Python: seedlab's own wheel and
  the packages the image lacks, made from the installed ones; the lent machine gets CPython 3.12 wheels).
- ``site/``: those wheels installed by the image's own pip, as docs/benchmarks.md says to type it there:
  ``python -m pip install -q --no-index --no-deps --no-compile --target DIR/site DIR/.whl/*.whl``.

Before installing, it checks that the simulated image is bare (seedlab and pydantic do not import); after, that
seedlab imports from ``site/``. ``--run`` then runs, from the repository's root,
``PYTHONPATH=DIR/site DIR/python/bin/python benchmarks/gpu_check.py --dry-run --device cpu --out DIR/out
--wheels DIR/.whl`` and exits with its status (tests/common/test_gpu_check.py does the same).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

sys.path.insert(0, str(Path(__file__).parent))
import gpu_wheels

ROOT = Path(__file__).resolve().parents[1]


def link_image(dest: Path, image: frozenset[str] = gpu_wheels.IMAGE) -> tuple[list[str], list[str]]:
    """``dest`` holding a link to every file or folder of this environment's packages that the image lists,
    and to nothing of the others: (the image's packages linked, as name==version; those not installed here)."""
    owners: dict[tuple[str, ...], set[str]] = {}
    where: dict[tuple[str, ...], Path] = {}
    linked = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        if name in image:
            linked[name] = f"{name}=={dist.version}"
        for f in dist.files or []:
            if f.parts[0] == ".." or "__pycache__" in f.parts:
                continue
            for i in range(1, len(f.parts) + 1):
                owners.setdefault(f.parts[:i], set()).add(name)
                where.setdefault(f.parts[:i], Path(dist.locate_file(Path(*f.parts[:i]))))
    children: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for parts in owners:
        children.setdefault(parts[:-1], []).append(parts)

    def link(parts: tuple[str, ...]) -> None:
        who = owners[parts]
        if not who & image:
            return
        if who <= image:  # the image's alone: one link
            if where[parts].exists():
                (dest / Path(*parts)).symlink_to(where[parts])
            return
        (dest / Path(*parts)).mkdir()  # shared with a package the image lacks: its entries one by one
        for child in children.get(parts, []):
            link(child)

    dest.mkdir(parents=True)
    for top in children[()]:
        link(top)
    return sorted(linked.values()), sorted(image - set(linked))


def bare_python(folder: Path) -> Path:
    """A venv without pip or any package; the image's packages reach it through one .pth."""
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(folder / "python")
    python = folder / "python" / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "image.pth").write_text(f"import site; site.addsitedir({str(folder / 'image')!r})\n")
    return python


def imports(python: Path, module: str, env: dict | None = None) -> str | None:
    """Where ``module`` imports from under ``python`` (None: it does not)."""
    done = subprocess.run([python, "-c", f"import {module}; print({module}.__file__)"], capture_output=True, text=True,
                          env=env, cwd=python.parent)
    return done.stdout.strip() if done.returncode == 0 else None


def build(folder: Path, say=print) -> tuple[Path, dict]:
    """The simulated image in ``folder`` (see the module docstring): (its python, the PYTHONPATH env to run it with)."""
    folder = Path(folder).resolve()
    linked, absent = link_image(folder / "image")
    python = bare_python(folder)
    bare_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    leaks = [m for m in ("seedlab", "pydantic") if imports(python, m, bare_env)]
    if leaks:
        raise RuntimeError(f"the simulated image is not bare: {', '.join(leaks)} import before the wheels are installed")
    say(f"image: {len(linked)} of the image's {len(gpu_wheels.IMAGE)} packages are installed here and linked "
        f"({', '.join(x for x in linked if x.startswith(('torch==', 'numpy==', 'pandas==')))}, ...); "
        f"{len(absent)} absent here")
    gpu_wheels.prepare(folder / ".whl", ".".join(map(str, sys.version_info[:2])), from_installed=True,
                       say=lambda line: say(f"wheels: {line}"))
    wheels = sorted(str(w) for w in (folder / ".whl").glob("*.whl"))
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
                    str(folder / "site"), *wheels], check=True, env=bare_env, cwd=ROOT)
    env = bare_env | {"PYTHONPATH": str(folder / "site")}
    where = imports(python, "seedlab", env)
    if not where or not where.startswith(str(folder / "site")):
        raise RuntimeError(f"seedlab imports from {where}, not from {folder / 'site'}")
    say(f"site: {len(wheels)} wheels installed by the image's pip; seedlab imports from {Path(where).parent}")
    return python, env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a new or empty folder")
    ap.add_argument("--run", action="store_true", help="then run the check's dry run there")
    args = ap.parse_args(argv)
    if args.folder.exists() and any(args.folder.iterdir()):
        print(f"bare_image: {args.folder} is not empty", file=sys.stderr)
        return 2
    python, env = build(args.folder)
    if not args.run:
        print(f"run: PYTHONPATH={env['PYTHONPATH']} {python} benchmarks/gpu_check.py --dry-run --device cpu "
              f"--out {args.folder.resolve() / 'out'} --wheels {args.folder.resolve() / '.whl'}")
        return 0
    cmd = [str(python), "benchmarks/gpu_check.py", "--dry-run", "--device", "cpu", "--out", str(args.folder.resolve() / "out"),
           "--wheels", str(args.folder.resolve() / ".whl")]
    return subprocess.run(cmd, env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())

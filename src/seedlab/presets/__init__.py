"""Presets: the configs seedlab ships, as package data (so ``pip install seedlab`` has them).

``presets/<study>/<name>.yaml`` — e.g. ``shortcut/quick`` (the CPU reproduction; ``make demo``
runs a smaller version) or ``twins/gpt2-124m`` (the paper's protocol). Every command that takes a CONFIG takes a
preset name as well: ``seedlab shortcut sweep quick`` is ``seedlab shortcut sweep PATH/quick.yaml``.
A preset's own relative paths (the twins passages) are relative to the preset's folder, as for
any config file; ``seedlab presets copy`` writes a preset (and its passages) out for editing.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from seedlab.errors import SeedlabError
from seedlab.store import refuse_overwrite

_ROOT = Path(str(resources.files(__name__)))
#: the studies that ship presets: the folders here holding YAML files (a test checks that each is a
#: study registered in seedlab.cli whose commands read them, and that no registered study's presets are missing)
STUDIES = tuple(sorted(p.name for p in _ROOT.iterdir() if p.is_dir() and any(p.glob("*.yaml"))))


def folder(study: str) -> Path:
    """Where a study's presets live (inside the installed package)."""
    return _ROOT / study


def names(study: str) -> list[str]:
    """The study's preset names, sorted."""
    return sorted(p.stem for p in folder(study).glob("*.yaml"))


def find(study: str, name: str) -> Path | None:
    """The preset file called ``name`` (with or without ``.yaml``), or None."""
    p = folder(study) / f"{name.removesuffix('.yaml')}.yaml"
    return p if "/" not in name and p.is_file() else None


def lookup(name: str) -> tuple[str | None, Path]:
    """What ``seedlab presets show NAME`` names: a preset ``NAME`` (the one study that has it),
    ``STUDY/NAME``, or a YAML file (its study None: any study's). Anything else is a one-line error."""
    if Path(name).is_file():
        return None, Path(name)
    study, _, stem = name.rpartition("/")
    found = [(s, p) for s in ((study,) if study else STUDIES) if s in STUDIES and (p := find(s, stem)) is not None]
    if len(found) == 1:
        return found[0]
    every = ", ".join(f"{s}/{n}" for s in STUDIES for n in names(s))
    if found:
        raise SeedlabError(f"name: {name!r} is a preset of {' and '.join(s for s, _ in found)}: "
                           f"say which ({', '.join(f'{s}/{stem}' for s, _ in found)})")
    raise SeedlabError(f"name: a preset ({every}) or a YAML file, got {name!r}")


def files(study: str, name: str) -> list[str]:
    """The preset's file and the files it names (e.g. the twins passages), relative to its folder:
    every string in the YAML that is the relative path of a file beside it."""
    import yaml

    found = find(study, name)
    if found is None:
        return []

    def strings(node) -> list[str]:
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    named = {s for s in strings(yaml.safe_load(found.read_text())) if not Path(s).is_absolute() and (found.parent / s).is_file()}
    return [found.name, *sorted(named)]


def describe(study: str, name: str) -> str:
    """What a preset is: the first sentence of the comment that opens its file, whole (its lines joined,
    without the ``#``)."""
    words = []
    for line in find(study, name).read_text().splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("#").split()
    return first_sentence(" ".join(words))


def first_sentence(text: str) -> str:
    """``text`` up to the end of its first sentence: the first ``.``, ``!`` or ``?`` followed by a space (or
    the end) outside brackets and double quotes (a full stop inside ``(...)`` or ``"..."`` ends no sentence)."""
    depth, quoted = 0, False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch in ".!?" and not depth and not quoted and text[i + 1 : i + 2] in ("", " "):
            return text[: i + 1]
    return text


def copy(name: str, out: Path, *, force: bool = False) -> list[Path]:
    """``seedlab presets copy``: write the preset ``STUDY/NAME`` and the files it names into ``out``, to
    edit and run. Existing files are refused unless ``force``. Returns the files written, the preset first."""
    study, _, stem = name.partition("/")
    src = find(study, stem) if study in STUDIES else None
    if src is None:
        every = ", ".join(f"{s}/{n}" for s in STUDIES for n in names(s))
        raise SeedlabError(f"name: one of {every}, got {name!r}")
    rels = files(study, stem)
    written = [out / rel for rel in rels]
    refuse_overwrite(written, force)
    for rel, dst in zip(rels, written):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.parent / rel, dst)
    return written

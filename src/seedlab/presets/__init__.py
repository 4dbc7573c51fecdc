"""Presets: the configs seedlab ships, as package data (so ``pip install seedlab`` has them).

``presets/<study>/<name>.yaml`` — e.g. ``shortcut/quick`` (the CPU reproduction; ``make demo``
runs a smaller version) or ``twins/gpt2-124m`` (the paper's protocol). Every command that takes a CONFIG takes a
preset name as well: ``seedlab shortcut sweep quick`` is ``seedlab shortcut sweep PATH/quick.yaml``.
A preset's own relative paths (the twins passages) are relative to the preset's folder, as for
any config file; ``seedlab presets copy`` writes a preset (and its passages) out for editing.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

STUDIES = ("shortcut", "twins", "attribution")


def folder(study: str) -> Path:
    """Where a study's presets live (inside the installed package)."""
    return Path(str(resources.files(__name__))) / study


def names(study: str) -> list[str]:
    """The study's preset names, sorted."""
    return sorted(p.stem for p in folder(study).glob("*.yaml"))


def find(study: str, name: str) -> Path | None:
    """The preset file called ``name`` (with or without ``.yaml``), or None."""
    p = folder(study) / f"{name.removesuffix('.yaml')}.yaml"
    return p if "/" not in name and p.is_file() else None


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

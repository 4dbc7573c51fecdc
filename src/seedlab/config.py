"""Config plumbing shared by every study: strict pydantic models, YAML loading,
one-line error messages, and the fields' help. (Content hashes of configs live in seedlab/store.py.)

Every config model derives from :class:`Strict`, so an unknown or mistyped field
is an error that names it, never a silently ignored key. Every field carries its help as
``Field(description=...)``: :func:`config_fields` lists them, dotted as ``--set`` names them
(``seedlab presets show``, and the ``--help`` of every command that takes a CONFIG).
"""

from __future__ import annotations

import importlib
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import to_jsonable_python

from seedlab.errors import SeedlabError

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """Base for all configs: unknown fields are rejected, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


def with_new_defaults(cls: type[BaseModel], record: dict) -> dict:
    """A config record (a ``model_dump(mode="json")`` written by an older seedlab) with every field
    that ``cls`` has gained since filled in at its default, recursing into nested configs: so a run
    started before a field existed still matches the same config today (resume, pre-registration)."""
    out = dict(record)
    for name, f in cls.model_fields.items():
        sub = f.annotation if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel) else None
        if sub is not None and isinstance(out.get(name), dict):
            out[name] = with_new_defaults(sub, out[name])
        elif name not in out and not f.is_required():
            default = f.get_default(call_default_factory=True)
            out[name] = default.model_dump(mode="json") if isinstance(default, BaseModel) else default
    return out


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<config>"


def _members(ann: Any) -> list[Any]:
    """The types a value of annotation ``ann`` may have: unions and ``Annotated`` unwrapped."""
    origin = get_origin(ann)
    if origin is Annotated:
        return _members(get_args(ann)[0])
    if origin is Union or origin is types.UnionType:
        return [m for a in get_args(ann) for m in _members(a)]
    return [ann]


def _field_loc(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """An error's location as fields, list indices and mapping keys, walked through ``model``: the labels
    pydantic puts in for a union's forms (``list[int]``, ``constrained-int``, a discriminator's tag) left out."""
    kinds: list[Any] = [model]
    out: list[Any] = []
    for part in loc:
        models = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        holds = [k for k in kinds if get_origin(k) in (list, tuple, set, frozenset, dict)]
        if isinstance(part, str) and (m := next((k for k in models if part in k.model_fields), None)) is not None:
            out.append(part)
            kinds = _members(m.model_fields[part].annotation)
        elif isinstance(part, int) or any(get_origin(k) is dict for k in holds):  # an item or a key
            out.append(part)
            kinds = [m for k in holds for m in _members(get_args(k)[-1])] or kinds
        # else: a union's label: no field
    return tuple(out)


def format_validation_error(err: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """Turn pydantic's multi-line report into one line naming the first bad field. Several errors of that
    one field (a value that fits none of a union's forms: ``list[int] | int`` given ``abc``) are one
    problem: its line says what each form wanted. Other fields' problems are counted (``and 1 more``).
    ``model``: the config validated (its fields tell pydantic's union labels from field names)."""
    errors = err.errors()
    where = lambda e: _field_loc(model, e["loc"])
    e, loc = errors[0], where(errors[0])
    field = _loc(((prefix,) if prefix else ()) + loc)
    if e["type"] == "extra_forbidden":
        return f"{field}: unknown field (allowed: see the documented config fields)"
    msgs = list(dict.fromkeys(x["msg"].removeprefix("Value error, ") for x in errors if where(x) == loc))
    msg = msgs[0]
    m = re.match(r"^([A-Za-z_][\w.]*): (.*)$", msg)
    if m and len(msgs) == 1:  # a cross-field check names its own field, relative to where it ran
        field = f"{field}.{m.group(1)}" if loc or prefix else m.group(1)
        msg = m.group(2)
    elif len(msgs) > 1:  # one field, none of its forms fits
        should = "Input should be "
        msg = (should + " or ".join(x.removeprefix(should) for x in msgs) if all(x.startswith(should) for x in msgs)
               else "; or ".join(msgs))
    others = len({where(x) for x in errors} - {loc})
    more = f" (and {others} more)" if others else ""
    inp = e.get("input")
    got = "" if isinstance(inp, dict) or "got" in msg else f", got {inp!r}"
    return f"{field}: {msg}{got}{more}"


def parse(model: type[M], data: Any, prefix: str = "") -> M:
    """Validate ``data`` into ``model``; bad input becomes a one-line SeedlabError."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        # an unknown field gets the list of allowed ones, named from the model
        e = err.errors()[0]
        if e["type"] == "extra_forbidden":
            loc = _field_loc(model, e["loc"][:-1]) + e["loc"][-1:]  # the last: the unknown name
            allowed = _allowed_fields(model, loc[:-1])
            raise SeedlabError(
                f"{_loc(((prefix,) if prefix else ()) + loc)}: unknown field"
                f" (allowed: {', '.join(allowed)})"
            ) from None
        raise SeedlabError(format_validation_error(err, model, prefix)) from None


def _allowed_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Walk ``loc`` through nested models to list the fields allowed at that level."""
    cur: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(cur, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        cur = _model_in(ann)
        if cur is None:
            return []
    return list(getattr(cur, "model_fields", {}).keys())


def _model_in(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def load_yaml(path: str | Path) -> Any:
    """Read a YAML file with ``safe_load``; a missing or malformed file is a SeedlabError."""
    p = Path(path)
    if not p.is_file():
        raise SeedlabError(f"config: no such file {str(p)!r}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise SeedlabError(f"config: {p} is not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise SeedlabError(f"config: {p} must hold a mapping of fields, got {type(data).__name__}")
    return data


def config_file(study: str, config: str | Path) -> Path:
    """The YAML file a CONFIG argument names: a file path, else one of the study's presets."""
    from seedlab import presets

    p = Path(config)
    if p.is_file():
        return p
    found = presets.find(study, str(config))
    if found is None:
        raise SeedlabError(
            f"config: no such file {str(config)!r}, and no {study} preset of that name"
            f" (presets: {', '.join(presets.names(study))})"
        )
    return found


def example_override(model: type[BaseModel] | None, data: dict[str, Any]) -> str | None:
    """A ``--set`` example of this config's own: its first field that has a default, at the default
    (``model=mini``, ``model.layers=2``); without ``model``, the first value of ``data``; None if neither has one."""
    if model is not None:
        f = next((f for f in config_fields(model) if not f.section and not f.required), None)
        return None if f is None else f"{f.name}={yaml_value(f.default)}"
    key, node = "", data
    while isinstance(node, dict) and node:
        k, node = next(iter(node.items()))
        key = f"{key}.{k}" if key else str(k)
    return f"{key}={yaml_value(node)}" if key else None


def apply_overrides(data: dict[str, Any], overrides: list[str], model: type[BaseModel] | None = None) -> dict[str, Any]:
    """``--set train.epochs=100`` style overrides of ``data`` (a ``model``'s, if given: a malformed one's
    error shows one of its fields as the example); values are parsed as YAML."""
    for item in overrides:
        if "=" not in item:
            example = example_override(model, data)
            raise SeedlabError(f"--set: expected KEY=VALUE{f' (e.g. {example})' if example else ''}, got {item!r}")
        key, raw = item.split("=", 1)
        parts = key.split(".")
        cur = data
        for p in parts[:-1]:
            nxt = cur.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise SeedlabError(f"--set {key}: {p!r} is not a section")
            cur = nxt
        cur[parts[-1]] = yaml.safe_load(raw)
    return data


def load_config(model: type[M], study: str, config: str | Path, overrides: list[str] = ()) -> tuple[M, Path]:
    """A CONFIG argument (file or preset name) with ``--set`` overrides, validated into ``model``;
    also the config file's folder, which the config's own relative paths are relative to."""
    path = config_file(study, config)
    return parse(model, apply_overrides(load_yaml(path), list(overrides), model)), path.parent


@dataclass(frozen=True)
class FieldDoc:
    """One field of a config, as ``--set`` names it."""

    name: str  # dotted from the top config: "candidates.heldout"
    help: str  # its Field(description=...)
    default: Any  # JSON-able; None when required (or a section)
    required: bool
    value: Any  # its value in the config walked (JSON-able); without one, the default
    section: bool  # a nested config: its own fields follow, named ``name.<field>``


def config_fields(model: type[BaseModel], config: BaseModel | None = None, prefix: str = "") -> list[FieldDoc]:
    """Every field of ``model``, depth first in declaration order, with its help, default and (given
    ``config``, an instance) its value. A field holding a nested config is a section followed by the
    nested fields; where a union's value is not that config (``grid`` as a list of grids) the field
    is one row holding the whole value."""
    dumped = config.model_dump(mode="json") if config is not None else {}
    out = []
    for name, f in model.model_fields.items():
        dotted = f"{prefix}{name}"
        sub, here = _model_in(f.annotation), getattr(config, name, None)
        if sub is not None and (config is None or isinstance(here, sub)):
            out.append(FieldDoc(dotted, f.description or "", None, False, None, True))
            out += config_fields(sub, here, f"{dotted}.")
            continue
        required = f.is_required()
        default = None if required else to_jsonable_python(f.get_default(call_default_factory=True))
        out.append(FieldDoc(dotted, f.description or "", default, required,
                            dumped[name] if config is not None else default, False))
    return out


def yaml_value(v: Any) -> str:
    """A JSON-able value as ``--set`` would take it: YAML flow style (``[0, 1]``, ``null``, ``mini``)."""
    text = yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=float("inf"), allow_unicode=True)
    return text.removesuffix("\n...\n").strip()


def resolve(target: str) -> type[BaseModel]:
    """The config class a ``"package.module:Class"`` string names (how a study's CLI names its
    configs without importing them)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


"""Loading one `params.yaml` section into a stage's frozen config dataclass.

Each stage defines its own dataclass next to its code (cleanrl style: one field per option, a
one-line docstring/comment per field) and loads it with `load_section`. Unknown keys and wrong
types fail with the file, the section and the key, so a typo never silently falls back to a
default.

    from rcgrpo.config import load_section
    cfg = load_section("sft", SFTConfig)                       # from ./params.yaml
    cfg = load_section("sft", SFTConfig, overrides={"lr": 1e-5})
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import yaml

from rcgrpo.runtime import project_root


class ConfigError(ValueError):
    """A params.yaml section that does not fit its dataclass."""


def params_path() -> Path:
    return project_root() / "params.yaml"


def read_params(path: Path | None = None) -> dict:
    path = Path(path) if path else params_path()
    if not path.exists():
        raise ConfigError(f"{path} not found: run from the rcgrpo checkout or pass --params")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections")
    return data


def _type_ok(value, annotation) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin in (list, tuple):
        return isinstance(value, list | tuple)
    if origin is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation) if isinstance(annotation, type) else True


def build(cls, values: dict, where: str):
    """Instantiate dataclass `cls` from `values`, checking names and types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    for key, value in values.items():
        if not _type_ok(value, hints[key]):
            raise ConfigError(f"{where}.{key}: {value!r} is not a {hints[key]}")
        if isinstance(value, list) and typing.get_origin(hints[key]) is tuple:
            values[key] = tuple(value)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def load_section(section: str, cls, path: Path | None = None, overrides: dict | None = None):
    """The dataclass for `section` of params.yaml, with `overrides` applied on top."""
    params = read_params(path)
    values = dict(params.get(section) or {})
    values.update(overrides or {})
    return build(cls, values, f"{path or params_path()}:{section}")

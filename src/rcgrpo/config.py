"""Loading one `params.yaml` section into a stage's frozen config dataclass.

Each stage defines its own dataclass next to its code (cleanrl style: one field per option, a
one-line docstring/comment per field) and loads it with `load_section`. Unknown keys and wrong
types fail with the file, the section and the key, so a typo never silently falls back to a
default.

    from rcgrpo.config import load_section
    cfg = load_section("sft", SFTConfig)                       # from ./params.yaml
    cfg = load_section("sft", SFTConfig, overrides={"lr": 1e-5})
    ov = parse_sets(["rl.steps=2"], sectioned=True)   # the CLI's --set, checked before any work

`parse_sets` is what every CLI `--set` goes through: a bad value, an unknown section or an
unknown key fails at once with the `--set` named and the valid names (or the closest one) listed,
before any import of prefect or any training starts (tests/test_config.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import types
import typing
from pathlib import Path

import yaml

from rcgrpo.runtime import project_root


class ConfigError(ValueError):
    """A params.yaml section that does not fit its dataclass."""


def ranged(default, interval: str):
    """A config field whose value (or each element of a tuple value) must lie in `interval`,
    written as in maths: "[0, 1]", "(0, inf)", "[1, inf)". Declared beside the field's help,
    checked by `build` before anything runs:

        p_high: float = ranged(0.5, "[0, 1]")  # P(<|high_reward|>) per rollout
    """
    parse_interval(interval)  # a typo fails when the module is imported
    return dataclasses.field(default=default, metadata={"range": interval})


def parse_interval(interval: str) -> tuple[float, bool, float, bool]:
    """Parse "[0, 1)" -> (0.0, True, 1.0, False): the bounds and whether each is included."""
    s = interval.strip()
    lo, sep, hi = s[1:-1].partition(",")
    if s[:1] not in "[(" or s[-1:] not in "])" or not sep:
        raise ValueError(f"not an interval: {interval!r} (write e.g. '[0, 1]' or '(0, inf)')")
    return float(lo), s[0] == "[", float(hi), s[-1] == "]"


def out_of_range(value, interval: str) -> bool:
    """Whether a number (or any element of a list/tuple) lies outside `interval`."""
    if isinstance(value, list | tuple):
        return any(out_of_range(v, interval) for v in value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False  # the type check reports it
    lo, lo_in, hi, hi_in = parse_interval(interval)
    return not ((lo <= value if lo_in else lo < value) and (value <= hi if hi_in else value < hi))


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
        raise ConfigError(
            f"{where}: unknown key(s) {unknown}{_close(unknown[0], names)}; allowed: {sorted(names)}"
        )
    ranges = {f.name: f.metadata["range"] for f in dataclasses.fields(cls) if "range" in f.metadata}
    for key, value in values.items():
        if not _type_ok(value, hints[key]):
            raise ConfigError(f"{where}.{key}: {value!r} is not a {hints[key]}")
        if key in ranges and out_of_range(value, ranges[key]):
            raise ConfigError(f"{where}.{key}={value!r}: must be in {ranges[key]}")
        if isinstance(value, list) and typing.get_origin(hints[key]) is tuple:
            values[key] = tuple(value)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def load_section(section: str, cls, path: Path | None = None, overrides: dict | None = None):
    """The dataclass for `section` of params.yaml, with `overrides` applied on top (and, for a
    process-wide section, the `--set`s the CLI exported: see `export_process_sets`)."""
    params = read_params(path)
    values = dict(params.get(section) or {})
    if section in PROCESS_SECTIONS:
        values.update(_exported().get(section, {}))
    values.update(overrides or {})
    return build(cls, values, f"{path or params_path()}:{section}")


# Sections read deep inside, in whatever process does the work (a tool worker, a Ray actor, a
# Prefect task), not passed down as flow parameters: the CLI exports their `--set`s in this
# environment variable, which every child process inherits.
PROCESS_SECTIONS = ("env", "execution")
PROCESS_SETS_ENV = "RCGRPO_PROCESS_SETS"


def export_process_sets(overrides: dict) -> None:
    """Make the `--set env.* / execution.*` of this command hold in this process and in every
    process it starts (call before any of them starts: the tool worker reads them once)."""
    import json
    import os

    chosen = {k: overrides[k] for k in PROCESS_SECTIONS if overrides.get(k)}
    if chosen:
        os.environ[PROCESS_SETS_ENV] = json.dumps(chosen)


def _exported() -> dict:
    import json
    import os

    raw = os.environ.get(PROCESS_SETS_ENV, "")
    try:
        value = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"${PROCESS_SETS_ENV} is not a JSON object of sections: {raw[:80]!r}")
    return value


# params.yaml section -> its dataclass ("module:Class", imported only when a --set names it)
SECTIONS = {
    "rctp": "rcgrpo.training.sft:SFTConfig",
    "sft": "rcgrpo.training.sft:SFTConfig",
    "rl": "rcgrpo.training.grpo.config:RLConfig",
    "eval": "rcgrpo.evaluation.evaluate:EvalConfig",
    "model": "rcgrpo.models.profiles:ModelConfig",
    "rollout": "rcgrpo.rollout.engine:RolloutConfig",
    "dataset": "rcgrpo.data.dataset:DatasetConfig",
    "env": "rcgrpo.bfcl.sandbox:EnvConfig",
    "execution": "rcgrpo.rollout.execution:ExecutionConfig",
    "traces": "rcgrpo.tracking.traces:TracesConfig",
}


def _close(word: str, names) -> str:
    match = difflib.get_close_matches(word, sorted(names), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def section_class(section: str):
    module, name = SECTIONS[section].split(":")
    return getattr(importlib.import_module(module), name)


def parse_sets(
    pairs: list[str], sectioned: bool, section: str | None = None, path: Path | None = None
) -> dict:
    """CLI `--set` pairs -> overrides, each checked against its section's dataclass on top of
    params.yaml. sectioned: "section.key=value" -> {section: {key: value}}; else "key=value" for
    the one `section` -> {key: value}. Raises ConfigError naming the offending `--set`."""
    import yaml

    params = read_params(path)
    out: dict = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        name, key = (key.strip().partition(".")[::2]) if sectioned else (section, key.strip())
        if not sep or not name or not key:
            form = "section.key=value" if sectioned else "key=value"
            raise ConfigError(f"--set {pair}: not {form}")
        if name not in SECTIONS:
            raise ConfigError(
                f"--set {pair}: unknown section {name!r}{_close(name, SECTIONS)}; "
                f"valid: {sorted(SECTIONS)}"
            )
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {pair}: value is not YAML ({e.problem})") from None
        cls = section_class(name)
        names = {f.name for f in dataclasses.fields(cls)}
        if key not in names:
            raise ConfigError(
                f"--set {pair}: {name} has no key {key!r}{_close(key, names)}; "
                f"valid: {sorted(names)}"
            )
        hint = typing.get_type_hints(cls)[key]
        if not _type_ok(value, hint):
            raise ConfigError(f"--set {pair}: {value!r} is not a {_type_name(hint)}")
        out.setdefault(name, {})[key] = value
    for name, values in out.items():  # the fields together (a __post_init__ check)
        base = dict(params.get(name) or {})
        build(section_class(name), {**base, **values}, f"--set {name}.{'/'.join(values)}")
    return out if sectioned else out.get(section, {})


def _type_name(hint) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")

"""Loading one `params.yaml` section into a stage's frozen config dataclass, checked in one place.

Each stage defines its own `@config_class` next to its code (cleanrl style: one field per option,
its rule and help in its declaration: `ranged(0.5, "[0, 1]", "help")`, `setting("hf", "help")`,
choices as a `Literal`; rcgrpo.fields) and loads it with `load_section`; `build` checks names,
types (list elements too), intervals and choices before anything starts, and `rcgrpo config
show` prints them. A bad value fails in one line that names the field and the rule:

    error: rl.p_high=7.0: must be in [0, 1]
    error: model.dtype=float99: must be one of float32, bfloat16, float16 (params.yaml presets.paper)

`--set` (parse_sets), `--params` files, params.yaml and its presets (check_params) all go through
it. YAML values are read as YAML 1.2 reads numbers (`1e-5` is a float; YAML 1.1 says string).

    from rcgrpo.config import load_section
    cfg = load_section("sft", SFTConfig)                       # from ./params.yaml
    ov = parse_sets(["rl.steps=2"], sectioned=True)   # the CLI's --set, checked before any work

    .venv/bin/pytest tests/test_config.py tests/test_settings.py -q
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import typing
from pathlib import Path

import yaml

from rcgrpo.fields import coerce, field_problem, show, yaml_load
from rcgrpo.runtime import project_root


class ConfigError(ValueError):
    """A params.yaml section (or a --set) that does not fit its dataclass."""


def params_path() -> Path:
    return project_root() / "params.yaml"


def utf8(raw: bytes, where: str) -> str:
    """`raw` as text; ConfigError in one line naming the line of the first byte that is not
    UTF-8 (a traceback before)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"{where}: line {line}: byte {raw[e.start]:#04x} is not UTF-8") from None


def read_params(path: Path | None = None) -> dict:
    path = Path(path) if path else params_path()
    if not path.exists():
        raise ConfigError(f"{path} not found: run from the rcgrpo checkout or pass --params")
    text = utf8(path.read_bytes(), str(path))
    try:
        data = yaml_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections")
    return data


def build(cls, values: dict, section: str, source: str = ""):
    """Instantiate dataclass `cls` (params.yaml section `section`) from `values`, checking names,
    types, choices and intervals; `source` (e.g. the params.yaml path) ends each message."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    where = f" ({source})" if source else ""
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"{section}: unknown key(s) {unknown}{_close(unknown[0], names)}; "
            f"allowed: {sorted(names)}{where}"
        )
    values = dict(values)
    for key, value in values.items():
        if why := field_problem(cls, key, value):
            raise ConfigError(f"{section}.{key}={show(value)}: {why}{where}")
        values[key] = coerce(value, hints[key])
    try:
        return cls(**values)
    except (TypeError, ValueError, ArithmeticError) as e:  # a __post_init__ rule over fields
        raise ConfigError(f"{section}: {e}{where}") from None


def load_section(section: str, cls, path: Path | None = None, overrides: dict | None = None):
    """The dataclass for `section` of params.yaml, with `overrides` applied on top (a whole
    run's sections are resolved together by rcgrpo.run_config.resolve)."""
    params = read_params(path)
    values = dict(params.get(section) or {})
    values.update(overrides or {})
    return build(cls, values, section, str(path or params_path()))


# params.yaml section -> its dataclass ("module:Class", imported only when a --set names it)
SECTIONS = {
    "rctp": "rcgrpo.training.sft_config:SFTConfig",
    "sft": "rcgrpo.training.sft_config:SFTConfig",
    "rl": "rcgrpo.training.grpo.config:RLConfig",
    "eval": "rcgrpo.evaluation.config:EvalConfig",
    "model": "rcgrpo.models.profiles:ModelConfig",
    "rollout": "rcgrpo.rollout.config:RolloutConfig",
    "dataset": "rcgrpo.data.dataset:DatasetConfig",
    "env": "rcgrpo.envs.config:EnvConfig",
    "execution": "rcgrpo.rollout.execution:ExecutionConfig",
    "traces": "rcgrpo.tracking.traces:TracesConfig",
    "retention": "rcgrpo.tracking.retention:RetentionConfig",
}


def _close(word: str, names) -> str:
    match = difflib.get_close_matches(word, sorted(names), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def section_class(section: str):
    module, name = SECTIONS[section].split(":")
    return getattr(importlib.import_module(module), name)


def check_params(sections=None, path: Path | None = None, preset: str | None = None) -> None:
    """Build every section of params.yaml as it stands (`sections`: default all of SECTIONS),
    then with the preset `preset` (params.yaml `presets:`) on top, so a bad value anywhere fails
    before anything starts, in one line naming where it is (ConfigError)."""
    params = read_params(path)
    where = str(path or params_path())
    presets = params.get("presets") or {}
    layer = (presets.get(preset) or {}) if preset else {}
    if not isinstance(layer, dict):
        raise ConfigError(f"presets.{preset} must map sections to fields ({where})")
    for name in sections or SECTIONS:
        base = params.get(name) or {}
        if not isinstance(base, dict):
            raise ConfigError(f"{name}: must be a mapping of fields ({where})")
        build(section_class(name), base, name, where)
        if layer.get(name):
            values = {**base, **layer[name]}
            build(section_class(name), values, name, f"{where} presets.{preset}")


def parse_sets(
    pairs: list[str],
    sectioned: bool,
    section: str | None = None,
    path: Path | None = None,
    together: bool = True,
) -> dict:
    """CLI `--set` pairs -> overrides, each checked against its section's dataclass on top of
    params.yaml. sectioned: "section.key=value" -> {section: {key: value}}; else "key=value" for
    the one `section` -> {key: value}. Raises ConfigError naming the offending `--set`:
    `rl.p_high=7.0: must be in [0, 1]`. together: also check the rules over several fields (a
    __post_init__) on params.yaml's section; off where a preset comes in between (`rcgrpo run`
    checks the section as it will run, preset included: rcgrpo.run_config.resolve)."""
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
            value = yaml_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {pair}: value is not YAML ({e.problem})") from None
        cls = section_class(name)
        names = {f.name for f in dataclasses.fields(cls)}
        if key not in names:
            raise ConfigError(
                f"--set {pair}: {name} has no key {key!r}{_close(key, names)}; "
                f"valid: {sorted(names)}"
            )
        if why := field_problem(cls, key, value):
            raise ConfigError(f"{name}.{key}={raw.strip()}: {why}")
        out.setdefault(name, {})[key] = value
    params = read_params(path) if together and out else {}
    for name, values in out.items() if together else ():  # the fields together (__post_init__)
        base = dict(params.get(name) or {})
        sets = " ".join(f"--set {name}.{k}={show(v)}" for k, v in values.items())
        build(section_class(name), {**base, **values}, name, f"with {sets}")
    return out if sectioned else out.get(section, {})

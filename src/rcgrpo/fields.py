"""The value rules of a config field, below every stage: its interval (`ranged`), its type with
list elements, its choices (`Literal`), and YAML as params.yaml means it (`1e-5` is a float).

rcgrpo.config builds params.yaml sections with these. A stage declares each field once, its rule
and its help together (`rcgrpo config show SECTION` prints them; params.yaml's comments are
written from them by `rcgrpo config comments`); `@config_class` checks every field against its
declaration whenever the dataclass is made, so `__post_init__` keeps only rules over several:

    @config_class
    class RLConfig:
        p_high: float = ranged(0.5, "[0, 1]", "P(<|high_reward|>) per rollout")
        dtype: Literal["float32", "bfloat16"] = setting("float32", "torch dtype")  # choices

    field_problem(RLConfig, "p_high", 7.0)   # -> "must be in [0, 1]"
    .venv/bin/pytest tests/test_settings.py -q
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing

import yaml


def ranged(default, interval: str, help: str):
    """A numeric config field whose value (or each element of a tuple value) must lie in
    `interval`, written as in maths: "[0, 1]", "(0, inf)", "[1, inf)"; checked by `build` before
    anything runs:

        p_high: float = ranged(0.5, "[0, 1]", "P(<|high_reward|>) per rollout")
    """
    parse_interval(interval)  # a typo fails when the module is imported
    return dataclasses.field(default=default, metadata={"range": interval, "help": help})


def setting(default, help: str):
    """A config field that is not a number: a string, a flag, a list, or a `Literal` of choices
    (the annotation carries the choices, `build` checks them):

        engine: Literal["hf", "vllm"] = setting("hf", "hf: transformers; vllm: a vLLM server")
    """
    return dataclasses.field(default=default, metadata={"help": help})


def config_class(cls):
    """`@dataclass(frozen=True)` for a params.yaml section whose fields are checked against their
    declarations (type, choices, interval) whenever one is made, from params.yaml or in code;
    the class's own `__post_init__` then checks the rules that span several fields."""
    own = cls.__dict__.get("__post_init__")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if why := field_problem(type(self), f.name, value):
                raise ValueError(f"{type(self).__name__}.{f.name}={show(value)}: {why}")
        if own is not None:
            own(self)

    cls.__post_init__ = __post_init__
    return dataclasses.dataclass(frozen=True)(cls)


def help_of(field: dataclasses.Field) -> str:
    return field.metadata.get("help", "")


def rule(hint, field: dataclasses.Field) -> str:
    """A field's rule in words: its interval, its choices, or its type ('[0, 1]', 'hf | vllm')."""
    if "range" in field.metadata:
        return field.metadata["range"]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return " | ".join(show(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else rule(a, field) for a in args)
    if origin in (list, tuple):
        return f"list of {rule(args[0], field)}" if args else "list"
    return {int: "int", float: "number", str: "string", bool: "true | false"}.get(hint, str(hint))


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


# -- YAML as params.yaml is meant: `1e-5` is a float (YAML 1.2; PyYAML follows 1.1, where a float
# needs a dot, so `lr: 1e-5` or `--set lr=1e-5` was the string "1e-5") -------------------------
class _Loader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        """Aliases refused: a 1 kB alias bomb expands to hundreds of millions of leaves, and
        printing its error (the value) hung the CLI. params.yaml has no use for them."""
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases (*{event.anchor}) are not accepted", event.start_mark
            )
        return super().compose_node(parent, index)


_Loader.yaml_implicit_resolvers = {
    k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def yaml_load(text: str):
    """yaml.safe_load, with YAML 1.2's exponent floats (`1e-5`, `2E3`)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


# -- one field's value: type (list elements too), choices, interval ------------------------------
def _type_ok(value, annotation) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in args)
    if annotation is type(None):
        return value is None
    if origin is typing.Literal:
        return not isinstance(value, list | dict) and value in args
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, str]: fixed
            return len(value) == len(args) and all(map(_type_ok, value, args))
        return not args or all(_type_ok(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation) if isinstance(annotation, type) else True


def describe(hint) -> str:
    """What a value of type `hint` must be, in words: 'an int', 'one of hf, vllm', ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(show(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else describe(a) for a in args)
    if origin in (list, tuple):
        return (
            f"a list of {describe(args[0]).removeprefix('an ').removeprefix('a ')}"
            if args
            else "a list"
        )
    names = {
        int: "an int",
        float: "a number",
        str: "a string",
        bool: "true or false",
        dict: "a mapping",
    }
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def show(value) -> str:
    """A value as it would be written in params.yaml or a --set: 7.0, float99, [a, b], null."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value) if isinstance(value, str) else repr(value)


def field_problem(cls, key: str, value) -> str | None:
    """Why `value` does not fit field `key` of dataclass `cls` ('must be in [0, 1]'), or None."""
    f, hint = _declared(cls)[key]
    if not _type_ok(value, hint):
        return f"must be {describe(hint)}"
    if "range" in f.metadata and out_of_range(value, f.metadata["range"]):
        return f"must be in {f.metadata['range']}"
    return None


@functools.cache
def _declared(cls) -> dict[str, tuple[dataclasses.Field, object]]:
    """field name -> (its dataclasses.Field, its resolved type), once per class."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls)}


def coerce(value, hint):
    """YAML lists -> tuples for tuple fields; an int given for a float field -> float."""
    if isinstance(value, list) and typing.get_origin(hint) is tuple:
        return tuple(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value

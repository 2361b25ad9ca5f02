"""The safe tool-call parser and dispatcher: model text is data, never code.

A model writes tool calls in one of two forms, and `parse_calls` reads both:
  * JSON objects `{"name": "cd", "arguments": {"folder": "document"}}` — bare, several in a row,
    a JSON list of them, or each inside `<tool_call>...</tool_call>` tags ("parameters" is
    accepted for "arguments", as Llama 3.1 writes it);
  * BFCL's Python-call syntax `cd(folder='document')`, or a list `[cd(folder='a'), ls()]`.
Python syntax goes through `ast.parse` and a whitelist walker: the callee must be a bare name and
every argument a literal (str, number, bool, None, and lists/tuples/dicts/sets of those). Nothing
is ever handed to eval/exec; `10**10**10`, lambdas, attribute chains, f-strings and comprehensions
are rejected at parse time. Text and literal sizes are capped before and during parsing.

Where the calls sit in a message (tags, a fence, text that starts like a call) is found by
rcgrpo.bfcl.call_text. Every accepted call is in the one form the checkers score: JSON names and argument keys must be
ASCII identifiers (a key such as `source='a', destination='b') #` would otherwise be written
into the stored call string as code), every number finite (`NaN` runs live but its string
`nan` does not read back), and `str(call)` must read back as the same call. A call that fails
any of these is an error observation and never runs, so what is scored is what ran.
rcgrpo.bfcl.dispatch runs the accepted calls.
Try it: `rcgrpo env run multi_turn_base_0 --calls calls.json`.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
import warnings
from dataclasses import dataclass, field

from rcgrpo.bfcl.call_text import looks_like_a_call, tagged, unfenced

MAX_TEXT_CHARS = 32_000  # longest model text we parse; longer is rejected unread
MAX_DEPTH = 16  # deepest literal nesting accepted
MAX_NODES = 4_000  # most literal elements in one text
MAX_CALLS = 64  # most calls in one model message

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # ASCII only: ast folds others by NFKC


class CallError(ValueError):
    """A model text that tried to call a tool but is not an acceptable call."""


@dataclass(frozen=True)
class Call:
    """One parsed call: a function name and literal arguments."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __str__(self) -> str:
        """BFCL's python-call form, e.g. `cd(folder='document')` (reprs are literals)."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"


@dataclass
class Parsed:
    """What `parse_calls` found: the calls, and an error message per rejected part."""

    calls: list[Call]
    errors: list[str]

    @property
    def attempted(self) -> bool:
        return bool(self.calls or self.errors)


class _Budget:
    """Counts literal elements across one text so a huge literal is cut off early."""

    nodes = 0

    def take(self, node: ast.AST | None = None) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise CallError(f"arguments hold more than {MAX_NODES} literal elements")
        value = getattr(getattr(node, "operand", node), "value", None)  # `x` or `-x`
        if type(value) is int and value.bit_length() > 13_000:  # `0x<3,700 hex digits>` parses
            raise CallError("integer literal over 13,000 bits (str() prints <= 4,300 digits)")


def _finite(value):
    """`value`, unless it is an infinite or NaN float (`1e999`, JSON `NaN`/`Infinity`)."""
    if type(value) is float and not math.isfinite(value):
        raise CallError(f"argument value {value!r} is not a finite number")
    return value


def _identifier(name, what: str) -> str:
    """`name` if it is an ASCII Python identifier and no keyword, else CallError."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name) or keyword.iskeyword(name):
        raise CallError(f"{what} {name!r} is not a plain identifier such as `file_name`")
    return name


def _literal(node: ast.AST, budget: _Budget, depth: int = 0):
    """Evaluate a whitelisted literal node; anything else raises CallError naming the node."""
    budget.take(node)
    if depth > MAX_DEPTH:
        raise CallError(f"literal nested deeper than {MAX_DEPTH} levels")
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool | None):
        return _finite(node.value)
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub | ast.UAdd)
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float)
    ):
        value = _finite(node.operand.value)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        items = [_literal(e, budget, depth + 1) for e in node.elts]
        if isinstance(node, ast.List):
            return items
        return tuple(items) if isinstance(node, ast.Tuple) else set(items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise CallError("`**` unpacking is not a literal")
        return {
            _literal(k, budget, depth + 1): _literal(v, budget, depth + 1)
            for k, v in zip(node.keys, node.values, strict=True)
        }
    where = f" at column {node.col_offset}" if hasattr(node, "col_offset") else ""
    raise CallError(f"only literal arguments are accepted; got {type(node).__name__}{where}")


def _call_from_ast(node: ast.AST, budget: _Budget) -> Call:
    if not isinstance(node, ast.Call):
        raise CallError(f"expected a function call, got {type(node).__name__}")
    if not isinstance(node.func, ast.Name):
        raise CallError(
            f"the called function must be a bare name such as `ls`; got {type(node.func).__name__}"
        )
    kwargs = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise CallError("`**` unpacking is not allowed in a call")
        kwargs[kw.arg] = _literal(kw.value, budget)
    if any(isinstance(a, ast.Starred) for a in node.args):
        raise CallError("`*` unpacking is not allowed in a call")
    return Call(node.func.id, tuple(_literal(a, budget) for a in node.args), kwargs)


def _check_json_value(value, budget: _Budget, depth: int = 0) -> None:
    budget.take()
    if depth > MAX_DEPTH:
        raise CallError(f"JSON arguments nested deeper than {MAX_DEPTH} levels")
    _finite(value)
    children = (
        value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    )
    for child in children:
        _check_json_value(child, budget, depth + 1)


def _call_from_json(obj, budget: _Budget) -> Call:
    if not isinstance(obj, dict):
        raise CallError(f"a JSON tool call must be an object, got {type(obj).__name__}")
    name = obj.get("name", obj.get("function"))
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI-style: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise CallError(f"arguments of {name!r} are not valid JSON: {e.msg}") from None
    if not isinstance(name, str) or not name:
        raise CallError('a JSON tool call needs a "name" string')
    if not isinstance(args, dict):
        raise CallError(f'"arguments" of {name!r} must be an object')
    _identifier(name, "function name")
    for key in args:
        _identifier(key, f"argument name of {name!r}")
    _check_json_value(args, budget)
    return Call(name, (), dict(args))


def _parse_json(text: str, budget: _Budget) -> list[Call]:
    """One or more JSON values in a row (objects or lists of objects)."""
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
        if pos == len(text):
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise CallError(f"malformed JSON tool call at character {e.pos}: {e.msg}") from None
        for obj in value if isinstance(value, list) else [value]:
            calls.append(_call_from_json(obj, budget))
    return calls


def _quiet_parse(text: str, mode: str):
    """ast.parse without the SyntaxWarnings (e.g. "invalid decimal literal" for `1st`) that
    model text would print on stderr: a bad text is a CallError, never a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(text, mode=mode)


def _parse_python(text: str, budget: _Budget) -> list[Call]:
    try:
        tree = _quiet_parse(text, "eval").body
        nodes = tree.elts if isinstance(tree, ast.List | ast.Tuple) else [tree]
    except SyntaxError:
        try:  # several calls on separate lines
            module = _quiet_parse(text, "exec")
        except SyntaxError as e:
            raise CallError(
                f"not a valid call: {e.msg} (line {e.lineno}, column {e.offset})"
            ) from None
        if not all(isinstance(s, ast.Expr) for s in module.body):
            raise CallError("only function calls are accepted, not statements") from None
        nodes = [s.value for s in module.body]
    return [_call_from_ast(n, budget) for n in nodes]


def _parse_block(block: str, budget: _Budget) -> list[Call]:
    inside = unfenced(block.strip())
    block = block.strip() if inside is None else inside
    if block.startswith("{") or re.match(r"^\[\s*\{", block):
        return _parse_json(block, budget)
    return _parse_python(block, budget)


def parse_calls(text: str) -> Parsed:
    """Parse the tool calls in one model message. Plain prose gives no calls and no errors.

    Each call is kept only if its canonical string `str(call)` reads back as the same call:
    that string is what the trajectory stores and the checkers replay.
    """
    parsed = _parse_text(text)
    calls, errors = [], []
    for call in parsed.calls:
        try:
            again = _parse_text(str(call))
        except Exception:  # noqa: BLE001 - any failure to read back means: not runnable
            again = Parsed([], ["unreadable"])
        if again.errors or again.calls != [call] or str(again.calls[0]) != str(call):
            errors.append(f"call {call.name!r} has no canonical form that reads back the same")
        else:
            calls.append(call)
    return Parsed(calls, errors + parsed.errors)


def _parse_text(text: str) -> Parsed:
    """`parse_calls` without the read-back check."""
    if len(text) > MAX_TEXT_CHARS:
        return Parsed([], [f"message of {len(text)} characters is over the {MAX_TEXT_CHARS} limit"])
    blocks = tagged(text)
    stripped = text.strip()
    body = unfenced(stripped)
    body = stripped if body is None else body
    if not blocks:
        if not looks_like_a_call(body):
            return Parsed([], [])
        blocks = [body]
    budget, calls, errors = _Budget(), [], []
    for block in blocks:
        try:
            calls.extend(_parse_block(block, budget))
        except CallError as e:
            errors.append(str(e))
        except Exception as e:  # noqa: BLE001 - any other failure (`{[1]}`: TypeError) rejects the text
            errors.append(f"call text rejected: {type(e).__name__}")
    if len(calls) > MAX_CALLS:
        return Parsed([], [f"{len(calls)} calls in one message is over the {MAX_CALLS} limit"])
    return Parsed(calls, errors)

"""Run one parsed call against the functions an episode makes available, and render its result.

`dispatch` calls only a public method found in the mapping the episode passes in (the functions
available in this turn). Results are rendered exactly as bfcl-eval renders them (str as is, dict
as JSON, anything else `str()`, an exception inside a tool as "Error during execution: ...") so
the checkers can compare them with bfcl-eval's own runs. Apart from the parser
(rcgrpo.bfcl.executor) because parsing is about text and this is about running code.

    .venv/bin/pytest tests/test_executor.py -q
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
from collections.abc import Callable, Mapping

from rcgrpo.bfcl.executor import Call


def format_result(value) -> str:
    """Render a tool's return value exactly as bfcl-eval's executor does."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:
            return str(value)
    return str(value)


@functools.cache
def _mutable_defaults(function: Callable) -> tuple[tuple[str, object], ...]:
    """(name, pristine copy) of each list/dict/set default of a tool function.

    bfcl-eval's `TwitterAPI.post_tweet(tags=[], mentions=[])` stores the default list and
    `mention()` extends it, so without care one episode's mentions leak into every later
    episode of the process. Snapshotted the first time the function is seen (memo per function).
    """
    return tuple(
        (name, copy.deepcopy(p.default))
        for name, p in inspect.signature(function).parameters.items()
        if isinstance(p.default, list | dict | set)
    )


def _with_fresh_defaults(method: Callable, call: Call) -> dict:
    """The call's kwargs plus a fresh copy of every mutable default the call leaves out."""
    defaults = _mutable_defaults(getattr(method, "__func__", method))
    if not defaults:
        return call.kwargs
    try:
        given = inspect.signature(method).bind_partial(*call.args, **call.kwargs).arguments
    except TypeError:  # the call itself will raise the same TypeError, as an observation
        return call.kwargs
    return {**call.kwargs, **{n: copy.deepcopy(d) for n, d in defaults if n not in given}}


def dispatch(call: Call, functions: Mapping[str, Callable]) -> tuple[bool, str]:
    """Run one call against the available functions; returns (ran_without_error, observation).

    `functions` maps public method names to bound methods of this episode's instances. A name
    outside it (private, hidden in this turn, of a class the task does not involve, or made up)
    is never looked up anywhere else.
    """
    method = functions.get(call.name) if not call.name.startswith("_") else None
    if method is None:
        return False, f"Error during execution: function {call.name!r} is not available"
    try:
        return True, format_result(method(*call.args, **_with_fresh_defaults(method, call)))
    except MemoryError:  # not the tool's answer: the caller (the sandbox worker) handles it
        raise
    except Exception as e:  # a tool's own failure is an observation for the model
        return False, f"Error during execution: {e}"

"""Failure trajectories made from an expert's (source b of rcgrpo.data.failures): its calls changed
the way real agents get them wrong, re-executed in a fresh episode (real observations), re-scored,
and kept only when they are usable failures (the data stage's rule, `failures.refusal`, passed in
as `usable`), recorded in
provenance.generator as "perturbation:<kind>". Kinds:
  wrong_tool        one call goes to another tool that accepts the same arguments (cp for mv)
  wrong_argument    one argument value altered (a near-miss name, an off-by-one number)
  missing_argument  one argument left out
  missing_call      one call left out
  extra_call        a state-changing call repeated (a second post, a second cd ...)
  stop_early        the calls stop after k of n (the agent ends the task too soon)
A perturbation that still earns paper reward 1 (a harmless change) is not a failure: the next
seeded candidate is tried, up to `attempts` per kind.

    .venv/bin/python -c "from rcgrpo.envs.bfcl.perturbations import *; from rcgrpo.bfcl.tasks import get_task; print([t.provenance.generator for t in perturbations(get_task('multi_turn_base_0'), 'combined', seed=0)])"
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

from rcgrpo.bfcl.executor import Call
from rcgrpo.bfcl.replay import parse_call_string
from rcgrpo.bfcl.tasks import Task
from rcgrpo.chat.record import Provenance, Trajectory
from rcgrpo.envs.bfcl.experts import DONE, expert_calls, scored

KINDS = (
    "wrong_tool",
    "wrong_argument",
    "missing_argument",
    "missing_call",
    "extra_call",
    "stop_early",
)
# Swaps agents are seen to make; other candidates come from tools with a compatible signature.
PREFERRED_SWAPS = {"mv": "cp", "cp": "mv", "rm": "rmdir", "head": "tail", "tail": "head"}

Calls = list[list[list[str]]]
Position = tuple[int, int, int]  # (turn, step, index in step)


def _positions(calls: Calls) -> list[Position]:
    return [
        (t, s, i)
        for t, turn in enumerate(calls)
        for s, step in enumerate(turn)
        for i, text in enumerate(step)
        if text != DONE
    ]


def _get(calls: Calls, pos: Position) -> str:
    return calls[pos[0]][pos[1]][pos[2]]


def _set(calls: Calls, pos: Position, text: str | None) -> Calls:
    """A copy of `calls` with the call at `pos` replaced (None: removed; empty steps dropped)."""
    out = copy.deepcopy(calls)
    step = out[pos[0]][pos[1]]
    if text is None:
        del step[pos[2]]
    else:
        step[pos[2]] = text
    out[pos[0]] = [s for s in out[pos[0]] if s]
    return out


def _compatible_tools(task: Task, call: Call) -> list[str]:
    """Other tools of the task whose documented parameters accept exactly these keywords."""
    names = []
    for doc in task.function_docs:
        params = doc.get("parameters", {})
        props, required = set(params.get("properties", {})), set(params.get("required", []))
        if doc["name"] != call.name and set(call.kwargs) <= props and required <= set(call.kwargs):
            names.append(doc["name"])
    preferred = PREFERRED_SWAPS.get(call.name)
    return sorted(names, key=lambda n: (n != preferred, n))


def _altered(value, rng: random.Random):
    """A plausible wrong value of the same type (None if the type is not handled)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice((1, -1, 10))
    if isinstance(value, float):
        return round(value * rng.choice((0.5, 2.0, 1.1)) + 1.0, 2)
    if isinstance(value, str):
        if not value:
            return "none"
        stem, dot, ext = value.rpartition(".")
        if dot and stem and ext.isalnum():  # a file name: right name, wrong extension
            return f"{stem}.{'txt' if ext != 'txt' else 'md'}"
        return rng.choice(
            (value + "_2", value[:-1] if len(value) > 1 else value + "s", value.upper())
        )
    if isinstance(value, list) and value:
        return value[:-1]
    return None


def _candidates(task: Task, calls: Calls, kind: str, rng: random.Random) -> list[tuple[Calls, str]]:
    """Perturbed call structures of one kind with a one-line description, in seeded order."""
    positions = _positions(calls)
    rng.shuffle(positions)
    out: list[tuple[Calls, str]] = []
    for pos in positions:
        text = _get(calls, pos)
        call = parse_call_string(text)
        where = f"turn {pos[0]} step {pos[1]}"
        if kind == "wrong_tool":
            for name in _compatible_tools(task, call)[:2]:
                new = str(Call(name, call.args, call.kwargs))
                out.append((_set(calls, pos, new), f"{call.name} -> {name} at {where}"))
        elif kind in ("wrong_argument", "missing_argument") and call.kwargs:
            key = rng.choice(sorted(call.kwargs))
            kwargs = dict(call.kwargs)
            if kind == "missing_argument":
                del kwargs[key]
            else:
                value = _altered(kwargs[key], rng)
                if value is None or value == kwargs[key]:
                    continue
                kwargs[key] = value
            new = str(Call(call.name, call.args, kwargs))
            out.append((_set(calls, pos, new), f"{text} -> {new} at {where}"))
        elif kind == "missing_call":
            out.append((_set(calls, pos, None), f"dropped {text} at {where}"))
        elif kind == "extra_call":
            new = copy.deepcopy(calls)
            new[pos[0]][pos[1]].insert(pos[2] + 1, text)
            out.append((new, f"repeated {text} at {where}"))
    if kind == "stop_early" and len(positions) > 1:
        flat = sorted(positions)
        for k in rng.sample(range(1, len(flat)), min(3, len(flat) - 1)):
            out.append((_stopped(calls, flat[k:]), f"stopped after {k} of {len(flat)} calls"))
    return out


def _stopped(calls: Calls, dropped: list[Position]) -> Calls:
    """`calls` without the calls at `dropped` (the tail), keeping turns and a final done()."""
    out = copy.deepcopy(calls)
    for t, s, i in sorted(dropped, reverse=True):
        del out[t][s][i]
    return [[s for s in turn if s] for turn in out]


def perturbations(
    task: Task,
    protocol: str,
    split: str = "train",
    seed: int = 0,
    kinds: tuple[str, ...] = KINDS,
    attempts: int = 4,
    usable: Callable[[Trajectory], bool] = lambda record: record.reward == 0,
) -> list[Trajectory]:
    """At most one usable failure per kind for `task` (kinds with none among the first
    `attempts` candidates are skipped); `usable`: the data stage's rule
    (rcgrpo.data.failures.is_usable_failure). Deterministic for (task, protocol, seed)."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown perturbation kind(s) {unknown}; known: {list(KINDS)}")
    base = expert_calls(task, protocol)
    out = []
    for kind in kinds:
        rng = random.Random(f"{seed}:{task.id}:{protocol}:{kind}")
        for calls, detail in _candidates(task, base, kind, rng)[:attempts]:
            prov = Provenance(f"perturbation:{kind}", seed=seed)
            record = scored(task, split, protocol, calls, prov, perturbation=detail)
            if usable(record):  # reward 0 (always >= 1 call: experts have >= 2)
                out.append(record)
                break
    return out

"""Failure trajectories (reward 0) from two sources, each recorded in provenance.generator.

(b) "perturbation:<kind>": an expert's calls changed the way real agents get them wrong, then
    re-executed in a fresh episode (real observations) and re-scored. Kinds:
      wrong_tool        one call goes to another tool that accepts the same arguments (cp for mv)
      wrong_argument    one argument value altered (a near-miss name, an off-by-one number)
      missing_argument  one argument left out
      missing_call      one call left out
      extra_call        a state-changing call repeated (a second post, a second cd ...)
      stop_early        the calls stop after k of n (the agent ends the task too soon)
    A perturbation that still earns paper reward 1 (a harmless change) is not a failure: the next
    seeded candidate is tried, up to `attempts` per kind; only reward-0 trajectories are returned.
(a) "rollout": rollouts of the base policy through issue 3's engine (`rollout_failures`), kept
    when `refusal` finds nothing wrong: paper reward 0, an assistant message, and at least one
    call the executor parsed and dispatched (a random policy's prose is noise, not a failure of
    tool calling). Optional: perturbations alone give a full balanced set.
The same rule screens perturbations and, in the dataset build, every rollout given to the low half.

    .venv/bin/python -c "from rcgrpo.trajectories.failures import *; from rcgrpo.bfcl.tasks import get_task; print([t.provenance.generator for t in perturbations(get_task('multi_turn_base_0'), 'combined', seed=0)])"
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rcgrpo.bfcl.checkers import parse_call_string
from rcgrpo.bfcl.executor import Call
from rcgrpo.bfcl.tasks import Task
from rcgrpo.trajectories.experts import DONE, expert_calls, scored
from rcgrpo.trajectories.record import Provenance, Trajectory

if TYPE_CHECKING:
    from rcgrpo.models import ModelConfig

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
) -> list[Trajectory]:
    """At most one reward-0 trajectory per kind for `task` (kinds with no failing candidate
    among the first `attempts` are skipped). Deterministic for (task, protocol, seed)."""
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
            if refusal(record) is None:  # reward 0 (always >= 1 call: experts have >= 2)
                out.append(record)
                break
    return out


def generate_perturbations(
    tasks: list[Task], split: str, protocol: str, seed: int, kinds=KINDS, attempts=4, progress=None
) -> list[Trajectory]:
    """Perturbation failures of every task, in task order."""
    out: list[Trajectory] = []
    for i, task in enumerate(tasks):
        out += perturbations(task, protocol, split, seed, tuple(kinds), attempts)
        if progress:
            progress(i + 1, len(tasks))
    return out


# Why a trajectory is refused as a low-reward example, in the order `refusal` checks them.
REFUSALS = ("reward_1", "no_assistant_message", "no_parsed_call", "empty_assistant_message")


def api_calls(record: Trajectory) -> list[str]:
    """The calls the executor parsed and dispatched, in order: every string of `record.calls`
    except done() (it ends a combined episode; it is no API call). A dispatched call may still
    have failed (unknown tool, wrong argument: an error observation); it counts, since a wrong
    call is exactly the failure RCTP-FT's low half should show."""
    return [c for turn in record.calls for step in turn for c in step if c != DONE]


def refusal(record: Trajectory) -> str | None:
    """Why `record` is no usable low-reward example (one of REFUSALS), or None if it is one.

    A usable failure is a failure *of tool calling* (paper: wrong tool, wrong or missing
    argument, premature stop). The first reason that applies is returned:
      reward_1                 paper reward is not 0: not a failure at all
      no_assistant_message     the policy said nothing (the prompt alone used the token budget)
      no_parsed_call           no call parsed and dispatched (`api_calls` is empty): prose or
                               garbage only, or a bare done(). It would teach <|low_reward|> to
                               mean "emit noise", not "make realistic mistakes"
      empty_assistant_message  an assistant message with neither text nor calls (the validation
                               suite's empty_assistant expectation refuses such rows too)
    Kept on purpose: a rollout whose last message is unparsable after some dispatched calls (the
    agent loop stops on it, reward_reason["stop"] == "no_calls"), and one cut by the step limit
    or token budget after some calls: both are the paper's "premature stop" failure.
    """
    assistant = [m for m in record.messages if m.get("role") == "assistant"]
    if record.paper_reward != 0:
        return "reward_1"
    if not assistant:
        return "no_assistant_message"
    if not api_calls(record):
        return "no_parsed_call"
    if not all(m.get("content") or m.get("tool_calls") for m in assistant):
        return "empty_assistant_message"
    return None


def is_usable_failure(record: Trajectory) -> bool:
    """True when `record` may be a low-reward row (`refusal` says why not)."""
    return refusal(record) is None


@dataclass
class RolloutReport:
    """Rollouts screened by `refusal`: the usable ones, and how many were refused and why."""

    records: list[Trajectory] = field(default_factory=list)  # usable failures, in order
    tried: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSALS, 0))
    model: dict | None = None  # {"profile", "path", "seed"} of the policy rolled out

    def add(self, record: Trajectory) -> bool:
        """Count `record`; keep it if it is a usable failure (returned True)."""
        self.tried += 1
        reason = refusal(record)
        if reason is None:
            self.records.append(record)
        else:
            self.refused[reason] += 1
        return reason is None

    def summary(self) -> dict:
        """The manifest's `rollouts` entry; tried == kept + sum(refused.values())."""
        return {
            "model": self.model,
            "tried": self.tried,
            "kept": len(self.records),
            "refused": dict(self.refused),
        }


def rollout_failures(
    tasks: list[Task],
    protocol: str,
    seed: int,
    model: ModelConfig,
    max_total_tokens: int = 0,
    backend=None,
) -> RolloutReport:
    """Usable failures (`refusal` is None) among rollouts of the base policy of `model`.

    `model` is loaded as given (profile, path, seed, dtype, device): the dataset build passes the
    policy's own params.yaml `model:` (dataset.rollout_model). One rollout per task, no reward
    goal (the base policy has never seen one), sampling seeded with `seed`. The split of each
    record comes from the committed split file. Raises ImportError (or the loader's error) when
    the engine or its model cannot be loaded; the caller decides whether that is an error
    (rollouts: "on") or a skip (rollouts: "auto"). max_total_tokens 0 = the profile's episode
    budget (a fixed small one would stop every full-docs prompt before its first token); 128
    tokens per message bound the base model's rambling (a cut message is no usable failure).
    """
    from rcgrpo.engines import RolloutConfig, make_engine  # heavy: torch, transformers
    from rcgrpo.models import load_policy

    policy = load_policy(model)
    rollout_cfg = RolloutConfig(
        protocol=protocol, max_new_tokens=128, max_total_tokens=max_total_tokens
    )
    engine = make_engine(rollout_cfg, policy)
    if backend is not None:  # rcgrpo.execution: the same shards, local or on Ray workers
        from rcgrpo.execution import RolloutSpec

        engine = backend.engine(policy, RolloutSpec(model, None, rollout_cfg), local_engine=engine)
    report = RolloutReport(model={"profile": model.profile, "path": model.path, "seed": model.seed})
    for rollout in engine.rollout(list(tasks), reward_tokens=None, protocol=protocol, seed=seed):
        record = rollout.trajectory
        record.provenance.generator = "rollout"
        record.provenance.seed = seed
        report.add(record)
    return report

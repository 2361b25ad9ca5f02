"""The one replay behind both checkers, in the process that holds the API instances (the sandbox
worker): a trajectory's calls re-executed in a fresh `LocalEpisode` with every function of the
involved classes available, compared turn by turn and at the end with the ground truth's run
(memoised per task as immutable snapshots). rcgrpo.bfcl.checkers sends trajectories here
through the sandbox; the semantics of each checker are in its docstring.

    .venv/bin/pytest tests/test_checkers.py -q
"""

from __future__ import annotations

import functools
import inspect
import operator
import pickle
from collections import Counter
from dataclasses import dataclass

from rcgrpo.bfcl.environment import LocalEpisode
from rcgrpo.bfcl.executor import Call, CallError, parse_calls
from rcgrpo.bfcl.progress import trusted_guard
from rcgrpo.bfcl.tasks import Task

PROTOCOLS = ("bfcl", "combined")


@dataclass(frozen=True)
class Verdict:
    """A checker's answer: passed, the first failing turn (None if passed or not per-turn), why."""

    passed: bool
    failing_turn: int | None = None
    reason: str = ""

    @property
    def reward(self) -> int:
        return int(self.passed)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "failing_turn": self.failing_turn, "reason": self.reason}


@dataclass(frozen=True)
class GroundTruthRun:
    results: tuple[tuple[str, ...], ...]  # per turn, the rendered result of each call
    states: tuple[dict, ...]  # per turn, {class: public state} deep-copied after the turn
    calls: tuple[tuple[str, dict], ...]  # every call as (name, bound arguments)


@functools.lru_cache(maxsize=65536)
def _parse_once(text: str) -> Call:
    parsed = parse_calls(text)
    if parsed.errors or len(parsed.calls) != 1:
        raise CallError(f"not a single tool call: {text!r} ({'; '.join(parsed.errors)})")
    return parsed.calls[0]


def parse_call_string(text: str) -> Call:
    """One stored call string -> a fresh Call (the same safe parser the agent's text goes
    through; memoised, and copied so a tool that mutates its arguments cannot touch the memo)."""
    call = _parse_once(text)
    if all(
        isinstance(v, str | int | float | bool | None) for v in (*call.args, *call.kwargs.values())
    ):
        return call
    return pickle.loads(pickle.dumps(call))


@functools.lru_cache(maxsize=65536)
def _bound(function, text: str, with_defaults: bool) -> dict | None:
    """Arguments of call `text` by parameter name (None if they do not fit the signature).

    Bound against the class's unbound function and memoised per (function, text): the same call
    strings recur across the G rollouts of a task. Read-only result.
    """
    call = _parse_once(text)
    try:
        bound = inspect.signature(function).bind(None, *call.args, **call.kwargs)
    except TypeError:
        return None
    if with_defaults:
        bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(arguments)))  # self
    return arguments


def _function(episode: LocalEpisode, name: str):
    method = episode.available().get(name)
    return getattr(method, "__func__", None)


@functools.lru_cache(maxsize=4096)
def ground_truth_run(task: Task) -> GroundTruthRun:
    """Execute the ground truth once per task and keep results, states and bound calls (the
    dataset's own calls, in this process; inside the worker they are timed as trusted calls)."""
    episode = LocalEpisode(task, hide_missed=False)
    episode.guard = trusted_guard
    results, states, calls = [], [], []
    for turn, turn_calls in enumerate(task.ground_truth):
        episode.begin_turn(turn)
        parsed = [parse_call_string(c) for c in turn_calls]
        step = episode.step(parsed)
        results.append(tuple(step.observations))
        calls += [
            (c.name, _bound(_function(episode, c.name), text, False) or {})
            for c, text in zip(parsed, turn_calls, strict=True)
        ]
        states.append(deep_copy(episode.state()))
    return GroundTruthRun(tuple(results), tuple(states), tuple(calls))


def deep_copy(value):
    """Deep copy by pickle round trip (several times faster than copy.deepcopy here)."""
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _state_difference(episode: LocalEpisode, expected: dict[str, dict]) -> str:
    """'' if every instance's public state equals `expected`, else which attributes differ."""
    for class_name, attrs in expected.items():
        instance = episode.instances[class_name]
        if _public_values(instance, tuple(attrs)) == tuple(attrs.values()):
            continue  # the common case, compared in C; below: name what differs
        differing = [k for k, v in attrs.items() if getattr(instance, k, _MISSING) != v]
        if differing:
            return f"state of {class_name} differs from the ground truth in {differing}"
    return ""


_MISSING = object()


def _public_values(instance: object, names: tuple[str, ...]) -> tuple | None:
    """The instance's values of `names` (None if one is missing: the slow path names it)."""
    if not names:
        return ()
    try:
        values = operator.attrgetter(*names)(instance)
    except AttributeError:
        return None
    return values if len(names) > 1 else (values,)


def _matched(gt_calls, model_calls) -> int:
    """Size of a maximum one-to-one matching of ground-truth calls to model calls (Kuhn)."""

    def fits(g, m):
        return g[0] == m[0] and all(k in m[1] and m[1][k] == v for k, v in g[1].items())

    owner: dict[int, int] = {}  # model index -> ground-truth index

    def augment(gi: int, seen: set[int]) -> bool:
        for mi, m in enumerate(model_calls):
            if mi not in seen and fits(gt_calls[gi], m):
                seen.add(mi)
                if mi not in owner or augment(owner[mi], seen):
                    owner[mi] = gi
                    return True
        return False

    return sum(augment(gi, set()) for gi in range(len(gt_calls)))


def _multiset_missing(needed, have: Counter) -> list[str]:
    missing = Counter(needed) - have
    return sorted(missing.elements())


def replay_step(episode: LocalEpisode, step_calls: list[str], results: Counter):
    """Replay one stored model step; adds every observation to `results` and returns
    (the call strings that parsed, the Step) — the scoring replay's view of what ran."""
    texts, parsed = [], []
    for text in step_calls:
        try:
            parsed.append(parse_call_string(text))
            texts.append(text)
        except CallError:
            results[f"Error during execution: could not parse {text!r}"] += 1
    step = episode.step(parsed)
    results.update(step.observations)
    return texts, step


def replay_here(
    task: Task, calls: list[list[list[str]]], protocol: str, paper_too: bool, guard=None
) -> tuple[Verdict | None, Verdict]:
    """The one replay behind both checkers, in this process (the worker). Without `paper_too`
    it stops at the first failing turn, as bfcl-eval's checker does (the paper reward needs the
    whole trajectory). `guard` times each model call (rcgrpo.bfcl.sandbox)."""
    gt = ground_truth_run(task)
    gt_results, gt_states = list(gt.results), list(gt.states)
    gt_nonempty = [bool(t) for t in task.ground_truth]
    if protocol == "combined":  # one turn: all ground truth at once, checked after it
        gt_results = [tuple(r for turn in gt.results for r in turn)]
        gt_states, gt_nonempty = [gt.states[-1]], [any(gt_nonempty)]

    episode = LocalEpisode(task, hide_missed=False)
    episode.guard = guard
    bfcl: Verdict | None = None
    if len(calls) != len(gt_results):
        bfcl = Verdict(
            False,
            None,
            f"force terminated: {len(calls)} model turns for {len(gt_results)} ground-truth turns",
        )
    all_results: Counter[str] = Counter()  # every model result so far, as a multiset
    executed: list[tuple[str, dict]] = []
    for turn, steps in enumerate(calls):
        if bfcl is not None and not paper_too:
            break
        episode.begin_turn(min(turn, episode.n_turns - 1))
        steps = [s for s in steps if s]  # bfcl-eval drops steps that decode to no call
        for step_calls in steps:
            texts, step = replay_step(episode, step_calls, all_results)
            for call, text, ran in zip(step.calls, texts, step.ok, strict=True):
                if ran and paper_too and call.name != "done":
                    executed.append((call.name, _bound(_function(episode, call.name), text, True)))
        if bfcl is not None or turn >= len(gt_results) or not gt_nonempty[turn]:
            continue
        if not steps:
            bfcl = Verdict(False, turn, f"model response is empty for turn {turn}")
        elif diff := _state_difference(episode, gt_states[turn]):
            bfcl = Verdict(False, turn, diff)
        elif missing := _multiset_missing(gt_results[turn], all_results):
            bfcl = Verdict(False, turn, f"results so far miss ground-truth results {missing}")

    bfcl = bfcl or Verdict(True, None, "every checked turn passed")
    if not paper_too:
        return None, bfcl
    final_diff = _state_difference(episode, gt.states[-1])
    n_matched = _matched(gt.calls, executed)
    if final_diff:
        paper = Verdict(False, None, f"R_state = 0: final {final_diff}")
    elif n_matched < len(gt.calls):
        paper = Verdict(
            False,
            None,
            f"R_action = 0: {len(gt.calls) - n_matched} of "
            f"{len(gt.calls)} ground-truth calls not matched",
        )
    else:
        paper = Verdict(True, None, "R_state = R_action = 1")
    return paper, bfcl

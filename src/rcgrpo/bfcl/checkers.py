"""The two reward checkers over a finished trajectory: the paper's R and BFCL's official check.

A trajectory's calls are given the way bfcl-eval's result files hold them: per turn, per model
step, a list of python-call strings (`[[["cd(folder='a')"], ["ls()"]], [], ...]`). Both checkers
replay them in a fresh `Episode` with every function of the involved classes available — exactly
as bfcl-eval's executor runs them (miss_func hiding is an interaction rule, not a scoring rule) —
and compare against the ground truth, whose run is memoised per task (immutable snapshots).
The replay runs in the sandbox worker (rcgrpo.bfcl.sandbox), one request per trajectory, under
the same per-call wall-clock and memory limits as the agent loop: a call that overruns gets the
"timed out" observation and the replay goes on, so a hostile call in a scored trajectory cannot
hang the scorer.

* `paper reward` R = R_state * R_action: the final public state of every involved instance equals
  the ground truth's; and every ground-truth call is matched one-to-one by an executed model call
  with the same name whose arguments include every ground-truth argument with an equal value
  (both sides bound to the method signature, so `sort('a')` == `sort(file_name='a')`; the model
  side with its defaults applied; order free; extra arguments allowed). `done()` is ignored.
* `bfcl check`: bfcl-eval's multi_turn_checker semantics — turn count must equal the ground
  truth's; empty model steps are dropped; after every turn with non-empty ground truth the model
  turn must be non-empty, the state must equal the ground truth's, and the turn's ground-truth
  results must be an unordered sub-multiset of all model results so far. Under the combined
  ("Step 1 ... Step n") protocol the trajectory is one turn, so the ground truth is collapsed to
  one turn too (checked once, at the end).

    rcgrpo env run multi_turn_base_0 --calls calls.json   # prints both verdicts
"""

from __future__ import annotations

import functools
import inspect
import operator
import pickle
from collections import Counter
from dataclasses import dataclass

from rcgrpo.bfcl.environment import LocalEpisode, public_state
from rcgrpo.bfcl.executor import Call, CallError, parse_calls
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
    from rcgrpo.bfcl.tool_worker import _trusted_guard

    episode = LocalEpisode(task, hide_missed=False)
    episode.guard = _trusted_guard
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
        states.append(_copy(episode.state()))
    return GroundTruthRun(tuple(results), tuple(states), tuple(calls))


def _copy(value):
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


def score(
    task: Task, calls: list[list[list[str]]], protocol: str = "bfcl", sandbox=None
) -> tuple[Verdict, Verdict]:
    """Replay `calls` once and return (paper reward verdict, bfcl check verdict)."""
    paper, bfcl = _replay(task, calls, protocol, True, sandbox)
    assert paper is not None
    return paper, bfcl


def _replay(task, calls, protocol: str, paper_too: bool, sandbox=None):
    return _replay_many([(task, calls)], protocol, paper_too, sandbox)[0]


def _replay_many(items, protocol: str, paper_too: bool, sandbox=None):
    """Send the replays to the sandbox worker (one round trip), where `replay_here` runs them."""
    from rcgrpo.bfcl import sandbox as sandboxes

    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    sandbox = sandbox or sandboxes.default()
    keyed = [(id(task), calls) for task, calls in items]
    tasks = [task for task, _ in items]
    return sandbox.request("score", tasks, lambda skip: (keyed, protocol, paper_too, skip))[0]


def score_many(
    items: list[tuple[Task, list[list[list[str]]]]], protocol: str = "bfcl", sandbox=None
) -> list[tuple[Verdict, Verdict]]:
    """`score` of several (task, calls) in one round trip to the worker (e.g. a GRPO group):
    the per-call limits are the same; only the process switches are shared."""
    return _replay_many(items, protocol, True, sandbox)


def bfcl_check_many(items, protocol: str = "bfcl", sandbox=None) -> list[Verdict]:
    return [v for _, v in _replay_many(items, protocol, False, sandbox)]


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
            texts, parsed = [], []
            for text in step_calls:
                try:
                    parsed.append(parse_call_string(text))
                    texts.append(text)
                except CallError:
                    all_results[f"Error during execution: could not parse {text!r}"] += 1
            step = episode.step(parsed)
            all_results.update(step.observations)
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


def paper_reward(task: Task, calls: list[list[list[str]]], protocol: str = "bfcl") -> Verdict:
    return score(task, calls, protocol)[0]


def bfcl_check(
    task: Task, calls: list[list[list[str]]], protocol: str = "bfcl", sandbox=None
) -> Verdict:
    return _replay(task, calls, protocol, False, sandbox)[1]


def ground_truth_calls(task: Task) -> list[list[list[str]]]:
    """The ground truth as a trajectory (one step per turn) — scores 1 on both checkers."""
    return [[list(turn)] if turn else [] for turn in task.ground_truth]


def final_state(task: Task) -> dict:
    """The ground truth's final public state (a fresh deep copy)."""
    return _copy(ground_truth_run(task).states[-1])


def clear_worker_memo(sandbox=None) -> None:
    """Forget the worker's ground-truth memo (bench/executor.py measures the cold case)."""
    from rcgrpo.bfcl import sandbox as sandboxes

    (sandbox or sandboxes.default()).request("clear", [], lambda skip: ())


__all__ = [
    "Verdict",
    "score",
    "score_many",
    "paper_reward",
    "bfcl_check",
    "bfcl_check_many",
    "ground_truth_run",
    "ground_truth_calls",
    "final_state",
    "public_state",
]

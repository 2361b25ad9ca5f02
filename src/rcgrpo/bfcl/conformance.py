"""Does our `bfcl check` agree with bfcl-eval's own executor + multi_turn_checker?

Perturbed trajectories are made from the ground truth by the edits that separate a right answer
from a near miss: drop a call, reorder a turn's calls, change an argument value, add a
state-changing extra call, empty a turn, move a call to another turn (plus splitting a turn into
several model steps, which must not matter). `official_verdict` runs bfcl-eval's path exactly as
its eval runner does (turn-count check, empty steps dropped, `multi_turn_checker`) under a unique
model name, then deletes the instances bfcl-eval cached in its module globals.

The full run (800 ground truths + 2,400 perturbations) is a script; a sample runs in the tests:

    python scripts/conformance.py --perturbations 3
"""

from __future__ import annotations

import dataclasses
import random
import re

from rcgrpo.bfcl.checkers import bfcl_check, ground_truth_calls
from rcgrpo.bfcl.executor import Call
from rcgrpo.bfcl.limits import configured
from rcgrpo.bfcl.replay import parse_call_string
from rcgrpo.bfcl.sandbox import Sandbox
from rcgrpo.bfcl.tasks import Task

REPLAY_LIMIT_S = 300.0  # per call; all 800 ground truths replay in ~1 s on this box

KINDS = (
    "drop_call",
    "reorder_calls",
    "change_argument",
    "extra_call",
    "empty_turn",
    "move_call",
    "split_steps",
)


def _flat(calls: list[list[list[str]]]) -> list[list[str]]:
    """Turns -> steps -> calls collapsed to turns -> calls (one step per turn)."""
    return [[c for step in turn for c in step] for turn in calls]


def _as_steps(turns: list[list[str]]) -> list[list[list[str]]]:
    return [[turn] if turn else [] for turn in turns]


def _changed_value(value, rng: random.Random):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + rng.choice([1, -1, 10])
    if isinstance(value, str):
        return rng.choice([value + "_x", value.upper() if value != value.upper() else "x", ""])
    if isinstance(value, list) and value:
        return value[:-1]
    return "changed"


def _change_argument(call: Call, rng: random.Random) -> Call:
    if call.kwargs:
        key = rng.choice(sorted(call.kwargs))
        return Call(
            call.name, call.args, {**call.kwargs, key: _changed_value(call.kwargs[key], rng)}
        )
    if call.args:
        i = rng.randrange(len(call.args))
        args = list(call.args)
        args[i] = _changed_value(args[i], rng)
        return Call(call.name, tuple(args), call.kwargs)
    return call


def perturb(task: Task, kind: str, rng: random.Random, donor_calls: list[str]) -> list | None:
    """One perturbed trajectory of `kind` (None when the task has no place for it).

    donor_calls: call strings from other tasks of the same classes, for `extra_call`.
    """
    turns = [list(t) for t in task.ground_truth]
    filled = [i for i, t in enumerate(turns) if t]
    if not filled:
        return None
    t = rng.choice(filled)
    if kind == "drop_call":
        turns[t].pop(rng.randrange(len(turns[t])))
    elif kind == "reorder_calls":
        multi = [i for i in filled if len(turns[i]) > 1]
        if not multi:
            return None
        t = rng.choice(multi)
        original = list(turns[t])
        while turns[t] == original:
            rng.shuffle(turns[t])
    elif kind == "change_argument":
        with_args = [
            (i, j)
            for i in filled
            for j, c in enumerate(turns[i])
            if "(" in c and not c.endswith("()")
        ]
        if not with_args:
            return None
        i, j = rng.choice(with_args)
        turns[i][j] = str(_change_argument(parse_call_string(turns[i][j]), rng))
    elif kind == "extra_call":
        pool = donor_calls or [c for turn in turns for c in turn]
        turns[t].insert(rng.randrange(len(turns[t]) + 1), rng.choice(pool))
    elif kind == "empty_turn":
        turns[t] = []
    elif kind == "move_call":
        if len(turns) < 2:
            return None
        call = turns[t].pop(rng.randrange(len(turns[t])))
        target = rng.choice([i for i in range(len(turns)) if i != t])
        turns[target].insert(rng.randrange(len(turns[target]) + 1), call)
    elif kind == "split_steps":
        steps = []
        for turn in turns:
            cut = (
                sorted(rng.sample(range(1, len(turn)), min(2, len(turn) - 1)))
                if len(turn) > 1
                else []
            )
            bounds = [0, *cut, len(turn)]
            steps.append(
                [turn[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
                + ([[]] if rng.random() < 0.3 else [])
            )  # an empty step must not matter
        return steps
    else:
        raise ValueError(f"unknown perturbation {kind!r}; known: {KINDS}")
    return _as_steps(turns)


def official_verdict(task: Task, calls: list[list[list[str]]], run_name: str) -> bool:
    """bfcl-eval's verdict for one trajectory, exactly as its multi-turn eval runner decides."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    if len(calls) != len(task.ground_truth):  # the runner's force-terminated check
        return False
    decoded = [[step for step in turn if step] for turn in calls]
    entry = {
        "id": task.id,
        "initial_config": task.initial_config,
        "involved_classes": list(task.involved_classes),
    }
    try:
        result = multi_turn_checker(
            decoded, [list(t) for t in task.ground_truth], entry, task.category, run_name
        )
    finally:  # bfcl-eval keeps every instance in its module globals: free them
        prefix = re.sub(r"[-./:]", "_", run_name)
        for key in [k for k in vars(multi_turn_utils) if k.startswith(prefix)]:
            del vars(multi_turn_utils)[key]
    return bool(result["valid"])


def cases(tasks: list[Task], per_task: int, seed: int) -> list[tuple[Task, str, list]]:
    """(task, kind, trajectory): every ground truth plus `per_task` perturbations of each."""
    rng = random.Random(seed)
    donors: dict[tuple, list[str]] = {}
    for task in tasks:
        donors.setdefault(task.involved_classes, []).extend(
            c for turn in task.ground_truth for c in turn
        )
    out = [(task, "ground_truth", ground_truth_calls(task)) for task in tasks]
    for task in tasks:
        made = 0
        for kind in rng.sample(KINDS, len(KINDS)) * 3:
            if made == per_task:
                break
            trajectory = perturb(task, kind, rng, donors[task.involved_classes])
            if trajectory is not None:
                out.append((task, kind, trajectory))
                made += 1
    return out


def compare(case_list: list[tuple[Task, str, list]], tag: str = "conf") -> list[dict]:
    """Run both checkers on every case; one dict per case with both verdicts.

    Our replays run in a sandbox of their own whose per-call limit (REPLAY_LIMIT_S) no dataset
    call comes near: bfcl-eval runs every call without a limit, and what is compared is the two
    checkers' rules. With the run's 5 s, a stall that the worker's own clock counts (a page
    fault under memory pressure, a stolen CPU) could time a cheap call out and flip a verdict.
    For the same reason a replay during which the worker was replaced (a call got an error
    observation) is replayed once more in the fresh worker; the row names the replacements
    (`worker_replaced`), and a cause that repeats fails the second replay too.
    """
    rows = []
    sandbox = Sandbox(dataclasses.replace(configured(), tool_timeout_s=REPLAY_LIMIT_S))
    try:
        for i, (task, kind, trajectory) in enumerate(case_list):
            before = len(sandbox.replaced)
            ours = bfcl_check(task, trajectory, sandbox=sandbox)
            if len(sandbox.replaced) > before:  # a worker killed or dead during our replay gave a
                ours = bfcl_check(task, trajectory, sandbox=sandbox)  # call an error: once more
            theirs = official_verdict(task, trajectory, f"rcgrpo_{tag}_{i}")
            rows.append(
                {
                    "task_id": task.id,
                    "kind": kind,
                    "ours": ours.passed,
                    "theirs": theirs,
                    "reason": ours.reason,
                    # the worker was killed or died during our replay (a call got an error): why
                    "worker_replaced": sandbox.replaced[before:],
                }
            )
    finally:
        sandbox.close()
    return rows

"""The two reward checkers over a finished trajectory: the paper's R and BFCL's official check.

A trajectory's calls are given the way bfcl-eval's result files hold them: per turn, per model
step, a list of python-call strings (`[[["cd(folder='a')"], ["ls()"]], [], ...]`). Both checkers
replay them in a fresh `Episode` with every function of the involved classes available — exactly
as bfcl-eval's executor runs them (miss_func hiding is an interaction rule, not a scoring rule) —
and compare against the ground truth, whose run is memoised per task (immutable snapshots).
The replay (rcgrpo.bfcl.replay) runs in the sandbox worker (rcgrpo.bfcl.sandbox), one request
per batch of trajectories, under
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

from rcgrpo.bfcl import sandbox as sandboxes
from rcgrpo.bfcl.replay import (
    PROTOCOLS,
    Verdict,
    deep_copy,
    ground_truth_run,
)
from rcgrpo.bfcl.tasks import Task


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
    return deep_copy(ground_truth_run(task).states[-1])


def clear_worker_memo(sandbox=None) -> None:
    """Forget the worker's ground-truth memo (bench/executor.py measures the cold case)."""
    (sandbox or sandboxes.default()).request("clear", [], lambda skip: ())

"""Benchmark: execute + check trajectories through our path vs bfcl-eval's, in one run.

Both paths get the same trajectories (the ground truth of every multi-turn entry plus perturbed
copies, `rcgrpo.bfcl.conformance.cases`) and produce the official per-turn verdict:
  * ours:   `rcgrpo.bfcl.checkers.bfcl_check` (ast parser + whitelisted dispatch, ground-truth run
            memoised per task as immutable snapshots, replay stopped at the first failing
            turn as bfcl-eval's checker does);
  * theirs: bfcl-eval's `execute_multi_turn_func_call` + `multi_turn_checker` (regex rewrite +
            eval, instances in module globals, the ground truth re-executed on every check).
Our replay runs in the sandbox worker process (rcgrpo.bfcl.sandbox: per-call wall-clock and
memory limits, one round trip per trajectory), so the figures include that cost.
"cold" clears our ground-truth memo (the worker's) first, so each task's first check pays for its
ground-truth run; the "warm" rows are the RL case (the ground truth of a task already run), with
k trajectories per request to the worker (`bfcl_check_many`):
  * k = 1: one request per trajectory (`rcgrpo env run`, scripts/ceiling.py): latency-bound,
    the two process switches of a round trip (~0.2 ms here) cost about as much as the replay;
  * k = 3: one task's trajectories (its ground truth + 2 perturbations);
  * k = 40: one rollout batch of the CPU default RL step (8 tasks x G = 5). Engine.rollout scores
    every episode of its batch in one request (agent_loop.results), so this, and not k = 1, is
    what RL and evaluation pay; the target (>= 3x bfcl-eval) is for this row;
  * k = 320: a larger rollout batch (64 tasks x G = 5; the paper's step is 256 x 5).
Prints trajectories/s for each and the ratios ours/theirs; the last line is the target's.

    .venv/bin/python bench/executor.py --perturbations 2
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from rcgrpo.runtime import apply_defaults

SIZES = (3, 40, 320)  # trajectories per request of the batched rows (see above)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--perturbations", type=int, default=2, help="perturbed copies per task")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    apply_defaults()
    from rcgrpo.bfcl.checkers import bfcl_check, bfcl_check_many, clear_worker_memo
    from rcgrpo.bfcl.conformance import cases, official_verdict
    from rcgrpo.bfcl.tasks import load_tasks

    work = cases(list(load_tasks().values()), args.perturbations, args.seed)
    n = len(work)

    def timed(fn) -> float:
        start = time.perf_counter()
        for i, (task, _, trajectory) in enumerate(work):
            fn(i, task, trajectory)
        return time.perf_counter() - start

    bfcl_check(work[0][0], work[0][2])  # start the worker outside the timing
    theirs = timed(lambda i, task, traj: official_verdict(task, traj, f"bench_{i}"))
    clear_worker_memo()
    ours_cold = timed(lambda i, task, traj: bfcl_check(task, traj))
    ours_warm = timed(lambda i, task, traj: bfcl_check(task, traj))
    pairs = [(task, trajectory) for task, _, trajectory in work]
    batched = {}
    for k in SIZES:
        start = time.perf_counter()
        for i in range(0, n, k):
            bfcl_check_many(pairs[i : i + k])
        batched[k] = time.perf_counter() - start
    print(f"trajectories: {n}; threads: {threading.active_count()}; load: {os.getloadavg()}")
    print(f"bfcl-eval path         : {n / theirs:8.1f} trajectories/s")
    print(f"ours, cold memo, k=1   : {n / ours_cold:8.1f} trajectories/s")
    print(f"ours, warm, k=1        : {n / ours_warm:8.1f} trajectories/s")
    for k, seconds in batched.items():
        print(f"ours, warm, k={k:<4d}     : {n / seconds:8.1f} trajectories/s")
    print(f"ratio ours/theirs (cold, k=1): {theirs / ours_cold:.2f}x")
    print(f"ratio ours/theirs (warm, k=1): {theirs / ours_warm:.2f}x")
    for k in (3, 320, 40):  # the rollout batch of the default RL step last: the target's row
        print(f"ratio ours/theirs (warm, k={k}): {theirs / batched[k]:.2f}x")


if __name__ == "__main__":
    main()

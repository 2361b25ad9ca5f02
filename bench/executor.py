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
ground-truth run; "warm" is the RL case (G rollouts of the same task scored one after another),
one request per trajectory; "group" sends each task's G = 1 + perturbations trajectories in one
request (`bfcl_check_many`, how a GRPO group is scored), sharing the process switches; "batch"
sends 320 at a time (an RL mini-batch of rollouts).
Prints trajectories/s for each and the ratios ours/theirs (target >= 3x warm).

    .venv/bin/python bench/executor.py --perturbations 2
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from rcgrpo.runtime import apply_defaults

BATCH = 320  # rollouts scored per request in "batch": one RL mini-batch (64 tasks x G = 5)


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
    groups: dict = {}
    for task, _, trajectory in work:
        groups.setdefault(task, []).append((task, trajectory))
    start = time.perf_counter()
    for items in groups.values():
        bfcl_check_many(items)
    ours_group = time.perf_counter() - start
    pairs = [(task, trajectory) for task, _, trajectory in work]
    start = time.perf_counter()
    for i in range(0, n, BATCH):
        bfcl_check_many(pairs[i : i + BATCH])
    ours_batch = time.perf_counter() - start
    print(f"trajectories: {n}; threads: {threading.active_count()}; load: {os.getloadavg()}")
    print(f"bfcl-eval path   : {n / theirs:9.1f} trajectories/s")
    print(f"ours (cold memo) : {n / ours_cold:9.1f} trajectories/s")
    print(f"ours (warm memo) : {n / ours_warm:9.1f} trajectories/s")
    per = n / len(groups)
    print(f"ours (warm, group): {n / ours_group:8.1f} trajectories/s ({per:.0f} per request)")
    print(f"ours (warm, batch): {n / ours_batch:8.1f} trajectories/s ({BATCH} per request)")
    print(f"ratio ours/theirs (cold): {theirs / ours_cold:.2f}x")
    print(f"ratio ours/theirs (warm): {theirs / ours_warm:.2f}x")
    print(f"ratio ours/theirs (warm, group): {theirs / ours_group:.2f}x")
    print(f"ratio ours/theirs (warm, batch): {theirs / ours_batch:.2f}x")


if __name__ == "__main__":
    main()

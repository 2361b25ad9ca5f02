"""Evaluation wall time, local backend vs Ray with 1 and 2 workers, in one run (tiny profile).

Rolls out the same held-out tasks (combined protocol, high token, greedy) three ways with the
same shards (execution.shard_size): in this process, on a local Ray cluster with 1 worker and
with 2 workers; checks the rollouts are identical and prints each time and its ratio to local.
Ray start-up and worker model loading are timed apart (`startup_s`), not in the rollout time.
On a 2-core shared box expect little gain: two workers compete with everything else.

    PYTHONPATH=src .venv/bin/python bench/scaleout.py --tasks 16 --shard 4
"""

from __future__ import annotations

import argparse
import os
import time

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.runtime import apply_defaults


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=16, help="held-out tasks rolled out")
    ap.add_argument("--shard", type=int, default=4, help="episodes per shard")
    args = ap.parse_args()
    apply_defaults()
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import HIGH
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import ExecutionConfig, RolloutSpec, session

    roll = RolloutConfig(temperature=0.0, max_new_tokens=64, max_steps=6, max_total_tokens=1536)
    spec = RolloutSpec(ModelConfig(profile="tiny"), None, roll, BFCL)
    tasks = tasks_in("test")[: args.tasks]
    policy = load_policy(spec.model)
    print(f"cpus {os.cpu_count()} load {os.getloadavg()} tasks {len(tasks)} shard {args.shard}")
    times, ref = {}, None
    for name, workers in (("local", 0), ("ray-1", 1), ("ray-2", 2)):
        cfg = ExecutionConfig(backend="ray" if workers else "local", workers=max(1, workers),
                              shard_size=args.shard, memory_per_worker_gb=0.5)  # fmt: skip
        t0 = time.perf_counter()
        with session(cfg) as backend:  # ray: rcgrpo's own connect (a private session folder)
            engine = backend.engine(policy, spec)
            if workers:  # wait for the workers to load their model: start-up, not rollout
                backend.worker_states()
            startup = time.perf_counter() - t0
            t1 = time.perf_counter()
            out = engine.rollout(tasks, HIGH, "combined", seed=0)
            times[name] = time.perf_counter() - t1
        ref = ref or [r.ids for r in out]
        same = [r.ids for r in out] == ref
        print(f"{name:6s} rollout {times[name]:6.2f} s  startup {startup:5.1f} s  "
              f"ratio local/this {times['local'] / times[name]:.2f}  identical {same}  "
              f"load {os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

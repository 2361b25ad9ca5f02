"""BFCL v4 multi-turn as an `Environment` (rcgrpo.rollout.environment): its tasks and split, its
episodes under the two prompt protocols (rcgrpo.envs.bfcl.episode), its sandbox workers, its two
checkers as named rewards (rcgrpo.envs.bfcl.scorer), and for the data stage the ground truth as
the expert and perturbations of it as failures.

Built from the run's `env:` section: its sandbox limits become this process's (and a Ray
worker's, which unpickles it with them: `__reduce__`) before any tool worker starts. `BFCL` is
the environment with the limits of params.yaml (or, after a run set them, the run's).

    from rcgrpo.envs.bfcl.environment import BFCL
    episode = BFCL.episode(BFCL.task("multi_turn_base_0"), "combined")
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from rcgrpo.bfcl.environment import STEP_LIMIT
from rcgrpo.bfcl.tasks import CATEGORIES, Task, get_task, split_of, tasks_in
from rcgrpo.envs.bfcl.episode import PROTOCOLS, BfclEpisode
from rcgrpo.envs.bfcl.perturbations import KINDS
from rcgrpo.envs.bfcl.scorer import CHECKS, BfclScorer


class SandboxPool:
    """k sandbox workers (rcgrpo.bfcl.sandbox), started on first use and kept by the engine:
    episode i executes its calls in worker i mod k, so k tool calls can run at once."""

    def __init__(self, k: int = 0):
        self.k = k or min(16, os.cpu_count() or 1)  # 0: one per core, at most 16 processes
        self._sandboxes: list = []
        self._lock = threading.Lock()

    def worker(self, index: int):
        from rcgrpo.bfcl.limits import configured
        from rcgrpo.bfcl.sandbox import Sandbox

        with self._lock:
            while len(self._sandboxes) < self.k:
                self._sandboxes.append(Sandbox(configured()))
            return self._sandboxes[index % self.k]

    def restarts(self) -> int:
        """Workers replaced so far (rcgrpo.bfcl.sandbox.Sandbox.replaced says where and why)."""
        return sum(s.restarts for s in self._sandboxes)

    def pids(self) -> set[int]:
        """The worker processes running now."""
        return {s.pid() for s in self._sandboxes if s.pid()}

    def close(self) -> None:
        for sandbox in self._sandboxes:
            sandbox.close()
        self._sandboxes = []


class BfclEnvironment:
    """BFCL's tasks (rcgrpo.bfcl.tasks), episodes and checkers. cfg: the run's `env:` section
    (rcgrpo.envs.config.EnvConfig); None keeps this process's limits as they are."""

    name = "bfcl"
    protocols = PROTOCOLS
    categories = CATEGORIES
    kinds = KINDS  # perturbations of the ground truth (the data stage's failures)
    checks = CHECKS

    def __init__(self, cfg=None):
        self.cfg = cfg
        if cfg is not None:
            from rcgrpo.bfcl import limits

            limits.use(cfg)  # before any tool worker of this process starts

    def __reduce__(self):
        return (BfclEnvironment, (self.cfg,))

    def tasks(self, split: str, categories: Sequence[str] = ()) -> list[Task]:
        if unknown := sorted(set(categories) - set(CATEGORIES)):
            raise ValueError(f"BFCL categories {unknown}: one of {', '.join(CATEGORIES)}")
        return tasks_in(split, tuple(categories or CATEGORIES))

    def task(self, task_id: str) -> Task:
        return get_task(task_id)

    def episode(
        self, task: Task, protocol: str = "bfcl", step_limit: int = STEP_LIMIT, worker=None
    ) -> BfclEpisode:
        return BfclEpisode(task, protocol, split_of(task), step_limit, worker)

    def scorer(self, protocol: str = "bfcl", reward: str | None = None) -> BfclScorer:
        return BfclScorer(protocol, reward or "paper")

    def workers(self, k: int = 0) -> SandboxPool:
        return SandboxPool(k)

    # -- the data stage ---------------------------------------------------------------------------
    def expert(self, task: Task, protocol: str, split: str):
        from rcgrpo.envs.bfcl.experts import expert

        return expert(task, protocol, split)

    def failures(self, task, protocol, split, seed, kinds=(), attempts=4, usable=None) -> list:
        """Perturbations of the ground truth (rcgrpo.envs.bfcl.perturbations; `kinds` () = all)."""
        from rcgrpo.envs.bfcl.perturbations import perturbations

        rule = {"usable": usable} if usable is not None else {}
        return perturbations(task, protocol, split, seed, tuple(kinds or KINDS), attempts, **rule)

    def check_call(self, text: str) -> str | None:
        from rcgrpo.bfcl.executor import CallError
        from rcgrpo.bfcl.replay import parse_call_string

        try:
            parse_call_string(text)
        except CallError as e:
            return str(e)
        return None


BFCL = BfclEnvironment()

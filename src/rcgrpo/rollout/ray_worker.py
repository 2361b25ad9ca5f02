"""A Ray rollout worker's side: its own policy and engine, built from a RolloutSpec; it serves
shards of a rollout call and the sync probe's scoring (rcgrpo.rollout.execution drives it).

Weights reach a worker lazily: the driver's `sync` puts the trainable weights in Ray's object
store under a new version, and the next call that carries that version (a shard or a probe)
copies them into the worker's policy and syncs its engine first. So the sync probe, which scores
on every worker, also proves that every worker took the new weights.

    .venv/bin/pytest tests/test_execution.py -q
"""

from __future__ import annotations

import os


def run_shard(engine, task_ids, tokens, protocol, seed, first_index):
    """(rollouts, the engine's metrics) of one shard."""
    from rcgrpo.bfcl.tasks import get_task

    tasks = [get_task(t) for t in task_ids]
    out = engine.rollout(tasks, list(tokens), protocol, seed, first_index=first_index)
    return out, dict(engine.last_stats)


class RolloutWorker:
    """A Ray actor: one policy + engine, built from a RolloutSpec; serves shards and probes.
    `build(spec)` -> (policy, engine) is the driver's (rcgrpo.rollout.execution: make_engine
    lives there, and that module imports this one)."""

    def __init__(self, spec, env=None):
        if env is not None:  # the run's `env:` section, for this worker's tool sandboxes
            from rcgrpo.bfcl import sandbox

            sandbox.use(env)
        self.policy, self.engine = self.build(spec)
        self.version, self.busy = 0, False

    def build(self, spec):
        raise NotImplementedError

    def _update(self, version: int, weights) -> None:
        """Take the driver's weights of `version` (nested in a list: resolved here, only when
        this worker's version is older) and serve them."""
        if version != self.version and weights and weights[0] is not None:
            import ray
            import torch

            state = ray.get(weights[0])
            with torch.no_grad():
                for name, p in self.policy.model.named_parameters():
                    if name in state:
                        p.copy_(state[name])
            self.engine.sync(self.policy)
            self.version = version

    def rollout(self, task_ids, tokens, protocol, seed, first_index, version=0, weights=None):
        self._update(version, weights)
        self.busy = True
        try:
            return run_shard(self.engine, task_ids, tokens, protocol, seed, first_index)
        finally:
            self.busy = False

    def score(self, ids: list[int], version=0, weights=None) -> list[list[float]]:
        """Engine.score on this worker's engine, at the driver's latest weights."""
        self._update(version, weights)
        return self.engine.score(ids)

    def state(self) -> tuple[int, bool]:
        """(pid, busy): answered from the control thread even while a shard runs."""
        return os.getpid(), self.busy

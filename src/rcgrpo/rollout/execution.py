"""Where rollouts run: in this process (`local`, the default) or on Ray workers (`ray`).

The module that drives ray (only when execution.backend is "ray"). On Ray a rollout call is
cut into shards of `shard_size` episodes (whole GRPO groups in RL), one per worker at a time;
each episode keeps its index in the whole call (Engine.rollout's first_index), so its sampling
seeds do not depend on which shard or worker runs it. The local backend runs the whole call in
one `Engine.rollout`, every episode in flight at once (rollout.scheduler, rollout.max_in_flight):
no shard waits for the one before it. Ray and local then give the same ids and rewards; the HF
engine's log-probs can differ in the last bits (another batch composition, other matmul sizes),
which is why tests/test_execution.py compares them to 1e-5.

Ray workers are actors (`RolloutWorker`, rollout/ray_worker.py) that build their own policy and
engine from what is sent (ModelConfig, model path, RolloutConfig; task ids; for RL the trainable
weights of the current step as one object-store entry): nothing live or unpicklable crosses. A worker that dies
is restarted by Ray (max_restarts) and its shard retried (max_task_retries); results are
gathered by shard index, so nothing is lost or duplicated.

Why Ray actors inside a Prefect task, not prefect-ray's RayTaskRunner: the fan-out unit needs a
warm worker holding a loaded model (a Ray task per shard would reload it), and a Prefect task
run per shard would need the Prefect API reachable from every cluster node and add a task-run
record per shard; the stage stays one Prefect task and one MLflow run, tagged with the Ray job.

    with session(ExecutionConfig(backend="ray")) as backend:
        engine = backend.engine(policy, RolloutSpec(model_cfg, model_path, rollout_cfg))
        rollouts = engine.rollout(tasks, reward_tokens, protocol, seed)
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from rcgrpo.fields import config_class, ranged, setting
from rcgrpo.rollout.call_stats import merge_stats


@config_class
class ExecutionConfig:
    """params.yaml `execution:` section."""

    backend: Literal["local", "ray"] = setting(
        "local", "local: this process; ray: Ray actor workers"
    )
    address: str = setting(
        "local",
        "local: a private cluster; auto: RAY_ADDRESS or `ray start`'s, else private; "
        "or ray://host:10001 (rcgrpo.rollout.ray_cluster)",
    )
    workers: int = ranged(2, "[1, inf)", "Ray actors, each with its own policy and engine")
    cpus_per_worker: float = ranged(1.0, "[0, inf)", "Ray CPUs reserved per worker")
    gpus_per_worker: float = ranged(
        0.0, "[0, inf)", "Ray GPUs per worker (vLLM replicas on a GPU cluster)"
    )
    memory_per_worker_gb: float = ranged(
        2.0, "[0, inf)", "Ray memory reserved per worker (scheduling)"
    )
    shard_size: int = ranged(
        16, "[1, inf)", "ray: episodes per shard (RL: whole groups); local runs one call"
    )
    max_retries: int = ranged(3, "[0, inf)", "restarts of a dead worker and retries of its shard")


@dataclass(frozen=True)
class RolloutSpec:
    """What a worker needs to build its engine: the policy's config and saved folder (None: the
    base model) and the rollout settings."""

    model: object  # rcgrpo.models.profiles.ModelConfig
    path: str | None
    rollout: object  # rcgrpo.rollout.config.RolloutConfig


def make_engine(cfg, policy, device: str | None = None):
    """The engine a RolloutConfig names: "hf" (transformers) or "vllm" (imported only here),
    on `device` (default: the policy's). One process per GPU (rcgrpo.training.distributed):
    each rank builds its own, on its own device. The HF engine samples from the policy's model
    itself, so `device` must be the model's; a vLLM server is pinned to that GPU."""
    device = policy.config.device if device in (None, "auto") else device
    if cfg.engine == "vllm":
        import dataclasses

        from rcgrpo.rollout.colocate import sleep_mode
        from rcgrpo.rollout.vllm_engine import VLLMEngine
        from rcgrpo.rollout.vllm_venv import cuda

        on = sleep_mode(cfg, policy.config.profile, cuda())  # None: on for hub profiles on CUDA
        cfg = dataclasses.replace(cfg, vllm_sleep_mode=on)

        return VLLMEngine(cfg, policy, device=device)
    from rcgrpo.rollout.hf import HFEngine

    model_device = str(next(policy.model.parameters()).device)
    if device != model_device and not (device == "cuda" and model_device.startswith("cuda")):
        raise ValueError(
            f"the HF engine samples from the policy's model, which is on {model_device}, "
            f"not on {device}: load the policy on the engine's device (model.device)"
        )
    return HFEngine(cfg, policy)


def shard_bounds(n: int, size: int, group: int = 1) -> list[tuple[int, int]]:
    """[(start, end)] cutting n episodes into shards of `size` rounded up to whole groups."""
    step = -(-size // group) * group
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def trainable_state(model) -> dict:
    """The trainable weights (all of a full fine-tune, the adapters of LoRA) on the CPU."""
    return {k: p.detach().cpu().clone() for k, p in model.named_parameters() if p.requires_grad}


def load(spec: RolloutSpec):
    """(policy, engine) of a RolloutSpec, in a Ray worker's process."""
    from rcgrpo.models.loading import load_policy
    from rcgrpo.runtime import apply_defaults

    apply_defaults()
    policy = load_policy(spec.model, adapter_path=spec.path)
    return policy, make_engine(spec.rollout, policy)


class ShardedEngine:
    """The Engine interface (rollout, sync, score, watch, cfg) in this process (one call, no
    shards) or over shards on Ray workers. What the trainer reads of an engine (its resolved
    `cfg`: budgets, concurrency; its progress) is the real engine's, never a default."""

    def __init__(
        self, local_engine=None, actors=None, group: int = 1, shard_size: int = 16, cfg=None
    ):
        self.local, self.actors, self.group, self.size = local_engine, actors, group, shard_size
        self.weights, self.version = None, 0
        self.shard_stats: list[dict] = []  # Ray: each shard's engine metrics, last call
        self.ticks: list = []  # Ray: watch()'s callbacks, ticked as each shard comes back
        self._cfg = cfg  # Ray: the workers' RolloutConfig, resolved for the policy

    @property
    def cfg(self):
        """The RolloutConfig the engine runs under, its token limits resolved (Engine.cfg)."""
        return self.local.cfg if self.local is not None else self._cfg

    @property
    def logprobs_temperature(self) -> float | None:
        """The local engine's (Engine.logprobs_temperature); Ray workers run hf or vllm: 1."""
        return self.local.logprobs_temperature if self.local is not None else 1.0

    def watch(self, tick) -> None:
        """tick() on every reply of the local engine, or on every shard back from Ray."""
        if self.local is not None:
            return self.local.watch(tick)
        self.ticks.append(tick)

    def score(self, ids: list[int]) -> list[list[float]]:
        """Engine.score: the local engine's replicas, or every Ray worker at the latest weights."""
        if self.local is not None:
            return self.local.score(ids)
        import ray

        weights = [self.weights]
        calls = [a.score.remote(ids, self.version, weights) for a in self.actors]
        return [lp for per_worker in ray.get(calls) for lp in per_worker]

    def close(self) -> None:
        """Close the local engine (its servers, tool workers); Ray actors end with the session."""
        if self.local is not None:
            self.local.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def last_stats(self) -> dict:
        """The engine metrics of the last call (Ray: merged over its shards)."""
        return self.local.last_stats if self.local is not None else merge_stats(self.shard_stats)

    def sync(self, policy) -> None:
        if self.local is not None:
            return self.local.sync(policy)
        import ray

        self.weights, self.version = ray.put(trainable_state(policy.model)), self.version + 1

    def rollout(self, tasks, reward_tokens=None, protocol=None, seed=0, first_index=0):
        """first_index: the episode index of tasks[0] in the whole call (a rank's share of an
        RL step, rcgrpo.training.distributed), as in Engine.rollout."""
        if reward_tokens is None or isinstance(reward_tokens, str):
            reward_tokens = [reward_tokens] * len(tasks)
        if self.local is not None:  # every episode in one call: all in flight at once
            return self.local.rollout(tasks, reward_tokens, protocol, seed, first_index=first_index)
        ids = [t.id for t in tasks]
        bounds = shard_bounds(len(tasks), self.size, self.group)
        at = first_index
        from ray.util import ActorPool

        pool = ActorPool(self.actors)
        args = [(ids[s:e], reward_tokens[s:e], protocol, seed, at + s) for s, e in bounds]
        weights = [self.weights]  # nested: resolved by the worker only when its version is old
        parts = []
        for part in pool.map(lambda a, x: a.rollout.remote(*x, self.version, weights), args):
            parts.append(part)
            for tick in self.ticks:  # a shard came back: progress
                tick()
        self.shard_stats = [stats for _, stats in parts]
        out = [r for part, _ in parts for r in part]
        if [r.task_id for r in out] != ids:
            raise RuntimeError("sharded rollout lost or duplicated episodes")
        return out


class Backend:
    def __init__(self, cfg: ExecutionConfig, ray_mod=None):
        self.cfg, self.ray, self.actors = cfg, ray_mod, []

    def engine(self, policy, spec: RolloutSpec, group: int = 1, local_engine=None):
        """A ShardedEngine: local (local_engine, or one built on `policy`) or on Ray workers."""
        if self.ray is None:
            local = local_engine or make_engine(spec.rollout, policy)
            return ShardedEngine(local, group=group, shard_size=self.cfg.shard_size)
        cfg, ray = self.cfg, self.ray
        from rcgrpo.rollout.ray_worker import RolloutWorker

        class Worker(RolloutWorker):  # state() answers from its own thread while a shard runs
            @ray.method(concurrency_group="control")
            def state(self):
                return RolloutWorker.state(self)

            def build(self, spec):
                return load(spec)

        cls = ray.remote(concurrency_groups={"control": 1})(Worker)
        opts = dict(
            num_cpus=cfg.cpus_per_worker,
            num_gpus=cfg.gpus_per_worker,
            memory=int(cfg.memory_per_worker_gb * 2**30),
            max_restarts=cfg.max_retries,
            max_task_retries=cfg.max_retries,
        )
        from rcgrpo.bfcl.sandbox import configured

        env = configured()  # the run's `env:` travels with each actor, not in an env var
        actors = [cls.options(**opts).remote(spec, env) for _ in range(cfg.workers)]
        self.actors += actors
        resolved = spec.rollout.for_policy(policy)  # what each worker's engine runs under
        return ShardedEngine(actors=actors, group=group, shard_size=cfg.shard_size, cfg=resolved)

    def worker_states(self) -> list[tuple[int, bool]]:
        return self.ray.get([a.state.remote() for a in self.actors])

    def tags(self) -> dict:
        """MLflow tags linking the stage's run to the Ray job (none for local)."""
        if self.ray is None:
            return {"execution.backend": "local"}
        ctx = self.ray.get_runtime_context()
        return {
            "execution.backend": "ray",
            "ray.job_id": ctx.get_job_id(),
            "ray.address": self.ray.get_runtime_context().gcs_address,
            "execution.workers": str(self.cfg.workers),
        }


@contextmanager
def session(cfg: ExecutionConfig | None = None):
    """A Backend for one stage; with ray, connects (or starts a local cluster) and cleans up."""
    cfg = cfg or ExecutionConfig()
    if cfg.backend == "local":
        yield Backend(cfg)
        return
    from rcgrpo.rollout.ray_cluster import connect
    from rcgrpo.runtime import DEFAULTS

    env_vars = dict(DEFAULTS)  # telemetry off, offline hub: as in this process
    with connect(cfg, {"env_vars": env_vars}) as ray:  # which cluster: rollout/ray_cluster.py
        backend = Backend(cfg, ray)
        try:
            yield backend
        finally:
            for a in backend.actors:
                ray.kill(a)

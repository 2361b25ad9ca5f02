"""Rollouts and evaluation episodes as MLflow traces: which ones, with which tags, and the hooks.

The RL trainer and the evaluation sit below tracking and never import it: they take a callback
(`Trainer(on_rollouts=...)`, `evaluate(on_rollouts=...)`) that rcgrpo.tracking.stage and
flows/evaluate.py build here. The RL hook receives the step's StepRollouts, the very rollouts,
rewards and advantages the update trains on, right after they were sampled and scored; the
evaluation hook receives each pass's rollouts. Sampling (params.yaml `traces:`, TracesConfig):

    RL          steps 1, 1 + rl_every, 1 + 2 rl_every, ... and the last step; in each, the first
                rl_groups groups (the step's tasks are a seeded random draw) with all G rollouts,
                so a group's spread of rewards and advantages reads side by side
    evaluation  every eval_every-th episode (default 1: all of them)

Each trace is tagged (strings, searchable with `mlflow.search_traces(filter_string=...)`):
task_id, category, goal (high | low | none), reward ("0" | "1"; BFCL: the paper R), one
reward_<check> per other check of the environment (BFCL: reward_bfcl), outcome
(success | failure), stage (rl, or the evaluation run's name, e.g. eval_rl_tasks_before),
protocol, variant, and rl_step / policy_version / group (RL) or seed (evaluation); the root span
carries the same as typed attributes plus the checker's reason, the advantage and token counts.
A trace that cannot be written is counted and warned about; training never stops for it.

    from rcgrpo.tracking.traces import find_traces
    find_traces(run_id, task_id="multi_turn_base_12", reward="1")      # mlflow.search_traces
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.fields import config_class, ranged, setting
from rcgrpo.tracking.episodes import check_fields

GOALS = {HIGH: "high", LOW: "low", None: "none"}


@config_class
class TracesConfig:
    """params.yaml `traces:` section: which recorded episodes become MLflow traces."""

    enabled: bool = setting(True, "write episode traces (RL and evaluation) into the stage's run")
    rl_every: int = ranged(
        5, "[0, inf)", "RL steps 1, 1+N, 1+2N, ... and the last are traced (0 = none)"
    )
    rl_groups: int = ranged(
        2, "[0, inf)", "groups per traced RL step, each with all G rollouts (0 = all)"
    )
    eval_every: int = ranged(1, "[0, inf)", "every N-th evaluation episode (1 = all, 0 = none)")
    max_chars: int = ranged(4000, "[0, inf)", "characters kept per text field of a span (0 = all)")


def traced_step(step: int, steps: int, every: int) -> bool:
    """Whether RL step `step` (1-based, of `steps`) is traced: 1, 1+every, ... and the last.

    >>> [s for s in range(1, 21) if traced_step(s, 20, 5)]
    [1, 6, 11, 16, 20]
    """
    return every > 0 and ((step - 1) % every == 0 or step == steps)


def traced_rollouts(n_rollouts: int, group_size: int, groups: int) -> range:
    """Indices (group-major) of the rollouts of the first `groups` groups (0 = every group).

    >>> list(traced_rollouts(12, 4, 2))
    [0, 1, 2, 3, 4, 5, 6, 7]
    """
    n_groups = n_rollouts // max(group_size, 1)
    return range(min(groups or n_groups, n_groups) * group_size)


def _recorded(rollout) -> bool:
    """An agent-loop rollout (messages, mask, log-probs and the scored record), not a bare one."""
    return all(getattr(rollout, k, None) is not None for k in ("messages", "mask", "trajectory"))


def _common(rollout, goal: str) -> tuple[dict, dict]:
    """(attributes, tags) every episode trace has."""
    record = rollout.trajectory
    values, reasons = check_fields(record)
    attributes = {
        "task_id": record.task_id,
        "category": record.category,
        "goal": goal,
        **values,
        "reason": reasons["reason"],
        "failing_turn": reasons["failing_turn"],
        "stop_reason": rollout.stop_reason,
        "protocol": record.protocol,
        "sampled_tokens": sum(rollout.mask),
        "episode_tokens": len(rollout.mask),
    }
    tags = {k: attributes[k] for k in ("task_id", "category", "goal", *values, "protocol")}
    tags["outcome"] = "success" if record.reward else "failure"
    return attributes, tags


class EpisodeTracer:
    """Writes episode traces into one MLflow run; counts and times itself; never raises.

    base: tags for every trace of the run (e.g. {"variant": "rctp+rc-grpo"}).
    """

    def __init__(self, run_id: str, cfg: TracesConfig, base: dict | None = None):
        from mlflow.tracking import MlflowClient

        self.run_id, self.cfg = run_id, cfg
        self.base = {k: v for k, v in (base or {}).items() if v not in (None, "")}
        self.experiment_id = MlflowClient().get_run(run_id).info.experiment_id
        self.written: list[dict] = []  # {"trace_id", **tags} per trace, in order
        self.seconds = 0.0  # wall time spent building and storing traces
        self.failed = 0

    def write(self, episodes: list[tuple]) -> None:
        """episodes: (rollout, name, attributes, tags, (start_ns, end_ns)) each."""
        from rcgrpo.tracking.trace_store import write_traces

        if not episodes:
            return
        t0 = time.perf_counter()
        episodes = [(r, n, {**self.base, **a}, {**self.base, **t}, w) for r, n, a, t, w in episodes]
        try:
            ids = write_traces(self.experiment_id, self.run_id, episodes, self.cfg.max_chars)
        except Exception as e:  # noqa: BLE001 - telemetry must not end a training run
            self.failed += len(episodes)
            warnings.warn(
                f"{len(episodes)} episode traces of run {self.run_id} not written: "
                f"{type(e).__name__}: {e}",
                stacklevel=2,
            )
        else:
            tags = [{k: str(v) for k, v in e[3].items()} for e in episodes]
            self.written += [{"trace_id": i, **t} for i, t in zip(ids, tags, strict=True)]
        self.seconds += time.perf_counter() - t0

    def metrics(self) -> dict:
        """`traces/episodes`, `traces/failed` and `perf/trace_s` (docs/metrics.md)."""
        return {
            "traces/episodes": len(self.written),
            "traces/failed": self.failed,
            "perf/trace_s": self.seconds,
        }


def rl_hook(tracer: EpisodeTracer, steps: int, group_size: int) -> Callable[[int, object], None]:
    """`on_rollouts(step, out)` for the RL Trainer: traces the sampled groups of sampled steps.
    out: the step's rcgrpo.training.grpo.rollouts.StepRollouts (group-major); the traces are
    built from out.records, the whole rollouts this (main) rank sampled, from which the update's
    ids, loss mask and log-probs (out.rollouts) were taken. Under torchrun the main rank holds
    the first groups, so the first rl_groups groups are traced as long as it has them."""
    cfg = tracer.cfg

    def on_rollouts(step: int, out) -> None:
        if not traced_step(step, steps, cfg.rl_every):
            return
        end = time.time_ns()
        window = (end - int(out.seconds * 1e9), end)  # the step's rollout wall time
        episodes = []
        for i in traced_rollouts(len(out.rollouts), group_size, cfg.rl_groups):
            if not 0 <= i - out.first < len(out.records):  # sampled by another rank
                continue
            rollout = out.records[i - out.first]  # the record out.rollouts[i] was taken from
            if not _recorded(rollout):
                continue
            attributes, tags = _common(rollout, GOALS.get(out.tokens[i], str(out.tokens[i])))
            version = getattr(rollout, "policy_version", step - 1)  # weights after step-1 updates
            extra = {
                "stage": "rl",
                "rl_step": step,
                "policy_version": version,
                "group": i // group_size,
            }
            tags.update(extra)
            attributes.update(
                extra,
                advantage=float(out.advantages[i]),
                training_reward=float(out.rewards.flatten()[i]),
            )
            name = f"rl step {step} {attributes['task_id']}"
            episodes.append((rollout, name, attributes, tags, window))
        tracer.write(episodes)

    return on_rollouts


def eval_hook(tracer: EpisodeTracer, stage: str) -> Callable[[dict, list], None]:
    """`on_rollouts(info, rollouts)` for rcgrpo.evaluation.evaluate: every eval_every-th episode.
    info: {"seed", "protocol", "token", "start_ns"} of the pass."""
    every, seen = tracer.cfg.eval_every, [0]

    def on_rollouts(info: dict, rollouts: list) -> None:
        window = (info.get("start_ns") or time.time_ns(), time.time_ns())
        episodes = []
        for rollout in rollouts:
            seen[0] += 1
            if not every or (seen[0] - 1) % every or not _recorded(rollout):
                continue
            attributes, tags = _common(rollout, info.get("token", "none"))
            extra = {"stage": stage, "seed": info.get("seed", 0)}
            tags.update(extra)
            attributes.update(extra)
            episodes.append((rollout, f"{stage} {attributes['task_id']}", attributes, tags, window))
        tracer.write(episodes)

    return on_rollouts


def run_variant(run_id: str) -> str:
    """The `variant` tag of the run or of its parent (the pipeline run), else ""."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    tags = client.get_run(run_id).data.tags
    if "variant" not in tags and (parent := tags.get("mlflow.parentRunId")):
        tags = client.get_run(parent).data.tags
    return tags.get("variant", "")


def find_traces(run_id: str | None = None, experiment_id: str | None = None, **tags) -> list:
    """Traces of a run (or an experiment) whose tags equal `tags`, e.g. task_id="...",
    reward="1", goal="high": `mlflow.search_traces` with a tag filter. Trace objects."""
    import mlflow
    from mlflow.tracking import MlflowClient

    if experiment_id is None:
        experiment_id = MlflowClient().get_run(run_id).info.experiment_id
    where = " AND ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
    return mlflow.search_traces(
        locations=[experiment_id],
        run_id=run_id,
        return_type="list",
        filter_string=where or None,
        max_results=10_000,
    )

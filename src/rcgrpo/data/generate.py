"""The dataset's two made sources, task by task, from the run's environment: experts (a correct
trajectory of each task, `Environment.expert`) and failures made from them
(`Environment.failures`: BFCL's perturbations, the calculator's wrong calls), kept when the
data stage's rule calls them usable (rcgrpo.data.failures.is_usable_failure).

An expert that does not earn reward 1 is returned in `ExpertReport.failed` with its task id and
the checker's reason (the dataset manifest lists them), never dropped silently.

    .venv/bin/pytest tests/test_dataset.py -q
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rcgrpo.chat.record import Trajectory
from rcgrpo.data.failures import is_usable_failure
from rcgrpo.rollout.environment import Environment


@dataclass
class ExpertReport:
    experts: list[Trajectory]  # reward 1: the high-quality set
    failed: list[dict] = field(default_factory=list)  # {"task_id", "reason"}: an expert < 1


def generate_experts(
    env: Environment, tasks: list, split: str, protocol: str, progress=None
) -> ExpertReport:
    """Experts of every task; those not scoring 1 are reported by task id, not kept as high."""
    report = ExpertReport([])
    for i, task in enumerate(tasks):
        record = env.expert(task, protocol, split)
        if record.reward == 1:
            report.experts.append(record)
        else:
            # the first check's reason (BFCL: the paper checker's), else all of them
            reasons = record.reward_reason
            reason = reasons.get(next(iter(record.checks), ""), reasons)
            report.failed.append({"task_id": task.id, "reason": reason})
        if progress:
            progress(i + 1, len(tasks))
    return report


def generate_failures(
    env: Environment,
    tasks: list,
    split: str,
    protocol: str,
    seed: int,
    kinds=("all",),
    attempts: int = 4,
    progress=None,
) -> list[Trajectory]:
    """The usable failures the environment makes from every task's expert, in task order, of
    `kinds` (("all",): every kind the environment has; (): none)."""
    kinds = tuple(env.kinds) if tuple(kinds) == ("all",) else tuple(kinds)
    out: list[Trajectory] = []
    for i, task in enumerate(tasks):
        if kinds:
            out += env.failures(task, protocol, split, seed, kinds, attempts, is_usable_failure)
        if progress:
            progress(i + 1, len(tasks))
    return out

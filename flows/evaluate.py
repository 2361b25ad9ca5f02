"""Prefect flow: one evaluation (the held-out tasks, or the RL tasks before / after RL) as one
MLflow run nested under the pipeline's run, run by `rcgrpo stage NAME` in a process of its own.

The flow is thin: it opens the evaluation's MLflow run, and its one task starts the stage's
process (rcgrpo.tracking.stage_process), which loads the model, rolls out, scores, writes
report.json / outcomes.jsonl / bfcl_results/ / table.md, logs settings, metrics, episode traces
and the output folder to that run (rcgrpo.tracking.evaluation: the one evaluation body, the same
one dvc.yaml's `rcgrpo stage eval` runs) and writes its result back. This process loads no model.

    rcgrpo run --stages eval                              # through the pipeline
    rcgrpo stage eval --model outputs/rl/final            # the same body without Prefect
"""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rcgrpo.run_config import RunConfig
from rcgrpo.runtime import apply_defaults
from rcgrpo.tracking import runs as tracking
from rcgrpo.tracking.stage_process import run_stage_process

apply_defaults()


@task(cache_policy=NO_CACHE)
def score(stage: str, rc: RunConfig, model_path: str, run_id: str) -> dict:
    """The stage's process (compute: a retry would start over, so none); its result."""
    return run_stage_process(stage, rc, run_id, ["--model", model_path])


@flow(name="rcgrpo-evaluate", log_prints=True, validate_parameters=False)
def evaluate_flow(
    model_path: str, rc: RunConfig, parent_run_id: str | None = None, stage: str = "eval"
) -> dict:
    """Evaluate `model_path` as `stage` (eval | eval_rl_tasks_before | eval_rl_tasks_after)
    under `rc`; {"run_id", "report" (path), "table" (path), "metrics", "traces" (the episode
    traces: {"trace_id", **tags} each)}. Metric names start with eval/ (held out) or
    rl_tasks/before/, rl_tasks/after/ (rcgrpo.tracking.evaluation.PREFIXES)."""
    with tracking.start_run(stage, parent_run_id=parent_run_id, tags={"stage": "eval"}) as run:
        return score(stage, rc, model_path, run.info.run_id)

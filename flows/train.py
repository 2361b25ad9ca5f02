"""Prefect flow for one training stage: RCTP-FT / SFT or RC-GRPO / GRPO as one MLflow run nested
under the pipeline's run, from the run's resolved settings (rcgrpo.run_config.RunConfig).

The flow is thin: it opens the stage's MLflow run, trains in one task that starts `rcgrpo stage
STAGE` in a process of its own (rcgrpo.tracking.stage.launch: a plain child, or N torchrun ranks
on `--procs N`; every step to MLflow, one headline line per step, RL episode traces), then logs
the saved model folder as the run's `model` artifact (an I/O task, the only one retried). This
process loads no model. Registration in the Model Registry happens after evaluation
(flows/pipeline.py) so the version carries the held-out metrics.

    rcgrpo stage rctp --set epochs=1                   # one stage on its own, without Prefect
"""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rcgrpo.run_config import TRAIN_STAGES, RunConfig
from rcgrpo.runtime import apply_defaults
from rcgrpo.tracking import runs as tracking
from rcgrpo.tracking import stage as stages

apply_defaults()


@task(cache_policy=NO_CACHE)
def fit(stage: str, rc: RunConfig, run_id: str, resume: bool = False) -> str:
    """Train in the stage's own process (compute: a retry would start over, so none); the
    final model's folder."""
    return str(stages.launch(stage, rc, run_id, resume))


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def log_model(run_id: str, model_path: str) -> None:
    """The model folder as the run's `model` artifact, plus the stage's metrics and config files."""
    stages.log_outputs(run_id, model_path)


@flow(name="rcgrpo-train", log_prints=True, validate_parameters=False)
def train_flow(
    stage: str, rc: RunConfig, parent_run_id: str | None = None, state: dict | None = None
) -> dict:
    """Train `stage` (rctp | sft | rl) as `rc` says; {"run_id", "model_path", "config"}.
    `state`: the pipeline's (rcgrpo.tracking.orphans): the stage's MLflow run is recorded there
    when it starts, and one recorded already (an interrupted run's) is reopened and resumed
    from its last checkpoint instead."""
    if stage not in TRAIN_STAGES:
        raise ValueError(f"stage {stage!r}: expected one of {TRAIN_STAGES}")
    config = stages.stage_config(rc, stage)
    earlier = (state or {}).get("runs", {}).get(stage, {}).get("run_id")
    with tracking.start_run(
        stage, config=config, parent_run_id=parent_run_id, tags={"stage": stage}, run_id=earlier
    ) as run:
        run_id = run.info.run_id
        if state is not None and not earlier:
            from rcgrpo.tracking.orphans import record

            record(state, stage, {"run_id": run_id}, done=False)
        model_path = fit(stage, rc, run_id, bool(earlier))
        log_model(run_id, model_path)
    print(f"{stage}: model {model_path} (MLflow run {run_id})")
    return {"run_id": run_id, "model_path": model_path, "config": config}

"""Runs left RUNNING by a killed pipeline are marked FAILED by the next one.

A pipeline killed by SIGKILL (or a lost machine) never ends its MLflow runs, so the UI showed
them running forever. The next pipeline run holds the project's run lock (rcgrpo.run_lock), so
no other pipeline can be live: every RUNNING run tagged `stage=pipeline`, and every RUNNING run
below it, was left by a dead process. They get status FAILED and the tag `rcgrpo.killed`. A
standalone `rcgrpo train` run (no pipeline parent) is never touched: it does not take the lock.

    fail_killed_pipelines()          # call with the run lock held; the ids it marked
    .venv/bin/pytest tests/test_orphans.py -q
"""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from rcgrpo.tracking.runs import EXPERIMENT, configure


def fail_killed_pipelines(experiment: str = EXPERIMENT) -> list[str]:
    """Mark every RUNNING pipeline run and its RUNNING descendants FAILED; their ids."""
    exp_id = configure(experiment=experiment)
    client = MlflowClient()
    running = "attributes.status = 'RUNNING'"
    todo = [
        r.info.run_id
        for r in client.search_runs([exp_id], f"{running} AND tags.stage = 'pipeline'")
    ]
    marked: list[str] = []
    while todo:
        run_id = todo.pop()
        marked.append(run_id)
        below = client.search_runs(
            [exp_id], f"{running} AND tags.`mlflow.parentRunId` = '{run_id}'"
        )
        todo += [r.info.run_id for r in below if r.info.run_id not in marked]
    for run_id in marked:
        client.set_tag(run_id, "rcgrpo.killed", "left RUNNING by a killed pipeline; marked FAILED")
        client.set_terminated(run_id, "FAILED")
    return marked

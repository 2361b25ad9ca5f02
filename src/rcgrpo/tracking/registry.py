"""The MLflow Model Registry and reading runs back: model versions tagged with their data, code
and metrics; a pipeline's stage runs; metric histories for plots; the UI link of a run.

    .venv/bin/pytest tests/test_tracking.py -q
"""

from __future__ import annotations

import contextlib
import json

import mlflow
from mlflow.tracking import MlflowClient

from rcgrpo.tracking.runs import _as_dict


def register_model(
    run_id: str,
    artifact_path: str,
    name: str,
    config=None,
    metrics: dict | None = None,
    description: str = "",
):
    """A new version of registered model `name` whose source is `runs:/<run>/<artifact_path>`
    (log the adapter folder there first), tagged with the run's data version, git commit, its
    config (JSON) and `metrics` (one tag each). Returns the ModelVersion."""
    client = MlflowClient()
    run = client.get_run(run_id)
    with contextlib.suppress(mlflow.exceptions.MlflowException):
        client.create_registered_model(name)  # already exists: fine
    tags = {
        k: run.data.tags.get(k, "")
        for k in ("data.rev", "data.md5", "data.version", "git.commit", "git.dirty")
    }
    tags["config"] = json.dumps(_as_dict(config), default=str)[:5000]
    for key, value in (metrics or {}).items():
        tags[f"metric.{key}"] = str(value)
    source = f"{run.info.artifact_uri.rstrip('/')}/{artifact_path}"
    return client.create_model_version(
        name, source=source, run_id=run_id, tags=tags, description=description or None
    )


def child_runs(parent_run_id: str) -> list:
    """Runs whose parent is `parent_run_id` (e.g. a pipeline's stage runs), oldest first."""
    client = MlflowClient()
    parent = client.get_run(parent_run_id)
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
        order_by=["attributes.start_time ASC"],
    )
    return list(runs)


def metric_histories(run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric of the run as {name: [(step, value), ...]} sorted by step (for plots)."""
    client = MlflowClient()
    names = client.get_run(run_id).data.metrics
    return {
        k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in names
    }


# MLflow 3.17's UI opens an experiment in its GenAI view (traces overview, "Evaluation runs")
# unless the URL asks for the model-training view: the sidebar switch "GenAI | Model training"
# is read from `?workflowType=` (then the browser's localStorage), not from the experiment's
# `mlflow.experimentKind` tag (a feature flag of the 3.17 UI bundle ignores it; checked in
# headless Chromium, scripts/ui_check.py). Every link rcgrpo prints therefore carries it.
UI = "http://127.0.0.1:5000"
TRAINING_VIEW = "workflowType=machine_learning"


def experiment_url(experiment_id: str, host: str = UI) -> str:
    """The experiment's runs table in the model-training view."""
    return f"{host}/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"


def experiment_link(host: str) -> str:
    """The rcgrpo experiment in the UI's model-training view (MLflow 3.17 opens the GenAI view
    without `?workflowType=`); the bare host before the first run."""
    from rcgrpo.tracking import runs as tracking

    exp = MlflowClient(tracking.tracking_uri()).get_experiment_by_name(tracking.EXPERIMENT)
    return experiment_url(exp.experiment_id, host) if exp else host


def run_url(run_id: str, host: str = UI, page: str = "") -> str:
    """Where the MLflow UI (`rcgrpo ui`) shows the run, in the model-training view; page:
    "" (overview), "model-metrics" (its charts), "traces" (its episode traces)."""
    run = MlflowClient().get_run(run_id)
    tail = f"/{page}" if page else ""
    return f"{host}/#/experiments/{run.info.experiment_id}/runs/{run_id}{tail}?{TRAINING_VIEW}"


def trace_url(run_id: str, trace_id: str, host: str = UI) -> str:
    """One trace opened in the experiment's trace view (run_id: any run of the experiment)."""
    eid = MlflowClient().get_run(run_id).info.experiment_id
    return f"{host}/#/experiments/{eid}/traces?{TRAINING_VIEW}&selectedEvaluationId={trace_id}"

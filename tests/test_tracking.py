"""rcgrpo.tracking.runs against a real SQLite MLflow store in a temporary project folder."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from rcgrpo.tracking import registry  # noqa: E402
from rcgrpo.tracking import runs as tracking  # noqa: E402


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A git project with a committed data.dvc, like a checkout after `rcgrpo data build`."""
    root = tmp_path_factory.mktemp("proj")
    (root / "mlflow").mkdir()
    (root / "data.dvc").write_text(
        "outs:\n- md5: 0123456789abcdef0123456789abcdef.dir\n  path: data\n"
    )
    for cmd in (
        ["git", "init", "-q"],
        ["git", "add", "data.dvc"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "data"],
    ):
        subprocess.run(cmd, cwd=root, check=True)
    return root


def test_store_is_sqlite_in_project_mlflow_folder(project):
    assert tracking.tracking_uri(project) == f"sqlite:///{project.resolve()}/mlflow/mlflow.db"
    with tracking.start_run("probe", root=project) as run:
        tracking.log_metrics(run.info.run_id, {"x": 1.0}, 0)
    assert (project / "mlflow" / "mlflow.db").exists()
    art = Path(MlflowClient().get_run(run.info.run_id).info.artifact_uri.removeprefix("file://"))
    assert art.is_relative_to(project.resolve() / "mlflow" / "artifacts")
    assert not list((project / "mlflow").rglob("*.py"))  # never shadows the package


def test_run_records_versions_config_and_nests(project):
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True
    ).stdout.strip()
    config = {"rl": {"lr": 1e-6, "group_size": 5}, "tokens": ["high", "low"]}
    with tracking.start_run("pipeline", config=config, root=project) as parent:
        pid = parent.info.run_id
        # a stage in another thread (as a Prefect task would run) still nests under the parent
        box = {}

        def stage():
            with tracking.start_run(
                "rl", config=config["rl"], parent_run_id=pid, root=project
            ) as r:
                log = tracking.metrics_logger(r.info.run_id)
                for step in range(3):
                    log({"reward/mean": 0.1 * step, "rollout/zero_variance_frac": 0.5}, step)
                box["id"] = r.info.run_id

        t = threading.Thread(target=stage)
        t.start()
        t.join()
    client = MlflowClient()
    run = client.get_run(pid)
    assert run.info.status == "FINISHED"
    assert run.data.tags["git.commit"] == head
    assert run.data.tags["data.md5"] == "0123456789abcdef0123456789abcdef.dir"
    assert run.data.tags["data.rev"] == head
    assert run.data.params["rl.lr"] == "1e-06"
    assert json.loads(run.data.params["tokens"]) == ["high", "low"]
    assert "config.json" in [a.path for a in client.list_artifacts(pid)]
    children = registry.child_runs(pid)
    assert [c.info.run_id for c in children] == [box["id"]]
    history = client.get_metric_history(box["id"], "reward/mean")
    assert [(m.step, round(m.value, 3)) for m in history] == [(0, 0.0), (1, 0.1), (2, 0.2)]


def test_failed_block_marks_run_failed(project):
    with pytest.raises(RuntimeError), tracking.start_run("boom", root=project) as run:
        raise RuntimeError("stage crashed")
    assert MlflowClient().get_run(run.info.run_id).info.status == "FAILED"


def test_register_model_version_carries_data_config_metrics(project, tmp_path):
    adapter = tmp_path / "final"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with tracking.start_run("rctp", config={"lr": 1e-5}, root=project) as run:
        rid = run.info.run_id
        tracking.log_artifact(rid, adapter, "model")
        v1 = registry.register_model(rid, "model", "rcgrpo-test", {"lr": 1e-5}, {"eval/acc": 0.25})
        v2 = registry.register_model(rid, "model", "rcgrpo-test", {"lr": 1e-5}, {"eval/acc": 0.3})
    assert (int(v1.version), int(v2.version)) == (1, 2)
    mv = MlflowClient().get_model_version("rcgrpo-test", "1")
    assert mv.run_id == rid
    assert mv.tags["data.md5"] == "0123456789abcdef0123456789abcdef.dir"
    assert json.loads(mv.tags["config"]) == {"lr": 1e-5}
    assert mv.tags["metric.eval/acc"] == "0.25"
    src = Path(mv.source.removeprefix("file://"))
    assert (src / "adapter_config.json").exists()


def test_metrics_skip_non_numbers(project):
    with tracking.start_run("m", root=project) as run:
        tracking.log_metrics(
            run.info.run_id, {"a": 1, "b": float("nan"), "c": "text", "d": True}, 0
        )
    assert set(MlflowClient().get_run(run.info.run_id).data.metrics) == {"a"}


def test_mlflow_tracking_uri_moves_the_store(mlflow_store):
    """MLFLOW_TRACKING_URI (set by the fixture, as a scheduled sandbox would) wins over the
    project's mlflow/ when no root is given: runs, artifacts and registry all go there."""
    with tracking.start_run("env-probe", config={"a": 1}) as run:
        tracking.log_metrics(run.info.run_id, {"x": 2.0}, 0)
    assert (mlflow_store / "mlflow.db").exists()
    client = MlflowClient(f"sqlite:///{mlflow_store}/mlflow.db")
    got = client.get_run(run.info.run_id)
    assert got.data.metrics == {"x": 2.0}
    assert got.info.artifact_uri.startswith((mlflow_store / "artifacts").as_uri())

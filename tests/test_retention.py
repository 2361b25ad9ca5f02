"""Retention (params.yaml `retention:`): old checkpoints pruned with the resume one kept, MLflow
run families removed for good (runs, artifacts, traces) except registered and running ones,
and `dvc gc` that keeps every branch tip's data. Real torch checkpoints, a real SQLite MLflow
store in a temp folder, real git + DVC projects with a local remote. ~30 s.

    .venv/bin/pytest tests/test_retention.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from rcgrpo.runtime import project_root
from rcgrpo.tracking.retention import RetentionConfig, doomed_families, families
from rcgrpo.training import checkpoint
from rcgrpo.training.run_identity import begin


def _save_steps(out, steps, config: dict) -> None:
    """A fresh run into `out` that saves checkpoints at `steps` (real state.pt files)."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    _, run = begin(out, config)
    for step in steps:
        checkpoint.save(checkpoint.path_for(out, step), model, opt, None, step, run=run)


def test_keep_last_checkpoints_keeps_the_resume_one_and_never_final_or_best(tmp_path):
    out = tmp_path / "rl"
    _save_steps(out, [1, 2], {"lr": 1})  # an earlier run: moved aside by the next one
    _save_steps(out, [1, 2, 3, 4, 5], {"lr": 2})
    (out / "checkpoints" / "best").mkdir()  # not a step_<n> folder: never ours to remove
    (out / "final").mkdir()
    assert len(list(out.glob("checkpoints.old-*"))) == 1
    planned = checkpoint.prune(out, 2, dry_run=True)
    assert len(planned) == 4 and all(p.exists() for p in planned)
    gone = checkpoint.prune(out, 2)
    assert [p.name for p in gone[:3]] == ["step_000001", "step_000002", "step_000003"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "best", "step_000004", "step_000005",
    ]  # fmt: skip
    assert not list(out.glob("checkpoints.old-*")) and (out / "final").is_dir()
    ckpt, _ = begin(out, {"lr": 2}, resume=True)  # --resume still finds its own latest
    assert ckpt.name == "step_000005"
    assert checkpoint.prune(out, 0) == []  # 0 keeps everything


def test_families_and_which_go_by_hand():
    runs = [
        {"id": "p1", "parent": None, "start": 100, "status": "FINISHED"},
        {"id": "c1", "parent": "p1", "start": 101, "status": "FINISHED"},
        {"id": "p2", "parent": None, "start": 200, "status": "FINISHED"},
        {"id": "c2", "parent": "p2", "start": 201, "status": "FINISHED"},
        {"id": "g2", "parent": "c2", "start": 202, "status": "FINISHED"},
        {"id": "p3", "parent": None, "start": 300, "status": "RUNNING"},
        {"id": "p4", "parent": None, "start": 400, "status": "FINISHED"},
    ]
    groups = families(runs)
    assert [[r["id"] for r in g] for g in groups] == [
        ["p4"],
        ["p3"],
        ["p2", "c2", "g2"],
        ["p1", "c1"],
    ]
    ids = lambda doomed: [g[0]["id"] for g in doomed]  # noqa: E731
    assert ids(doomed_families(groups, 1, 0, set())) == ["p2", "p1"]  # p3 is RUNNING
    assert ids(doomed_families(groups, 1, 0, {"g2"})) == ["p1"]  # p2's grandchild is registered
    assert ids(doomed_families(groups, 0, 250, set())) == ["p2", "p1"]  # started before 250
    assert ids(doomed_families(groups, 0, 0, set())) == []


def _family(client, exp_id: str, start_ms: int, tmp_path, status="FINISHED") -> tuple[str, str]:
    """A pipeline run and one stage run below it, an artifact and a trace on the stage run."""
    from mlflow.entities import TraceInfo, TraceLocation, TraceState
    from mlflow.tracing.client import TracingClient
    from mlflow.tracing.constant import TraceMetadataKey

    top = client.create_run(exp_id, start_time=start_ms, tags={"stage": "pipeline"})
    stage = client.create_run(
        exp_id, start_time=start_ms + 1, tags={"mlflow.parentRunId": top.info.run_id}
    )
    sid = stage.info.run_id
    (tmp_path / "weights.txt").write_text(sid)
    client.log_artifact(sid, str(tmp_path / "weights.txt"), "model")
    info = TraceInfo(
        trace_id="tr-" + os.urandom(16).hex(),
        trace_location=TraceLocation.from_experiment_id(exp_id),
        request_time=start_ms,
        execution_duration=1,
        state=TraceState.OK,
        trace_metadata={TraceMetadataKey.SOURCE_RUN: sid},
    )
    TracingClient().start_trace(info)
    for run_id in (sid, top.info.run_id):
        if status != "RUNNING":
            client.set_terminated(run_id, status)
    return top.info.run_id, sid


def test_mlflow_runs_beyond_the_last_n_go_with_artifacts_and_traces(mlflow_store, tmp_path):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from rcgrpo.tracking.retention import prune_mlflow
    from rcgrpo.tracking.runs import configure

    exp_id = configure()
    client = MlflowClient()
    registered = _family(client, exp_id, 1_000, tmp_path)  # oldest, but a registered version
    client.create_registered_model("rcgrpo")
    source = client.get_run(registered[1]).info.artifact_uri + "/model"
    client.create_model_version("rcgrpo", source, run_id=registered[1])
    running = _family(client, exp_id, 2_000, tmp_path, status="RUNNING")
    old = [_family(client, exp_id, t, tmp_path) for t in (3_000, 4_000)]
    newest = _family(client, exp_id, 5_000, tmp_path)
    art = {sid: client.get_run(sid).info.artifact_uri.removeprefix("file://") for _, sid in old}
    assert all(os.path.isdir(a) for a in art.values())

    cfg = RetentionConfig(mlflow_keep_runs=1)
    planned = prune_mlflow(cfg, dry_run=True)
    assert sorted(planned) == sorted(r for fam in old for r in fam)
    assert client.get_run(old[0][0]).info.lifecycle_stage == "active"  # dry run: nothing went
    assert sorted(prune_mlflow(cfg)) == sorted(planned)
    for run_id in planned:  # gone for good, not just marked deleted
        with pytest.raises(MlflowException):
            client.get_run(run_id)
    assert not any(os.path.exists(a) for a in art.values())  # their artifact folders too
    left = {t.info.trace_metadata["mlflow.sourceRun"]
            for t in client.search_traces(locations=[exp_id], include_spans=False)}  # fmt: skip
    assert left == {registered[1], running[1], newest[1]}
    for fam in (registered, running, newest):
        assert all(client.get_run(r).info.lifecycle_stage == "active" for r in fam)
    assert client.get_model_version("rcgrpo", "1").status == "READY"


def _objects(root, md5: str) -> list:
    """Where a version's .dir object lies: [cache?, remote?]."""
    rel = os.path.join("files", "md5", md5[:2], md5[2:])
    return [
        os.path.exists(root / ".dvc" / "cache" / rel),
        os.path.exists(root / "dvc_remote" / rel),
    ]


def test_dvc_gc_keeps_the_workspace_and_every_branch_tip(tmp_path):
    from test_versioning import built, git, make_project

    from rcgrpo.data.publishing import publish
    from rcgrpo.data.retention import collect_garbage

    root = make_project(tmp_path / "proj")
    v1 = publish(built(root, 0)[0], root)
    v2 = publish(built(root, 1)[0], root)  # main's data.dvc points here
    git(root, "checkout", "-q", "-b", "nightly")
    v3 = publish(built(root, 2)[0], root)  # the workspace, on another branch
    assert [_objects(root, v["md5"]) for v in (v1, v2, v3)] == [[True, True]] * 3
    said = collect_garbage(root, keep_commits=1)  # the cache only: the remote keeps old ones
    assert any(line.startswith("Removed") for line in said), said
    assert [_objects(root, v["md5"]) for v in (v1, v2, v3)] == [
        [False, True], [True, True], [True, True],
    ]  # fmt: skip
    collect_garbage(root, keep_commits=1, cloud=True)
    assert _objects(root, v1["md5"]) == [False, False]
    assert _objects(root, v2["md5"]) == [True, True] and _objects(root, v3["md5"]) == [True, True]


def test_rcgrpo_prune_command_on_a_project(tmp_path):
    """`rcgrpo prune --project P`: dry run first (nothing goes), then for real, both printing
    what went; the run lock is taken, the project's params.yaml read, --set applied."""
    from test_versioning import make_project

    root = make_project(tmp_path / "proj")
    shutil.copy(project_root() / "params.yaml", root / "params.yaml")
    _save_steps(root / "outputs" / "rl", [1, 2, 3], {"lr": 1})
    env = {**os.environ, "PYTHONPATH": str(project_root() / "src"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow/mlflow.db"}  # fmt: skip
    (tmp_path / "mlflow").mkdir()
    cmd = [sys.executable, "-m", "rcgrpo.cli", "prune", "--project", str(root)]
    sets = ["--set", "retention.keep_last_checkpoints=1", "--set", "retention.dvc_keep_commits=1"]

    def prune(*extra) -> dict:
        done = subprocess.run([*cmd, *sets, *extra], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith("{"), done.stdout[:300]
        return json.loads(done.stdout)

    dry = prune("--dry-run")
    assert dry["dry_run"] and len(dry["checkpoints"]) == 2 and dry["dvc"]["keep_commits"] == 1
    assert len(list((root / "outputs" / "rl" / "checkpoints").iterdir())) == 3
    done = prune()
    assert done["checkpoints"] == dry["checkpoints"] and done["mlflow_runs"] == []
    assert [p.name for p in (root / "outputs" / "rl" / "checkpoints").iterdir()] == ["step_000003"]


def test_a_pipeline_run_prunes_last_and_a_failure_is_a_warning(tmp_path, mlflow_store):
    """`prune_after_run`, the last step of `pipeline_flow`, on the RunConfig a run resolves:
    it prunes the stages' out_dirs; a failing part (dvc gc outside a DVC project) warns and
    leaves the finished run alone."""
    from rcgrpo.config import parse_sets
    from rcgrpo.run_config import resolve
    from rcgrpo.tracking.retention import prune_after_run

    out = tmp_path / "rl"
    _save_steps(out, [1, 2, 3], {"lr": 1})
    sets = parse_sets([f"rl.out_dir={out}", "retention.keep_last_checkpoints=2"], True)
    rc = resolve(sets=sets, root=tmp_path)
    assert len(prune_after_run(tmp_path, rc)["checkpoints"]) == 1
    sets = parse_sets([f"rl.out_dir={out}", "retention.dvc_keep_commits=1"], True)
    with pytest.warns(UserWarning, match="retention: pruning failed.*has no .dvc/"):
        result = prune_after_run(tmp_path, resolve(sets=sets, root=tmp_path))
    assert "has no .dvc/" in result["error"]

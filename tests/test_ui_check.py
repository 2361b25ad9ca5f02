"""A finished `rcgrpo run` looked at as a person would: its episodes found with
`mlflow.search_traces`, its report's trace links, and the MLflow UI in headless Chromium
(scripts/ui_check.py: the experiment page in the model-training view, the RL run's charts, a
successful and a failed episode with its tool calls), screenshots saved.

The pipeline runs with small sizes in a temporary copy of the project, fine-tuned long enough
(40 epochs on 4 tasks) that the policy makes tool calls and succeeds on some tasks. Chromium is
Debian's `chromium` package: installed here with apt-get when missing and running as root,
otherwise the test is skipped and says why. ~4-6 min on 2 cores; PNGs under the test's tmp dir.

    .venv/bin/pytest tests/test_ui_check.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_pipeline_e2e import copy_env, copy_project, run_in_copy

from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow

SETS = [
    "dataset.train_tasks=4", "dataset.test_tasks=4", 'dataset.rollouts="off"', "rctp.epochs=40",
    "rl.steps=2", "rl.tasks_per_step=4", "rl.group_size=2", "rl.mini_batch_size=8",
    "rl.micro_batch_size=8", "eval.limit=1", "rollout.max_new_tokens=48",
    "rollout.max_total_tokens=1536", "rollout.max_steps=3", "traces.rl_every=1",
    "traces.rl_groups=0",
]  # fmt: skip


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium: on PATH, else installed with apt-get as root, else a skip saying why."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("the UI check needs Debian's `chromium` package; it is not installed and this "
                    "user cannot install it (needs root and apt-get: apt-get install -y chromium)")  # fmt: skip
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    out = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    if out.returncode:  # a fresh machine may not have read its package lists yet
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
        out = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    if out.returncode or not shutil.which("chromium"):
        pytest.skip(f"apt-get install chromium failed: {(out.stdout + out.stderr)[-300:]}")
    return shutil.which("chromium")


def test_finished_run_seen_in_the_ui(prefect_server, tmp_path, chromium):
    from mlflow.tracking import MlflowClient

    proj = copy_project(project_root(), tmp_path / "proj")
    code, text = run_in_copy(proj, "tiny", SETS, timeout=1200)
    assert code == 0, text[-5000:]
    assert "?workflowType=machine_learning" in text and "episode traces" in text

    # the RL run's episodes, found by task id (and reward / goal) with mlflow.search_traces
    uri = f"sqlite:///{proj}/mlflow/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rcgrpo")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    rl = runs["rl"]
    assert rl.data.metrics["traces/episodes"] == 2 * 4 * 2  # 2 steps x 4 groups x G = 2
    import mlflow

    previous, env_before = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)  # beats a URI an earlier test of this process set
    try:
        from rcgrpo.tracking.traces import find_traces

        tasks = json.loads((proj / "outputs" / "rl" / "tasks.json").read_text())
        for task in tasks:
            hits = find_traces(rl.info.run_id, task_id=task)
            assert len(hits) == 2 * 2, task  # its group at both steps
            assert {t.info.tags["rl_step"] for t in hits} == {"1", "2"}
            for t in hits:
                assert t.info.trace_metadata["mlflow.sourceRun"] == rl.info.run_id
                goal, reward = t.info.tags["goal"], t.info.tags["reward"]
                same = find_traces(rl.info.run_id, task_id=task, goal=goal, reward=reward)
                assert t.info.trace_id in {s.info.trace_id for s in same}
        after = runs["eval_rl_tasks_after"]
        evaluated = find_traces(after.info.run_id)  # every episode: each task under high and low
        assert len(evaluated) == after.data.metrics["traces/episodes"] > 0
        evaluated_tasks = {t.info.tags["task_id"] for t in evaluated}
        goals = [t.info.tags["goal"] for t in evaluated]
        assert goals.count("high") == goals.count("low") == len(evaluated_tasks)
    finally:
        mlflow.set_tracking_uri(previous)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if env_before is not None:
            os.environ["MLFLOW_TRACKING_URI"] = env_before

    # the report names, per RL task, a success and a failure before and after RL
    pipeline = runs["pipeline"]
    summary = (proj / "reports" / pipeline.info.run_id / "summary.md").read_text()
    assert "## Episodes of the RL tasks as MLflow traces" in summary
    rows = [ln for ln in summary.splitlines() if ln.startswith("| multi_turn_")]
    assert {ln.split(" | ")[0][2:] for ln in rows} == evaluated_tasks
    assert "selectedEvaluationId=tr-" in summary and "workflowType=machine_learning" in summary

    # the UI, as a person sees it
    shots = tmp_path / "ui"
    browsers_before = set(Path(tempfile.gettempdir()).glob("org.chromium.*"))
    check = subprocess.run([sys.executable, str(proj / "scripts" / "ui_check.py"), "--store",
                            str(proj / "mlflow"), "--out", str(shots)], cwd=proj, env=copy_env(proj),
                           capture_output=True, text=True, timeout=900)  # fmt: skip
    report = json.loads(check.stdout.strip().splitlines()[-1])
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    # the browser's temporary folders went with its profile, not left in the temp dir
    assert set(Path(tempfile.gettempdir()).glob("org.chromium.*")) <= browsers_before
    assert report["run_id"] == pipeline.info.run_id
    pages = report["pages"]
    assert {"experiment", "default_view", "rl_metrics", "trace_success", "trace_failure"} <= set(
        pages
    )
    assert pages["experiment"]["title"].startswith("Runs")  # the model-training view
    for name in pages:
        assert (shots / f"{name}.png").stat().st_size > 10_000, name
    trace_page = (shots / "trace_failure.txt").read_text()
    assert report["traces"]["failure"]["tool"] in trace_page
    print(json.dumps(report, indent=1))

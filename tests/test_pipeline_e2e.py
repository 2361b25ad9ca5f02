"""End to end: `rcgrpo run` on the tiny profile with small sizes, in a temporary copy of the
project (its own git repo, DVC store, MLflow store; /work/main's git is never touched).

Checks what a user looks at afterwards: a DVC data version committed in git, an MLflow pipeline
run with nested stage runs holding metrics and artifacts, a registered model version tagged with
the data version, config and metrics, the evaluation table, and the report folder. The command
runs under tests/flow_guard.py: the flow's own process may not import torch, transformers or the
model loader (every stage runs in a process of its own). ~2-3 min on 2 cores. The CLI talks to
the session's Prefect test server (fixture `prefect_server`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow

TINY = [
    "dataset.train_tasks=4", "dataset.test_tasks=4", 'dataset.rollouts="off"',
    "rctp.epochs=1", "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=2",
    "rl.mini_batch_size=2", "rl.micro_batch_size=2", "eval.limit=1",
    "rollout.max_new_tokens=24", "rollout.max_total_tokens=1024", "rollout.max_steps=2",
]  # fmt: skip


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def copy_project(src: Path, dest: Path) -> Path:
    """Tracked + untracked-but-not-ignored files (what a clone with local edits holds), plus the
    tiny model cache if present (saves rebuilding the tokenizer); committed in a fresh repo."""
    files = _git(src, "ls-files", "-co", "--exclude-standard").splitlines()
    for rel in files:
        if (src / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dest / rel)
    if (src / "cache" / "models").is_dir():
        shutil.copytree(src / "cache" / "models", dest / "cache" / "models")
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "-c", "user.name=e2e", "-c", "user.email=e2e@localhost", "commit", "-qm", "copy")
    return dest


def copy_env(proj: Path) -> dict[str, str]:
    """The environment of a command in a project copy: its src/, the test's Prefect server, its
    own MLflow store (the copy's mlflow/), a git identity for DVC's commits."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PYTHONPATH": str(proj / "src"), "PREFECT_API_URL": PREFECT_API_URL.value(),
           "GIT_AUTHOR_NAME": "e2e", "GIT_AUTHOR_EMAIL": "e2e@localhost",
           "GIT_COMMITTER_NAME": "e2e", "GIT_COMMITTER_EMAIL": "e2e@localhost"}  # fmt: skip
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # mlflow.set_*_uri export them
        env.pop(key, None)
    return env


def run_in_copy(
    proj: Path, profile: str, sets, timeout: int, guard_log: Path | None = None
) -> tuple[int, str]:
    """`rcgrpo run --profile <profile> --set ...` in a project copy (copy_env): exit code and
    stdout + stderr. guard_log: under tests/flow_guard.py, its refusals written there."""
    cmd = [sys.executable, "-m", "rcgrpo.cli", "run", "--profile", profile]
    env = copy_env(proj)
    if guard_log is not None:
        cmd[1:3] = [str(Path(__file__).with_name("flow_guard.py"))]
        env["FLOW_GUARD_LOG"] = str(guard_log)
    for pair in sets:
        cmd += ["--set", pair]
    out = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True,
                         timeout=timeout)  # fmt: skip
    return out.returncode, out.stdout + out.stderr


def test_main_command_on_tiny_profile(prefect_server, tmp_path):

    main = project_root()
    main_head = _git(main, "rev-parse", "HEAD")
    proj = copy_project(main, tmp_path / "proj")
    guard = tmp_path / "flow_guard.log"
    code, text = run_in_copy(proj, "tiny", TINY, timeout=900, guard_log=guard)
    assert not guard.exists(), f"the flow's process imported:\n{guard.read_text()}"
    assert code == 0, text[-5000:]
    assert "pipeline finished" in text and "http://127.0.0.1:5000/#/experiments/" in text

    # DVC: a data version committed in the copy's git, nothing committed in the main checkout
    dvc_md5 = next(ln.split()[-1] for ln in (proj / "data.dvc").read_text().splitlines()
                   if "md5:" in ln)  # fmt: skip
    assert _git(proj, "log", "-1", "--format=%H", "--", "data.dvc")
    assert _git(main, "rev-parse", "HEAD") == main_head

    # MLflow: the pipeline run with nested stage runs, metrics and artifacts
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{proj}/mlflow/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)  # explicit: no process default
    exp = client.get_experiment_by_name("rcgrpo")
    runs = client.search_runs([exp.experiment_id])
    pipeline = next(r for r in runs if r.info.run_name == "pipeline")
    assert pipeline.info.status == "FINISHED"
    assert pipeline.data.tags["data.md5"] == dvc_md5
    assert pipeline.data.params["rl.steps"] == "2"
    stages = {r.info.run_name: r for r in runs
              if r.data.tags.get("mlflow.parentRunId") == pipeline.info.run_id}  # fmt: skip
    assert set(stages) == {"rctp", "rl", "eval", "eval_rl_tasks_before", "eval_rl_tasks_after"}
    for r in stages.values():
        assert r.info.status == "FINISHED" and r.data.tags["data.md5"] == dvc_md5
    assert client.get_metric_history(stages["rctp"].info.run_id, "sft/loss")
    rl_id = stages["rl"].info.run_id
    assert len(client.get_metric_history(rl_id, "rollout/zero_variance_frac")) == 2
    assert "eval/paper/high/pooled" in stages["eval"].data.metrics
    assert "eval/bfcl_protocol/paper/high/pooled" in stages["eval"].data.metrics  # beside it
    # RL-task success before and after RL, on the pipeline run; the RL tasks are the data's
    rl_tasks = json.loads((proj / "outputs" / "rl" / "tasks.json").read_text())
    data_tasks = {json.loads(ln)["task_id"]
                  for ln in (proj / "data" / "rctp" / "train.jsonl").read_text().splitlines()}  # fmt: skip
    assert set(rl_tasks) == data_tasks and len(rl_tasks) == 4
    for when in ("before", "after"):
        for token in ("high", "low"):
            assert f"rl_tasks/{when}/paper/{token}/pooled" in pipeline.data.metrics
        assert f"rl_tasks/{when}/paper/gap" in pipeline.data.metrics
    assert "model" in [a.path for a in client.list_artifacts(rl_id)]
    assert "eval/table.md" in [a.path for a in client.list_artifacts(stages["eval"].info.run_id,
                                                                      "eval")]  # fmt: skip
    report_files = [a.path for a in client.list_artifacts(pipeline.info.run_id, "report")]
    assert {"report/summary.md", "report/accuracy.png", "report/reward.png"} <= set(report_files)

    # Model Registry: the RL model, tagged with data version, config and eval metrics
    versions = client.search_model_versions("name = 'rcgrpo'")
    assert [int(v.version) for v in versions] == [1], text[-4000:]
    mv = versions[0]
    assert mv.run_id == rl_id and mv.tags["data.md5"] == dvc_md5
    assert json.loads(mv.tags["config"])["rl"]["steps"] == 2
    assert "metric.eval/bfcl/high/pooled" in mv.tags
    assert Path(mv.source.removeprefix("file://")).is_dir()

    # the evaluation table and the report folder
    table = (proj / "outputs" / "eval" / "table.md").read_text()
    assert "| combined | paper | high | 0 | 4 |" in table and "long_context" in table
    assert "| bfcl | paper | high | 0 | 4 |" in table and "greedy decoding" in table
    summary = proj / "reports" / pipeline.info.run_id / "summary.md"
    text = summary.read_text()
    assert "Table 1" in text and (summary.parent / "zero_variance.png").exists()
    assert "before and after RL" in text and "| high | " in text and "not expected to solve" in text


def test_the_calculator_through_the_main_command(prefect_server, tmp_path):
    """`rcgrpo run --set env.name=calculator`: data, fine-tuning, RL and the evaluation on the
    calculator, its checks by name in MLflow, and no BFCL name in what the run wrote."""
    proj = copy_project(project_root(), tmp_path / "proj")
    sets = [*TINY, "env.name=calculator", "dataset.train_categories=[]", "eval.limit=4"]
    code, text = run_in_copy(proj, "tiny", sets, timeout=900)
    assert code == 0, text[-5000:]
    assert "pipeline finished" in text

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{proj}/mlflow/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("rcgrpo").experiment_id])
    by_name = {r.info.run_name: r for r in runs}
    assert {"pipeline", "rctp", "rl", "eval"} <= set(by_name)
    assert all(r.info.status == "FINISHED" for r in runs)
    assert "eval/correct/high/pooled" in by_name["eval"].data.metrics
    assert "eval/used_tool/high/pooled" in by_name["eval"].data.metrics
    assert "rl_tasks/after/correct/gap" in by_name["pipeline"].data.metrics
    names = [m for r in runs for m in r.data.metrics] + [
        str(p.relative_to(proj)) for p in (proj / "outputs").rglob("*")
    ]
    assert not [n for n in names if "bfcl" in n.lower() or "paper" in n], names

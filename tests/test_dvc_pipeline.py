"""dvc.yaml with real DVC in a temporary project copy: `dvc repro evaluate` builds rctp -> rl ->
evaluate (metrics JSON for each), a second repro does nothing, changing one eval param reruns
only `evaluate`, and `dvc exp run -S rl.advantage=sign evaluate` reruns rl + evaluate as an
experiment that `dvc exp show` lists. The training stages run `rcgrpo train STAGE`, the same
entry as `rcgrpo run`'s: each leaves an MLflow run in the copy's store, the rl one with the same
metric names as the pipeline's rl run. Tiny sizes; ~5-7 min on 2 cores (several processes each
import torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_pipeline_e2e import _git, copy_env, copy_project  # tests/ is on sys.path

from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"{cmd}:\n{text[-4000:]}"
    return text


def _ran(text: str) -> list[str]:
    return [ln.split("'")[1] for ln in text.splitlines() if ln.startswith("Running stage")]


def _runs(proj: Path) -> dict:
    """The copy's MLflow runs by name (the last of each name): {name: Run}."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{proj}/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("rcgrpo")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    return {r.info.run_name: r for r in runs}


def test_repro_reruns_only_what_changed_and_exp_run_ablation(prefect_server, tmp_path):
    proj = copy_project(project_root(), tmp_path / "proj")
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PYTHONPATH": str(proj / "src"),
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # mlflow.set_*_uri export them
        env.pop(key, None)
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["rctp"]["epochs"] = 1
    params["rl"].update(
        steps=1, tasks_per_step=2, group_size=2, mini_batch_size=2, micro_batch_size=2
    )
    params["eval"].update(limit=1, tokens=["high", "low"])
    params["rollout"].update(max_new_tokens=16, max_steps=2)
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _git(proj, "commit", "-qam", "tiny params")
    build = [sys.executable, "-m", "rcgrpo.cli", "data", "build", "--set", "train_tasks=8",
             "--set", "test_tasks=4", "--set", 'rollouts="off"', "--set", "push=false"]  # fmt: skip
    _run(build, proj, env)

    first = _run(["dvc", "repro", "evaluate"], proj, env)
    assert _ran(first) == ["rctp", "rl", "evaluate"]
    for stage in ("rctp", "rl", "eval"):
        metrics = json.loads((proj / "outputs" / stage / "metrics.json").read_text())
        assert metrics and all(isinstance(v, int | float) for v in metrics.values())
    # `dvc repro`'s training stages logged to MLflow through the one stage entry; the rl run's
    # metric names are those of `rcgrpo run`'s rl run (same settings, through Prefect)
    dvc_runs = _runs(proj)
    assert {"rctp", "rl"} <= set(dvc_runs) and "sft/loss" in dvc_runs["rctp"].data.metrics
    pipeline = [sys.executable, "-m", "rcgrpo.cli", "run", "--stages", "rl", "--set", "rl.steps=1"]
    pipeline += ["--set", "rl.out_dir=outputs/rl_flow"]  # dvc's outputs/rl stays as it built it
    for key in ("tasks_per_step", "group_size", "mini_batch_size", "micro_batch_size"):
        pipeline += ["--set", f"rl.{key}=2"]
    pipeline += ["--set", "rollout.max_new_tokens=16", "--set", "rollout.max_steps=2"]
    _run(pipeline, proj, copy_env(proj))
    flow_rl = _runs(proj)["rl"]
    assert flow_rl.info.run_id != dvc_runs["rl"].info.run_id
    assert flow_rl.data.tags.get("mlflow.parentRunId")  # nested under the pipeline run
    assert set(dvc_runs["rl"].data.metrics) == set(flow_rl.data.metrics)
    assert "reward/mean" in flow_rl.data.metrics
    _git(proj, "add", "dvc.lock")
    _git(proj, "commit", "-qm", "repro")

    assert _ran(_run(["dvc", "repro", "evaluate"], proj, env)) == []

    params["eval"]["tokens"] = ["high"]
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert _ran(_run(["dvc", "repro", "evaluate"], proj, env)) == ["evaluate"]
    _git(proj, "commit", "-qam", "eval high only")

    exp = _run(["dvc", "exp", "run", "-S", "rl.advantage=sign", "-n", "sign", "evaluate"],
               proj, env)  # fmt: skip
    assert _ran(exp) == ["rl", "evaluate"]
    shown = json.loads(_run(["dvc", "exp", "show", "--json"], proj, env))
    text = json.dumps(shown)
    assert '"sign"' in text and '"advantage": "sign"' in text

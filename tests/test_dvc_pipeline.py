"""dvc.yaml with real DVC in a temporary project copy: `dvc repro evaluate` builds rctp -> rl ->
evaluate (metrics JSON for each), a second repro does nothing, changing one eval param reruns
only `evaluate`, and `dvc exp run -S rl.advantage=sign evaluate` reruns rl + evaluate as an
experiment that `dvc exp show` lists. Tiny sizes; ~4-6 min on 2 cores (several processes each
import torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_pipeline_e2e import _git, copy_project  # tests/ is on sys.path

from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"{cmd}:\n{text[-4000:]}"
    return text


def _ran(text: str) -> list[str]:
    return [ln.split("'")[1] for ln in text.splitlines() if ln.startswith("Running stage")]


def test_repro_reruns_only_what_changed_and_exp_run_ablation(tmp_path):
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

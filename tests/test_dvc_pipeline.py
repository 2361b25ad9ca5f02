"""dvc.yaml with real DVC in a temporary copy of the project, as a fresh clone holds it (no
data/, no outputs/): `dvc repro` alone builds everything, the data included, through `rcgrpo
stage NAME`, the same command `rcgrpo run` starts for each stage. It writes the same rl
run_config.json as `rcgrpo run` on the same params.yaml; an edit of rl.steps there changes
`rcgrpo config show rl` and the steps trained; a second repro does nothing; one eval param
reruns only `evaluate`; `dvc exp run -S rl.advantage=sign evaluate` is an experiment `dvc exp
show` lists; a new data version or a rollback reruns the stages after `data`, not `data`.
Tiny sizes; ~10-15 min on 2 cores (each stage is a process importing torch).

    .venv/bin/pytest tests/test_dvc_pipeline.py -q
"""

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
STAGES = ["data", "rctp", "rl", "rl_tasks_after", "rl_tasks_before", "evaluate", "sft"]


def _run(cmd: list[str], cwd: Path, env: dict) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
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


def _set_params(proj: Path, edit) -> None:
    params = yaml.safe_load((proj / "params.yaml").read_text())
    edit(params)
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _tiny(params: dict) -> None:
    params["dataset"].update(train_tasks=4, test_tasks=4, rollouts="off")
    params["rctp"]["epochs"] = params["sft"]["epochs"] = 1
    params["rl"].update(
        steps=1, tasks_per_step=2, group_size=2, mini_batch_size=2, micro_batch_size=2
    )
    params["eval"].update(limit=1, tokens=["high", "low"])
    params["rollout"].update(max_new_tokens=16, max_steps=2)


def test_a_fresh_clone_repro_builds_everything_as_rcgrpo_run_does(prefect_server, tmp_path):
    proj = copy_project(project_root(), tmp_path / "proj")
    env = copy_env(proj)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    _set_params(proj, _tiny)
    _git(proj, "commit", "-qam", "tiny params")
    assert not (proj / "data").exists()

    first = _run(["dvc", "repro"], proj, env)  # nothing built before: the data stage too
    assert sorted(_ran(first)) == sorted(STAGES)
    assert _git(proj, "log", "-1", "--format=%s", "--", "data.dvc").startswith("data: build")
    version = json.loads((proj / "outputs/data/version.json").read_text())["md5"]
    assert version in (proj / "data.dvc").read_text()
    for stage in ("rctp", "rl", "eval", "eval_rl_tasks/before", "eval_rl_tasks/after"):
        metrics = json.loads((proj / "outputs" / stage / "metrics.json").read_text())
        assert metrics and all(isinstance(v, int | float) for v in metrics.values())
    runs = _runs(proj)  # each stage logged to MLflow through the one stage entry
    assert {"rctp", "sft", "rl", "eval", "eval_rl_tasks_before", "eval_rl_tasks_after"} <= set(runs)
    assert "sft/loss" in runs["rctp"].data.metrics and "reward/mean" in runs["rl"].data.metrics
    assert "rl_tasks/after/paper/high/pooled" in runs["eval_rl_tasks_after"].data.metrics
    dvc_rl = (proj / "outputs/rl/run_config.json").read_text()

    # `rcgrpo run` on the same params.yaml: the same resolved rl config, byte for byte
    _run([sys.executable, "-m", "rcgrpo.cli", "run"], proj, env)
    assert (proj / "outputs/rl/run_config.json").read_text() == dvc_rl
    flow_rl = _runs(proj)["rl"]
    assert flow_rl.info.run_id != runs["rl"].info.run_id and flow_rl.data.tags["mlflow.parentRunId"]
    assert set(runs["rl"].data.metrics) == set(flow_rl.data.metrics)
    _run(["dvc", "commit", "-f"], proj, env)  # the outputs as rcgrpo run left them
    _git(proj, "add", "dvc.lock")
    _git(proj, "commit", "-qm", "repro")
    assert _ran(_run(["dvc", "repro"], proj, env)) == []

    # one edit of params.yaml changes what `rcgrpo config show` says and what trains
    _set_params(proj, lambda p: p["rl"].update(steps=2))
    shown = _run([sys.executable, "-m", "rcgrpo.cli", "config", "show", "rl"], proj, env)
    assert next(ln for ln in shown.splitlines() if ln.split()[:1] == ["steps"]).split()[1] == "2"
    assert _ran(_run(["dvc", "repro", "rl"], proj, env)) == ["rl"]
    steps = (proj / "outputs/rl/metrics.jsonl").read_text().splitlines()
    assert [json.loads(s)["step"] for s in steps] == [1, 2]
    _run(["dvc", "repro"], proj, env)
    _git(proj, "commit", "-qam", "rl.steps=2")

    _set_params(proj, lambda p: p["eval"].update(tokens=["high"]))
    assert _ran(_run(["dvc", "repro", "evaluate"], proj, env)) == ["evaluate"]
    _git(proj, "commit", "-qam", "eval high only")
    exp = _run(["dvc", "exp", "run", "-S", "rl.advantage=sign", "-n", "sign", "evaluate"],
               proj, env)  # fmt: skip
    assert _ran(exp) == ["rl", "evaluate"]
    text = json.dumps(json.loads(_run(["dvc", "exp", "show", "--json"], proj, env)))
    assert '"sign"' in text and '"advantage": "sign"' in text

    # data.dvc stays the pointer: a new version or a rollback makes the training stages stale
    first_rev = _git(proj, "log", "-1", "--format=%H", "--", "data.dvc")
    build = [sys.executable, "-m", "rcgrpo.cli", "data", "build", "--set", "seed=1"]
    _run(build, proj, env)
    stale = json.loads(_run(["dvc", "status", "--json"], proj, env))
    assert {"rctp", "sft", "rl_tasks_before"} <= set(stale) and "data" not in stale
    _run([sys.executable, "-m", "rcgrpo.cli", "data", "rollback", first_rev], proj, env)
    back = json.loads(_run(["dvc", "status", "--json"], proj, env))
    assert not {"data", "rctp", "sft"} & set(back), back  # the version they were trained on

"""The run's settings resolved once (rcgrpo.run_config) and the one stage entry
(rcgrpo.tracking.stage): params.yaml read once per `rcgrpo run`, every section built once, the
layers in their order, run_config.json round-tripped and checked, and a stage that runs (and
logs to MLflow) without ever reading params.yaml again.

    .venv/bin/pytest tests/test_run_config.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rcgrpo.config
import rcgrpo.run_config
from rcgrpo.config import SECTIONS, ConfigError
from rcgrpo.run_config import RunConfig, resolve


def _counting(monkeypatch) -> dict:
    """Count params.yaml reads and section dataclasses built, wherever they are called from."""
    seen = {"reads": 0, "builds": 0}
    read, build = rcgrpo.config.read_params, rcgrpo.config.build

    def counted_read(*a, **k):
        seen["reads"] += 1
        return read(*a, **k)

    def counted_build(*a, **k):
        seen["builds"] += 1
        return build(*a, **k)

    for module in (rcgrpo.config, rcgrpo.run_config):
        monkeypatch.setattr(module, "read_params", counted_read)
        monkeypatch.setattr(module, "build", counted_build)
    return seen


def test_rcgrpo_run_reads_params_once_and_builds_each_section_once(monkeypatch):
    """What `rcgrpo run` does before its flow starts (cli.pipeline._resolve): one read, one
    build per section; the flow and its stages then take the RunConfig (no read at all)."""
    from rcgrpo.cli.pipeline import _resolve

    seen = _counting(monkeypatch)
    rc = _resolve(["rl.steps=2", "eval.limit=1"], "", "", "", "", 1)
    assert seen == {"reads": 1, "builds": len(SECTIONS)}
    assert rc.rl.steps == 2 and rc.eval.limit == 1 and rc.plan.preset == ""


def test_layers_merge_in_order_and_paths_are_absolute(tmp_path):
    """preset < --set < variant for RL; the variant's goals only where nothing chose them."""
    rc = resolve(None, "paper", "sft+grpo", {"rl": {"lr": 0.5, "conditioning": "rc"}})
    assert rc.rl.lr == 0.5  # the --set wins over the preset's 1e-6
    assert (rc.rl.conditioning, rc.rl.init) == ("none", "sft")  # the recipe wins over a --set
    assert rc.rl.steps == 400 and list(rc.eval.tokens) == ["none"]  # preset; variant's goals
    chosen = resolve(None, "paper", "sft+grpo", {"eval": {"tokens": ["high"]}})
    assert list(chosen.eval.tokens) == ["high"]
    assert Path(rc.rl.init_path).is_absolute() and rc.rl.init_path.endswith("outputs/sft/final")
    assert all(Path(p).is_absolute() for p in (rc.rctp.data, rc.rl.out_dir, rc.eval.out_dir))
    plain = resolve(None)  # every front, params.yaml's `pipeline:` choosing no preset/variant
    assert (plain.plan.preset, plain.plan.variant, plain.rl.steps) == ("", "", 20)


def test_a_fault_names_its_layer():
    with pytest.raises(ConfigError, match=r"preset .nope. is not in params.yaml presets"):
        resolve(None, "nope")
    with pytest.raises(ConfigError, match=r"rl\.p_high=7: must be in \[0, 1\]"):
        resolve(None, sets={"rl": {"p_high": 7}})
    with pytest.raises(ConfigError, match=r"rl: .*\(--set rl\.micro_batch_size=7\)$"):
        resolve(None, sets={"rl": {"micro_batch_size": 7}})  # mini_batch 10 % 7


def test_settings_that_name_what_the_environment_has_are_checked_against_it():
    """rl.reward, the protocols, categories and failure kinds name things of the run's
    environment: a typo fails when the run is resolved, before the data stage, not after the
    fine-tuning (rl.reward was checked by the scorer, at the start of RL)."""
    env, small_data = {"name": "calculator"}, {"dataset": {"train_categories": []}}
    small = resolve(None, sets={"env": env, **small_data})
    assert small.env.name == "calculator" and small.rl.reward == ""
    with pytest.raises(ConfigError, match=r"^rl\.reward='paper': not one of its \(env\.name="
                       r"calculator: its checks are '', 'correct', 'used_tool'\)$"):  # fmt: skip
        resolve(None, sets={"env": env, "rl": {"reward": "paper"}, **small_data})
    with pytest.raises(ConfigError, match=r"^dataset\.train_categories='base': not one of"):
        resolve(None, sets={"env": env})  # the CPU default's BFCL category
    with pytest.raises(ConfigError, match=r"^rollout\.protocol='combined': not one of its "
                       r"\(env\.name=memory: its protocols are 'bfcl'\)"):  # fmt: skip
        resolve(None, sets={"env": {"name": "memory"}})
    with pytest.raises(ConfigError, match=r"^eval\.categories='add': .*'base', 'miss_func'"):
        resolve(None, sets={"eval": {"categories": ["add"]}})


def test_run_config_json_round_trips_and_a_bad_edit_fails_in_one_line(tmp_path):
    rc = resolve(None, "paper", "rctp+rc-grpo", {"rl": {"steps": 3}}, ["rl"], procs=2)
    path = rc.write(tmp_path / "run_config.json")
    assert RunConfig.load(path) == rc
    data = json.loads(path.read_text())
    data["rl"]["p_high"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"rl\.p_high=7: must be in \[0, 1\] \(--config "):
        RunConfig.load(path)
    path.write_text("{}")
    with pytest.raises(ConfigError, match="no `pipeline` section"):
        RunConfig.load(path)


def test_a_run_config_written_before_a_section_existed_still_loads(tmp_path):
    """A run_config.json (or a scheduled run's JSON parameter) from a version without a
    section, e.g. `retention`, loads with that section's defaults; an unknown one still fails."""
    from rcgrpo.tracking.retention import RetentionConfig

    rc = resolve(None, "", "rctp+rc-grpo", {"rl": {"steps": 3}}, ["rl"])
    data = json.loads(rc.write(tmp_path / "run_config.json").read_text())
    del data["retention"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = RunConfig.load(tmp_path / "old.json")
    assert old.retention == RetentionConfig() and old.rl == rc.rl
    data["retentoin"] = {}
    (tmp_path / "typo.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"unknown sections \['retentoin'\]"):
        RunConfig.load(tmp_path / "typo.json")


@pytest.mark.slow
def test_a_stage_runs_and_logs_to_mlflow_without_reading_params_yaml(
    tmp_path, mlflow_store, monkeypatch
):
    """`rcgrpo stage rctp` (dvc.yaml's command) as rcgrpo.tracking.stage runs it: its own MLflow
    run with the step metrics, the model and run_config.json; params.yaml is never read."""
    from mlflow.tracking import MlflowClient

    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import write_jsonl
    from rcgrpo.envs.bfcl.experts import expert
    from rcgrpo.tracking.stage import run_stage

    tasks = [t for t in tasks_in("train") if t.category == "base"][:2]
    write_jsonl(tmp_path / "rctp.jsonl", [expert(t, "combined") for t in tasks])
    rctp = {"data": str(tmp_path / "rctp.jsonl"), "out_dir": str(tmp_path / "rctp")}
    rctp |= {"epochs": 1, "batch_size": 2, "micro_batch_size": 2}
    sets = {"rctp": rctp, "model": {"profile": "tiny", "device": "cpu"}}
    rc = resolve(None, sets=sets, stages=["finetune"])

    def refuse(*_a, **_k):
        raise AssertionError("params.yaml read after resolve")

    monkeypatch.setattr(rcgrpo.config, "read_params", refuse)
    final = run_stage("rctp", rc)
    assert (final / "rcgrpo_policy.json").exists()
    client = MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("rcgrpo").experiment_id])
    assert run.info.run_name == "rctp" and "sft/loss" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model", "run_config.json", "config.json"} <= artifacts
    assert RunConfig.load(tmp_path / "rctp" / "run_config.json") == rc


@pytest.mark.parametrize("how", ["option", "env"])
def test_rcgrpo_run_takes_the_project_from_any_directory(tmp_path, how):
    """`rcgrpo run --project DIR` (or RCGRPO_PROJECT=DIR) from another working dir reads DIR's
    params.yaml: here a bad value there is the one-line error, naming DIR's file."""
    import os
    import subprocess
    import sys

    project, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "params.yaml").write_text('pipeline:\n  preset: ""\nrl:\n  p_high: 7\n')
    args = ["--project", str(project)] if how == "option" else []
    env = {**os.environ, **({"RCGRPO_PROJECT": str(project)} if how == "env" else {})}
    out = subprocess.run(
        [sys.executable, "-m", "rcgrpo.cli", "run", "--stages", "rl", *args],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip() == (
        f"error: rl.p_high=7: must be in [0, 1] ({project / 'params.yaml'})"
    ), out.stderr

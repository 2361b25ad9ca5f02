"""Every stage in a process of its own: `rcgrpo stage NAME --config run_config.json`, started by
rcgrpo.tracking.stage_process for the Prefect flow.

A failed stage fails in one line (its own `error:` line, carried back in result.json), a result
left by an earlier run never passes for this one's, and the child's output reaches this process
line by line. The paper's recipe names are found back from an `rl:` section; with vLLM a stage
that only rolls out loads the policy on the CPU. ~30 s.

    .venv/bin/pytest tests/test_stage_process.py -q
"""

from __future__ import annotations

import json

import pytest

from rcgrpo.run_config import resolve, stage_dir
from rcgrpo.tracking.stage_process import RESULT_FILE, StageFailed, run_stage_process


def test_a_failed_stage_fails_in_one_line_and_an_old_result_never_counts(tmp_path, capsys):
    rc = resolve(None, sets={"eval": {"out_dir": str(tmp_path / "eval")}})
    folder = stage_dir(rc, "eval")
    folder.mkdir(parents=True)
    (folder / RESULT_FILE).write_text(json.dumps({"report": "from an earlier run"}))
    missing = tmp_path / "no-model"
    with pytest.raises(StageFailed) as failed:
        run_stage_process("eval", rc, args=["--model", str(missing)])
    line = str(failed.value)
    assert "\n" not in line
    assert line.startswith("stage eval failed (exit code 2): ")
    assert line.endswith(
        f"{missing} is not a folder: pass one written by save_policy, e.g. outputs/rl/final"
    )
    assert json.loads((folder / RESULT_FILE).read_text()) == {"error": line.split(": ", 1)[1]}
    printed = capsys.readouterr().out  # the stage's own output, relayed
    assert f"error: {missing} is not a folder" in printed
    assert (folder / "run_config.json").exists()  # what the stage read its settings from


def test_the_recipe_of_an_rl_section():
    from rcgrpo.evaluation.variants import recipe

    names = {
        v: recipe(resolve(None, variant=v).rl).name
        for v in ("rctp+rc-grpo", "rctp+grpo", "sft+rc-grpo", "sft+grpo")
    }
    assert names == {v: v for v in names}
    assert recipe(resolve(None).rl).name == "rctp+rc-grpo"  # params.yaml's sections
    odd = resolve(None, sets={"rl": {"conditioning": "none"}}).rl  # rctp, no goal: no recipe
    assert recipe(odd).name == "rctp+grpo (no goal)" and recipe(odd).eval_tokens == ("none",)


def test_with_vllm_a_rollout_stage_loads_the_policy_on_the_cpu():
    from rcgrpo.models.device import for_engine
    from rcgrpo.models.profiles import ModelConfig

    gpu_policy = ModelConfig(profile="qwen2.5-7b-instruct", device="auto", dtype="bfloat16")
    served = for_engine(gpu_policy, "vllm")
    assert (served.device, served.dtype) == ("cpu", "bfloat16")  # what vLLM serves, on the CPU
    assert for_engine(gpu_policy, "hf") == gpu_policy  # HF samples from the policy itself


@pytest.mark.slow
def test_a_vllm_start_failure_fails_the_data_stage_in_one_line(prefect_server, tmp_path):
    """`rollouts: auto` with vLLM installed: a server that does not start (here, on the CPU, a
    KV cache no machine has) fails the data stage in one line; no dataset is versioned, so no
    perturbations-only dataset appears. ~2-7 min on 2 cores (one real vLLM start)."""
    import subprocess
    import sys

    from test_pipeline_e2e import _git, copy_env, copy_project  # tests/ is on sys.path

    from rcgrpo.runtime import project_root

    proj = copy_project(project_root(), tmp_path / "proj")
    head, pointer = _git(proj, "rev-parse", "HEAD"), (proj / "data.dvc").read_text()
    sets = ["dataset.train_tasks=4", "dataset.test_tasks=4", "dataset.rollouts=auto"]
    sets += ["rollout.engine=vllm", "rollout.max_new_tokens=8", "rollout.max_total_tokens=1200"]
    cmd = [sys.executable, "-m", "rcgrpo.cli", "run", "--stages", "data", "--allow-cpu"]
    env = {**copy_env(proj), "VLLM_CPU_KVCACHE_SPACE": "100000"}  # GiB of K/V: none has it
    # the checkout's vLLM venv (`make test` builds it first), not a second 3.5 GB build in the copy
    env["RCGRPO_VLLM_PYTHON"] = str(project_root() / ".venv-vllm" / "bin" / "python")
    out = subprocess.run(
        [*cmd, *[a for s in sets for a in ("--set", s)]],
        cwd=proj,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert errors[0].startswith(
        "error: stage data failed (exit code 2): vLLM server on the CPU did not start (exit code"
    ), errors[0]
    result = json.loads((proj / "outputs/data/result.json").read_text())
    assert errors[0] == f"error: stage data failed (exit code 2): {result['error']}"
    assert not (proj / "data").exists() and (proj / "data.dvc").read_text() == pointer
    assert _git(proj, "rev-parse", "HEAD") == head  # nothing versioned


def test_rollouts_auto_skips_only_a_missing_engine_and_the_summary_says_so(monkeypatch, tmp_path):
    """vLLM not installed (its interpreter missing): the own-policy failures are skipped with
    the reason, before any model loads, and `rcgrpo run`'s summary and the report say so."""
    from rcgrpo.cli.pipeline import _skipped
    from rcgrpo.data.failures import EngineUnavailable, rollout_failures
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.tracking.report import summary_markdown

    monkeypatch.setenv("RCGRPO_VLLM_PYTHON", str(tmp_path / "no-vllm" / "python"))
    with pytest.raises(EngineUnavailable, match=r"^vLLM is not installed \(.*no-vllm/python"):
        rollout_failures(
            BFCL, [], "combined", 0, ModelConfig(profile="tiny"), RolloutConfig(engine="vllm")
        )
    why = "vLLM is not installed (/x/python is no interpreter)"
    assert _skipped(why) == [
        "  data rollouts    skipped: vLLM is not installed (/x/python is no interpreter); "
        "the low half is perturbations only"
    ]
    assert _skipped(None) == []
    text = summary_markdown({"run_id": "r", "rollouts_skipped": why}, {}, [])
    assert f"own-policy failures skipped ({why}): the low half is perturbations only" in text

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

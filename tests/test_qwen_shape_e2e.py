"""End to end on the Qwen-shaped profile: `rcgrpo run --profile qwen-shape` with small sizes, in a
temporary copy of the project (as tests/test_pipeline_e2e.py does for tiny).

What it shows: the 7B path's prompt layout (full JSON tool docs, ~6k-token prompts, Qwen2.5's
tokenizer and padded vocabulary, LoRA with the reward-token rows) runs through data, RCTP-FT,
RC-GRPO and evaluation under the profile's token budgets: the data stage rolls the base policy
out at the profile's episode budget (its manifest counts attempts, kept failures and refusals),
the RL rollouts sample tokens (the old 1536-token episode budget stopped every one before its
first token) and the SFT examples keep their assistant tokens. ~2-4 min on 2 cores.
"""

from __future__ import annotations

import json

import pytest
from test_pipeline_e2e import copy_project, run_in_copy  # tests/ is on sys.path

from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow

SMALL = [
    "dataset.train_tasks=2", "dataset.test_tasks=4", 'dataset.rollouts="on"',
    "rctp.epochs=1", "rl.steps=1", "rl.tasks_per_step=2", "rl.group_size=2",
    "rl.mini_batch_size=2", "rl.micro_batch_size=2", "eval.limit=1",
    "rollout.max_new_tokens=8", "rollout.max_total_tokens=0", "rollout.max_steps=1",
]  # fmt: skip


def test_main_command_on_qwen_shape_profile(prefect_server, tmp_path):
    proj = copy_project(project_root(), tmp_path / "proj")
    code, text = run_in_copy(proj, "qwen-shape", SMALL, timeout=1200)
    assert code == 0, text[-5000:]
    assert "pipeline finished" in text
    assert "dropped" not in text and "sampled no token" not in text  # nothing lost to limits

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{proj}/mlflow/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("rcgrpo").experiment_id])
    by_name = {r.info.run_name: r for r in runs}
    assert by_name["rctp"].data.params["model.profile"] == "qwen-shape"
    assert by_name["rctp"].data.metrics["sft/assistant_tokens"] > 0
    assert by_name["rl"].data.metrics["rollout/response_tokens"] > 0  # sampled, not cut at 0
    assert "eval/paper/high/pooled" in by_name["eval"].data.metrics
    saved = json.loads((proj / "outputs" / "rl" / "final" / "rcgrpo_policy.json").read_text())
    assert saved["config"]["profile"] == "qwen-shape" and saved["lora"]
    # the data stage rolled the policy's own base model out, at the profile's episode budget
    rollouts = json.loads((proj / "data" / "manifest.json").read_text())["rollouts"]
    assert rollouts["model"]["profile"] == "qwen-shape"
    assert rollouts["settings"]["max_total_tokens"] == 81920  # rollout.max_total_tokens=0
    assert rollouts["tried"] == 3  # half of 2 train and 4 test tasks, rounded up
    assert rollouts["tried"] == rollouts["kept"] + sum(rollouts["refused"].values())
    assert rollouts["refused"]["no_assistant_message"] == 0  # every episode could start

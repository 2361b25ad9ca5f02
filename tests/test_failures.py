"""Which rollouts may be low-reward rows (failures.refusal), where the rule applies (rollouts,
perturbations, the build's low half), and which policy is rolled out by default (the
params.yaml `model:` section, i.e. the policy's own profile).

    .venv/bin/pytest tests/test_failures.py -q
"""

from __future__ import annotations

import pytest
import yaml

from rcgrpo.bfcl.tasks import get_task
from rcgrpo.chat.record import Provenance, Trajectory, read_jsonl
from rcgrpo.config import read_params
from rcgrpo.data.dataset import DatasetConfig, build_folder, rollout_model, select_tasks
from rcgrpo.data.failures import (
    DONE,
    REFUSALS,
    api_calls,
    is_usable_failure,
    refusal,
    rollout_failures,
)
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.envs.bfcl.perturbations import perturbations
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.config import RolloutConfig

SYSTEM = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Step 1: move report.txt into the archive folder."}
WRONG = "cp(source='report.txt', destination='archive')"  # cp for mv: a realistic mistake


def record(*assistant: dict, calls=None, reward: int = 0, stop: str = "no_calls") -> Trajectory:
    """A hand-built rollout record: system + user + `assistant` messages (+ tool observations)."""
    messages = [SYSTEM, USER]
    for m in assistant:
        messages.append(m)
        messages += [{"role": "tool", "content": "ok"} for _ in m.get("tool_calls", [])]
    return Trajectory(
        task_id="multi_turn_base_0",
        category="base",
        split="train",
        protocol="combined",
        messages=messages,
        calls=[[]] if calls is None else calls,
        reward=reward,
        checks={"paper": reward, "bfcl": reward},
        provenance=Provenance("rollout", model="tiny", seed=0),
        reward_reason={"stop": stop},
    )


def step(*calls: str) -> dict:
    return {"role": "assistant", "content": f"[{', '.join(calls)}]", "tool_calls": list(calls)}


PROSE = {"role": "assistant", "content": "tojFurthermore finemley allonat mentth"}


def test_no_assistant_message_is_refused():
    r = record(stop="token_budget")  # the prompt alone used the token budget
    assert refusal(r) == "no_assistant_message" and not is_usable_failure(r)


def test_prose_without_a_parsed_call_is_refused():
    assert refusal(record(PROSE)) == "no_parsed_call"
    assert refusal(record(PROSE, PROSE)) == "no_parsed_call"
    # done() alone ends the episode without a single API call: no failure of tool calling
    assert refusal(record(step(DONE), stop="done")) == "no_parsed_call"


def test_wrong_call_with_reward_zero_is_kept():
    r = record(step(WRONG), step(DONE), calls=[[[WRONG]]], stop="done")
    assert refusal(r) is None and is_usable_failure(r)
    assert api_calls(r) == [WRONG]


def test_premature_stop_after_valid_calls_is_kept():
    """An unparsable last message after dispatched calls: the paper's "premature stop"."""
    assert is_usable_failure(record(step(WRONG), PROSE, calls=[[[WRONG]]]))
    assert is_usable_failure(record(step(WRONG), calls=[[[WRONG]]], stop="token_budget"))


def test_reward_one_is_never_kept():
    assert refusal(record(step(WRONG), calls=[[[WRONG]]], reward=1)) == "reward_1"
    assert refusal(record(reward=1)) == "reward_1"  # reward first: it is no failure at all


def test_empty_assistant_message_is_refused():
    empty = {"role": "assistant", "content": ""}
    assert refusal(record(step(WRONG), empty, calls=[[[WRONG]]])) == "empty_assistant_message"


def test_perturbations_pass_the_rule():
    for protocol in ("combined", "bfcl"):
        failures = perturbations(get_task("multi_turn_base_0"), protocol)
        assert failures and all(is_usable_failure(r) for r in failures)


def test_default_rollout_profile_is_the_policy_own_model(tmp_path):
    assert DatasetConfig().rollout_profile == ""
    assert read_params()["dataset"]["rollout_profile"] == ""  # params.yaml keeps the default
    params = tmp_path / "params.yaml"
    model = {"profile": "smollm2-135m", "path": str(tmp_path / "m"), "seed": 7, "dtype": "bfloat16"}
    params.write_text(yaml.safe_dump({"model": model, "dataset": {}}))
    resolved = rollout_model(DatasetConfig(), path=params)
    assert resolved == ModelConfig(**model)  # profile, path and seed all honoured
    assert rollout_model(DatasetConfig(), {"seed": 3}, params).seed == 3  # model overrides
    same = rollout_model(DatasetConfig(rollout_profile="smollm2-135m"), path=params)
    assert same == resolved
    other = rollout_model(DatasetConfig(rollout_profile="tiny"), path=params)
    assert (other.profile, other.path, other.seed, other.dtype) == ("tiny", "", 7, "bfloat16")


def test_build_uses_only_usable_rollouts_and_counts_the_refused(tmp_path):
    cfg = DatasetConfig(train_tasks=8, test_tasks=4, rollouts="off")
    task = select_tasks(cfg, "train", BFCL)[0]
    usable = perturbations(task, cfg.protocol, kinds=("wrong_tool", "wrong_argument"))[0]
    usable.provenance = Provenance("rollout", model="tiny", seed=0)
    noise = record(PROSE)
    noise.task_id, noise.category = task.id, task.category
    manifest = build_folder(cfg, tmp_path / "out", BFCL, {"train": [usable, noise]})
    assert manifest["rollouts"] == {
        "model": None,
        "tried": 2,
        "kept": 1,
        "refused": {**dict.fromkeys(REFUSALS, 0), "no_parsed_call": 1},
    }
    rows = read_jsonl(tmp_path / "out" / "rctp" / "train.jsonl")
    rollouts = [r for r in rows if r.provenance.generator == "rollout"]
    assert len(rollouts) == 1 and rollouts[0].calls == usable.calls
    assert all(is_usable_failure(r) for r in rows if r.reward == 0)


@pytest.fixture(scope="module")
def tiny_report():
    tasks = [get_task(t) for t in ("multi_turn_base_30", "multi_turn_miss_func_76")]
    tasks.append(get_task("multi_turn_long_context_156"))
    return rollout_failures(BFCL, tasks, "combined", seed=0, model=ModelConfig(profile="tiny"), rollout=RolloutConfig(max_new_tokens=128))  # fmt: skip


def test_real_rollouts_of_the_tiny_policy_obey_the_rule(tiny_report):
    """The tiny base model is random: it may keep nothing, but never keeps noise."""
    report = tiny_report
    assert report.tried == 3
    assert report.tried == len(report.records) + sum(report.refused.values())
    assert set(report.refused) == set(REFUSALS)
    assert all(is_usable_failure(r) for r in report.records)
    assert all(r.provenance.generator == "rollout" for r in report.records)
    summary = report.summary()
    assert summary["model"] == {"profile": "tiny", "path": "", "seed": 0}
    assert summary["kept"] == len(report.records) and summary["refused"] == report.refused
    # the `rollout:` section's engine, at the profile's episode budget (0 = the profile's)
    assert summary["settings"] == {"engine": "hf", "scheduler": "async", "protocol": "combined",
                                   "max_new_tokens": 128, "max_total_tokens": 73728}  # fmt: skip
    assert report.refused["no_assistant_message"] == 0  # every episode could start
    if not report.records:  # a random stand-in may make no usable call: the manifest says so
        assert "perturbations only" in summary["note"]


def test_a_prompt_over_the_budget_is_an_error_naming_the_budget():
    """The long_context prompt (929 tokens with the tiny profile) does not fit 720 tokens: the
    build fails in one line naming rollout.max_total_tokens, before any rollout runs (before, the
    episode stopped at 0 tokens and its refusal was counted silently)."""
    from rcgrpo.data.failures import RolloutBudgetError

    tasks = [get_task("multi_turn_base_30"), get_task("multi_turn_long_context_156")]
    with pytest.raises(RolloutBudgetError) as err:
        rollout_failures(BFCL, tasks, "combined", 0, ModelConfig(profile="tiny"), RolloutConfig(max_total_tokens=720))  # fmt: skip
    message = str(err.value)
    assert "\n" not in message and "rollout.max_total_tokens = 720" in message
    assert "1 of 2" in message and "multi_turn_long_context_156, 929 tokens" in message

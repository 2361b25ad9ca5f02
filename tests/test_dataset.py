"""Dataset generation: experts score 1 with real observations, perturbations are reward-0
failures of the recorded kind, labels and balance follow the reward (no Prefect, no DVC).

    .venv/bin/pytest tests/test_dataset.py -q
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter

import pytest

from rcgrpo.bfcl.checkers import score
from rcgrpo.bfcl.replay import ground_truth_run, parse_call_string
from rcgrpo.chat.record import HIGH, LOW, read_jsonl
from rcgrpo.data.dataset import DatasetConfig, build_folder, select_tasks
from rcgrpo.data.generate import generate_experts, generate_failures
from rcgrpo.data.labels import (
    GOAL_FORMAT,
    goal_counts,
    low_half,
    mixed_set,
    sft_set,
    with_goal,
)
from rcgrpo.envs.bfcl import experts as experts_mod
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.envs.bfcl.experts import DONE
from rcgrpo.envs.bfcl.perturbations import KINDS

CFG = DatasetConfig(train_tasks=8, test_tasks=4, rollouts="off")


@pytest.fixture(scope="module")
def train_tasks():
    return select_tasks(CFG, "train", BFCL)


def test_subset_is_stratified_and_in_its_split(train_tasks):
    assert len(train_tasks) == 8
    assert Counter(t.category for t in train_tasks) == {c: 2 for c in BFCL.categories}
    assert {t.id for t in select_tasks(CFG, "test", BFCL)}.isdisjoint(t.id for t in train_tasks)


@pytest.mark.parametrize("protocol", ["combined", "bfcl"])
def test_experts_score_one_with_real_observations(train_tasks, protocol):
    report = generate_experts(BFCL, train_tasks, "train", protocol)
    assert report.failed == [] and len(report.experts) == 8
    for record in report.experts:
        assert (record.reward, record.checks) == (1, {"paper": 1, "bfcl": 1}), record.reward_reason
        task = next(t for t in train_tasks if t.id == record.task_id)
        observed = [m["content"] for m in record.messages if m["role"] == "tool"]
        expected = [r for turn in ground_truth_run(task).results for r in turn]
        assert observed == expected  # what the environment returned, not placeholders
        if protocol == "combined":
            assert record.calls[0][-1] == [DONE] and record.messages[-1]["tool_calls"] == [DONE]
            assert sum(m["role"] == "user" for m in record.messages) == 1
        else:
            assert len(record.calls) == len(task.turns)


def test_expert_not_scoring_one_is_reported_by_id(train_tasks, monkeypatch):
    broken = train_tasks[0]
    real = experts_mod.expert_calls

    def drop_last_turn(task, protocol):
        calls = real(task, protocol)
        return [[]] + calls[1:] if task is broken else calls

    monkeypatch.setattr(experts_mod, "expert_calls", drop_last_turn)
    report = generate_experts(BFCL, train_tasks, "train", "bfcl")
    assert [f["task_id"] for f in report.failed] == [broken.id]
    assert "R_" in report.failed[0]["reason"] and len(report.experts) == 7


def _n_calls(calls):
    return sum(len(step) for turn in calls for step in turn if step != [DONE])


@pytest.mark.parametrize("protocol", ["combined", "bfcl"])
def test_perturbations_are_reward_zero_of_the_recorded_kind(train_tasks, protocol):
    failures = generate_failures(BFCL, train_tasks, "train", protocol, seed=0)
    kinds = Counter(r.provenance.generator for r in failures)
    assert set(kinds) == {f"perturbation:{k}" for k in KINDS}  # every kind occurs
    by_id = {t.id: t for t in train_tasks}
    for record in failures:
        task = by_id[record.task_id]
        assert record.reward == 0
        assert score(task, record.calls, protocol)[0].reward == 0  # re-scored independently
        kind = record.provenance.generator.split(":", 1)[1]
        n_expert = sum(len(t) for t in task.ground_truth)
        n = _n_calls(record.calls)
        if kind == "missing_call" or kind == "stop_early":
            assert n < n_expert
        elif kind == "extra_call":
            assert n == n_expert + 1
        else:
            assert n == n_expert
        names = [parse_call_string(c).name for turn in record.calls for s in turn for c in s]
        gt_names = [parse_call_string(c).name for turn in task.ground_truth for c in turn]
        if kind == "wrong_tool":
            assert sorted(names) != sorted(
                gt_names + ([DONE[:-2]] if protocol == "combined" else [])
            )
        assert record.reward_reason["perturbation"]  # what was changed, for a human reader


def test_labels_goal_once_in_first_user_message_and_balance(train_tasks):
    report = generate_experts(BFCL, train_tasks, "train", "combined")
    failures = generate_failures(BFCL, train_tasks, "train", "combined", seed=0)
    rows = mixed_set(report.experts, low_half([], failures, 8, 0.5, 0), seed=0)
    assert Counter(r.reward_token for r in rows) == {HIGH: 8, LOW: 8}
    for r in rows:
        assert r.reward_token == (HIGH if r.reward else LOW)
        first_user = next(m for m in r.messages if m["role"] == "user")
        assert first_user["content"].endswith(GOAL_FORMAT.format(token=r.reward_token))
        assert goal_counts(r.messages) == (1, 1)
    assert len({r.task_id for r in rows if r.reward == 0}) == 8  # one failure per task
    plain = sft_set(report.experts)
    assert all(r.reward_token is None and goal_counts(r.messages) == (0, 0) for r in plain)
    with pytest.raises(ValueError, match="already carry a reward goal"):
        with_goal(rows[0].messages, HIGH)


def test_ratio_is_configurable(train_tasks):
    report = generate_experts(BFCL, train_tasks, "train", "combined")
    failures = generate_failures(BFCL, train_tasks, "train", "combined", seed=0)
    rows = mixed_set(report.experts, low_half([], failures, 16, 0.5, 0), seed=0)
    assert Counter(r.reward for r in rows) == {1: 8, 0: 16}  # low_per_high = 2


def test_build_is_deterministic_and_seed_sensitive(tmp_path):
    def digest(folder):
        return {
            p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*.json*"))
        }

    build_folder(CFG, tmp_path / "a", BFCL)
    build_folder(CFG, tmp_path / "b", BFCL)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    manifest = build_folder(
        DatasetConfig(train_tasks=8, test_tasks=4, seed=1), tmp_path / "c", BFCL
    )
    assert digest(tmp_path / "a") != digest(tmp_path / "c")
    assert manifest["files"]["rctp/train.jsonl"]["high"] == 8
    assert manifest["files"]["rctp/train.jsonl"]["low"] == 8
    assert (
        manifest["rollouts"]["tried"] == 0 and manifest["rollouts"]["model"] is None
    )  # none given
    assert manifest["config"]["rollout_profile"] == ""  # nothing rolled out: nothing resolved
    assert len(read_jsonl(tmp_path / "a" / "sft" / "test.jsonl")) == 4


def test_train_filter_picks_short_base_tasks_and_never_touches_test():
    # params.yaml's selection (the CPU default): base tasks whose ground truth has <= 3 calls (26 of 180)
    cfg = DatasetConfig(train_tasks=8, train_categories=("base",), train_max_calls=3)
    every = select_tasks(dataclasses.replace(cfg, train_tasks=0), "train", BFCL)
    assert len(every) == 26 and {t.category for t in every} == {"base"}
    assert max(sum(map(len, t.ground_truth)) for t in every) == 3
    picked = select_tasks(cfg, "train", BFCL)
    assert len(picked) == 8 and {t.id for t in picked} <= {t.id for t in every}
    assert picked == select_tasks(cfg, "train", BFCL)  # seeded
    assert len(select_tasks(cfg, "test", BFCL)) == 80  # the reported split stays whole
    with pytest.raises(ValueError, match="the shortest have 2"):
        select_tasks(dataclasses.replace(cfg, train_max_calls=1), "train", BFCL)
    with pytest.raises(ValueError, match=r"dataset.train_categories=\['nope'\]: BFCL categories"):
        select_tasks(DatasetConfig(train_categories=("nope",)), "train", BFCL)

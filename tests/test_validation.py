"""The Great Expectations suite: a good build passes; each kind of bad data fails with a message
naming the expectation, the file and the offending lines.

    .venv/bin/pytest tests/test_validation.py -q
"""

from __future__ import annotations

import json
import shutil

import pytest

from rcgrpo.data.dataset import DatasetConfig, build_folder
from rcgrpo.data.validation import load_suite, parameters, validate_dir
from rcgrpo.envs.bfcl.environment import BFCL

CFG = DatasetConfig(train_tasks=8, test_tasks=4, rollouts="off")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    build_folder(CFG, folder, BFCL)
    return folder


@pytest.fixture
def bad(good, tmp_path):
    """A copy of the good build to corrupt."""
    folder = tmp_path / "bad"
    shutil.copytree(good, folder)
    return folder


def _lines(path):
    return path.read_text().splitlines()


def _rewrite(path, lines):
    path.write_text("\n".join(lines) + "\n")


def test_every_expectation_names_the_risk_it_guards():
    for entry in load_suite(parameters(0.5, 0.05)):
        assert entry["risk"] and entry["applies_to"], entry


def test_good_build_passes_and_writes_data_docs(good, tmp_path):
    report = validate_dir(good, BFCL, docs_dir=tmp_path / "docs")
    assert report.success, report.message()
    assert report.evaluated > 40
    assert (tmp_path / "docs" / "index.html").exists()
    assert list((tmp_path / "docs" / "validations").rglob("*.html"))


def test_malformed_json_line_names_its_line(bad):
    path = bad / "rctp" / "train.jsonl"
    lines = _lines(path)
    lines[2] = lines[2][: len(lines[2]) // 2]  # a truncated write
    _rewrite(path, lines)
    report = validate_dir(bad, BFCL)
    assert not report.success
    (failure,) = [f for f in report.failures if f.column == "schema_error"]
    assert failure.file == "rctp/train.jsonl" and [r["line"] for r in failure.rows] == [3]
    assert "line 3" in report.message() and "not valid JSON" in report.message()


def test_label_contradicting_reward_names_row_and_task(bad):
    path = bad / "rctp" / "train.jsonl"
    lines = _lines(path)
    row = json.loads(lines[4])
    flipped = "<|low_reward|>" if row["reward"] else "<|high_reward|>"
    row["reward_token"] = flipped
    lines[4] = json.dumps(row)
    _rewrite(path, lines)
    report = validate_dir(bad, BFCL)
    (failure,) = [f for f in report.failures if f.column == "label_ok"]
    assert [(r["line"], r["task_id"]) for r in failure.rows] == [(5, row["task_id"])]
    assert "contradicts the reward" in report.message()


def test_leaked_test_task_in_train_is_caught(bad):
    test_row = json.loads(_lines(bad / "rctp" / "test.jsonl")[0])
    test_row["split"] = "train"  # a test task relabelled as train and appended
    path = bad / "rctp" / "train.jsonl"
    lines = _lines(path) + [json.dumps(test_row)]
    _rewrite(path, lines)
    report = validate_dir(bad, BFCL)
    (failure,) = [f for f in report.failures if f.column == "split=task_split"]
    assert (
        failure.rows[0]["line"] == len(lines) and failure.rows[0]["task_id"] == test_row["task_id"]
    )
    assert "test task leaked into train" in report.message()
    assert test_row["task_id"] in report.message()


def test_unbalanced_labels_repeated_goal_and_empty_turn(bad):
    path = bad / "rctp" / "train.jsonl"
    rows = [json.loads(line) for line in _lines(path)]
    rows = [r for r in rows if r["reward"] == 1] + [r for r in rows if r["reward"] == 0][:2]
    rows[0]["messages"][0]["content"] += " [Reward Goal: <|high_reward|>]"
    next(m for m in rows[1]["messages"] if m["role"] == "assistant").update(
        content="", tool_calls=[]
    )
    _rewrite(path, [json.dumps(r) for r in rows])
    report = validate_dir(bad, BFCL, high_share=0.5, tolerance=0.05)
    failed = {f.column: f for f in report.failures}
    assert failed["is_high"].observed == pytest.approx(0.8) and not failed["is_high"].rows
    assert [r["line"] for r in failed["goal_total"].rows] == [1]
    assert [r["line"] for r in failed["empty_assistant"].rows] == [2]
    assert "balance" in report.message()


def test_missing_file_and_sft_with_a_token(bad):
    (bad / "sft" / "test.jsonl").unlink()
    path = bad / "sft" / "train.jsonl"
    row = json.loads(_lines(path)[0])
    row["reward_token"] = "<|high_reward|>"
    _rewrite(path, [json.dumps(row)])
    report = validate_dir(bad, BFCL)
    assert any(f.file == "sft/test.jsonl" and "missing" in f.risk for f in report.failures)
    assert any(f.file == "sft/train.jsonl" and f.column == "label_ok" for f in report.failures)


def test_call_that_does_not_parse_is_named(bad):
    path = bad / "sft" / "train.jsonl"
    lines = _lines(path)
    row = json.loads(lines[1])
    row["calls"][0][0][0] = "__import__('os').system('ls')"
    lines[1] = json.dumps(row)
    _rewrite(path, lines)
    report = validate_dir(bad, BFCL)
    (failure,) = [f for f in report.failures if f.column == "bad_calls"]
    assert failure.file == "sft/train.jsonl" and [r["line"] for r in failure.rows] == [2]
    assert "safe parser rejects" in report.message()


def test_low_row_without_a_dispatched_call_is_refused(bad):
    path = bad / "rctp" / "train.jsonl"
    lines = _lines(path)
    i = next(i for i, line in enumerate(lines) if json.loads(line)["reward"] == 0)
    row = json.loads(lines[i])
    row["calls"] = [[["done()"]]]  # the policy said only done(): nothing was tried
    lines[i] = json.dumps(row)
    _rewrite(path, lines)
    report = validate_dir(bad, BFCL)
    (failure,) = [f for f in report.failures if f.column == "low_without_call"]
    assert [r["line"] for r in failure.rows] == [i + 1]
    assert "no dispatched tool call" in report.message()

"""Trajectory JSONL: round trip, and a malformed row names its line and field."""

import json

import pytest

from rcgrpo.chat.record import (
    HIGH,
    Provenance,
    RecordError,
    Trajectory,
    read_jsonl,
    write_jsonl,
)


def record(**changes):
    base = dict(
        task_id="multi_turn_base_0",
        category="base",
        split="train",
        protocol="bfcl",
        messages=[
            {"role": "user", "content": f"Move it. [Reward Goal: {HIGH}]"},
            {"role": "assistant", "content": "", "tool_calls": ["cd(folder='document')"]},
            {"role": "tool", "content": '{"current_working_directory": "document"}'},
        ],
        calls=[[["cd(folder='document')"]]],
        reward=1,
        checks={"paper": 1, "bfcl": 1},
        provenance=Provenance("expert", "", 0, "2026-12-02T00:00:00Z"),
        reward_token=HIGH,
    )
    base.update(changes)
    return Trajectory(**base)


def test_round_trip(tmp_path):
    rows = [record(), record(task_id="multi_turn_base_1", reward=0, reward_token=None)]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    assert read_jsonl(path) == rows


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r.pop("split"), "split"),
        (lambda r: r.update(reward=0.5), "reward"),
        (lambda r: r.update(reward_token="<|medium|>"), "reward_token"),
        (lambda r: r.update(calls=[["cd()"]]), "calls"),
        (lambda r: r.update(protocol=""), "protocol"),
        (lambda r: r.update(checks={"paper": "yes"}), "checks"),
        (lambda r: r.update(provenance={"model": "x"}), "provenance"),
        (lambda r: r.update(extra=1), "extra"),
    ],
)
def test_malformed_row_names_line_and_field(tmp_path, mutate, field):
    good = record().to_json()
    bad = json.loads(good)
    mutate(bad)
    path = _write_lines(tmp_path / "t.jsonl", [good, good, json.dumps(bad)])
    with pytest.raises(RecordError, match=rf"t\.jsonl:3: field '{field}'"):
        read_jsonl(path)


def test_invalid_json_line_and_missing_file(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [record().to_json(), '{"task_id": '])
    with pytest.raises(RecordError, match=r"t\.jsonl:2: not valid JSON"):
        read_jsonl(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [record()])
    before = path.read_bytes()

    class Boom(Trajectory):
        def to_json(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_jsonl(path, [record(), Boom(**vars(record()))])
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]  # no temp file left behind


def test_a_row_written_before_named_checks_reads_as_today(tmp_path):
    """Dataset versions DVC kept from before records carried named checks (BFCL's paper_reward
    and bfcl_reward fields) still read, as the same record: a rollback loses nothing."""
    today = json.loads(record(reward=0, checks={"paper": 0, "bfcl": 1}).to_json())
    old = {k: v for k, v in today.items() if k not in ("reward", "checks")}
    old.update(paper_reward=0, bfcl_reward=1)
    path = _write_lines(tmp_path / "old.jsonl", [json.dumps(old)])
    (back,) = read_jsonl(path)
    assert back == record(reward=0, checks={"paper": 0, "bfcl": 1})

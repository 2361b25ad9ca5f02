"""The byte format ranks exchange rollouts in (rcgrpo.training.grpo.exchange), by hand: the
layout, a round trip, and one-line refusals of everything else, a pickle first (what
all_gather_object sent: unpickling it ran the sender's code).

    .venv/bin/pytest tests/test_exchange.py -q
"""

from __future__ import annotations

import json
import os
import pickle
import struct

import pytest
import torch

from rcgrpo.rollout.environment import Rewards
from rcgrpo.training.grpo.exchange import MAGIC, ExchangeError, decode, encode
from rcgrpo.training.grpo.rollouts import Sampled


def two_rollouts() -> list:
    a = Sampled(
        torch.tensor([5, 6, 7], dtype=torch.int32),
        torch.tensor([0, 1, 1], dtype=torch.int8),
        torch.tensor([0.0, -0.5, -1.25]),
    )
    b = Sampled(
        torch.tensor([70000, 2], dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int8),
        torch.tensor([0.0, -2.0]),
        truncated=True,
    )
    reasons = {"paper": {"reason": "wrong call", "failing_turn": 1}}
    return [(a, Rewards(1.0, {"paper": 1, "bfcl": 0}, reasons)), (b, Rewards(0.0, {"paper": 0}))]


def test_layout_by_hand():
    data = encode(two_rollouts(), {"rollout/prompt_tokens": 12.0})
    assert data.startswith(MAGIC)
    (size,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    header = json.loads(data[start : start + size])
    assert [r["tokens"] for r in header["rollouts"]] == [3, 2]
    assert header["rollouts"][1]["truncated"] is True
    assert header["rollouts"][0]["checks"] == {"paper": 1, "bfcl": 0}  # ints stay ints
    assert header["stats"] == {"rollout/prompt_tokens": 12.0}
    body = data[start + size :]
    assert len(body) == 9 * 5  # 5 tokens: int32 id + int8 mask + float32 log-prob
    assert body[:20] == struct.pack("<5i", 5, 6, 7, 70000, 2)  # the ids of both, in order
    assert body[20:25] == bytes([0, 1, 1, 0, 1])  # then the masks
    assert body[25:] == struct.pack("<5f", 0.0, -0.5, -1.25, 0.0, -2.0)  # then the log-probs


def test_round_trip():
    sent = two_rollouts()
    rows, stats = decode(encode(sent, {"perf/in_flight_max": 3}), rank=1)
    assert stats == {"perf/in_flight_max": 3}
    for (fields, rewards), (s, r) in zip(rows, sent, strict=True):
        got = Sampled(*fields)
        assert torch.equal(got.ids, s.ids) and got.ids.dtype == torch.int32
        assert torch.equal(got.loss_mask, s.loss_mask) and got.loss_mask.dtype == torch.int8
        assert torch.equal(got.logprobs, s.logprobs) and got.truncated == s.truncated
        assert rewards == r
    assert decode(encode([], {}), rank=0) == ([], {})


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = "/nonexistent-dir/should-never-exist"


def test_a_pickle_is_refused_and_runs_nothing(tmp_path):
    global MARKER
    MARKER = str(tmp_path / "ran")
    bomb = pickle.dumps([Evil()])
    with pytest.raises(ExchangeError) as e:
        decode(bomb, rank=1)
    assert str(e.value) == (
        "rank 1 sent rollouts not in the exchange format: no rcgrpo-rollouts-1 header "
        "(a pickle or other bytes)"
    )
    assert not (tmp_path / "ran").exists()


def header_of(rows, stats=None, body=b"") -> bytes:
    head = json.dumps({"rollouts": rows, "stats": stats or {}}).encode()
    return MAGIC + struct.pack("<Q", len(head)) + head + body


ROW = {"tokens": 1, "truncated": False, "train": 1.0, "checks": {}, "reasons": {}}


@pytest.mark.parametrize(
    "data, said",
    [
        (MAGIC + struct.pack("<Q", 10**9), "a 1000000000-byte header in"),
        (MAGIC + struct.pack("<Q", 3) + b"[[[", "its header is not JSON (JSONDecodeError)"),
        (header_of([ROW]), "0 bytes of token arrays for 1 tokens (9 per token)"),
        (header_of([ROW], body=b"\0" * 10), "10 bytes of token arrays for 1 tokens"),
        (header_of([{**ROW, "extra": 1}], body=b"\0" * 9), "rollout 0 has fields other than"),
        (header_of([{**ROW, "tokens": -1}]), "rollout 0: tokens or truncated of the wrong type"),
        (header_of([{**ROW, "train": True}], body=b"\0" * 9), "train or checks of the wrong"),
        (header_of([{**ROW, "checks": {"x": "1"}}], body=b"\0" * 9), "a check that is not"),
        (header_of([], {"s": [1]}), "a stat that is not a number"),
    ],
)
def test_anything_else_is_refused_in_one_line(data, said):
    with pytest.raises(ExchangeError) as e:
        decode(data, rank=3)
    message = str(e.value)
    assert message.startswith("rank 3 sent rollouts not in the exchange format: ")
    assert said in message and "\n" not in message

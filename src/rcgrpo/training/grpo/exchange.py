"""A rank's scored rollouts as bytes and back: the one format ranks exchange them in.

Why not torch.distributed.all_gather_object: it pickles, and unpickling what another rank sent
runs whatever that rank chose (a fake node ran code in rank 0 that way). These bytes are data
only: decoding parses JSON and reads three typed arrays, checks every field, and refuses
anything else in one line (`ExchangeError`) before the update sees it.

Layout (little-endian), for n rollouts of T_1..T_n tokens, N = sum T_i:

    MAGIC | header length H (8 bytes) | header: H bytes of UTF-8 JSON
          | ids: N x int32 | loss masks: N x int8 | log-probs: N x float32

The header: {"rollouts": [{"tokens": T_i, "truncated": bool, "train": number,
"checks": {name: number}, "reasons": JSON}, ...], "stats": {name: number}}. 9 bytes per token,
as the tensors hold them (training.grpo.rollouts.Sampled).

    data = encode(scored, stats); scored, stats = decode(data, rank=1)
    .venv/bin/pytest tests/test_exchange.py -q
"""

from __future__ import annotations

import json
import struct

import numpy as np
import torch

from rcgrpo.rollout.environment import Rewards

MAGIC = b"rcgrpo-rollouts-1\n"
FIELDS = {"tokens", "truncated", "train", "checks", "reasons"}


class ExchangeError(ValueError):
    """Bytes from another rank that are not rollouts in this format."""


def encode(scored: list, stats: dict) -> bytes:
    """[(Sampled, Rewards)] and the engine's stats dict -> bytes (the layout above); a Sampled
    is rcgrpo.training.grpo.rollouts': ids, loss_mask, logprobs (T,) tensors and truncated."""
    rows = [
        {
            "tokens": int(s.ids.numel()),
            "truncated": bool(s.truncated),
            "train": float(r.train),
            "checks": {str(k): _plain(v) for k, v in r.checks.items()},
            "reasons": dict(r.reasons),
        }
        for s, r in scored
    ]
    stats = {str(k): _plain(v) for k, v in stats.items()}
    header = json.dumps({"rollouts": rows, "stats": stats}, default=str)  # reasons: JSON
    head = header.encode()
    parts = [MAGIC, struct.pack("<Q", len(head)), head]
    for kind, dtype in (
        ("ids", torch.int32),
        ("loss_mask", torch.int8),
        ("logprobs", torch.float32),
    ):
        for s, _ in scored:
            parts.append(getattr(s, kind).to(dtype).contiguous().numpy().tobytes())
    return b"".join(parts)


def decode(data: bytes, rank: int) -> tuple[list, dict]:
    """bytes from rank `rank` -> ([((ids, loss_mask, logprobs, truncated), Rewards)], stats),
    the fields of a Sampled each; ExchangeError naming the rank and what is wrong when they
    are not exactly that."""

    def bad(what: str) -> ExchangeError:
        return ExchangeError(f"rank {rank} sent rollouts not in the exchange format: {what}")

    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise bad("no rcgrpo-rollouts-1 header (a pickle or other bytes)")
    (size,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    if size > len(data) - start:
        raise bad(f"a {size}-byte header in {len(data)} bytes")
    try:
        header = json.loads(data[start : start + size].decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise bad(f"its header is not JSON ({type(e).__name__})") from None
    rows, stats = _checked(header, bad)
    n = sum(row["tokens"] for row in rows)
    body = memoryview(data)[start + size :]
    if len(body) != 9 * n:
        raise bad(f"{len(body)} bytes of token arrays for {n} tokens (9 per token)")
    ids = np.frombuffer(body[: 4 * n], dtype="<i4")
    mask = np.frombuffer(body[4 * n : 5 * n], dtype="i1")
    logprobs = np.frombuffer(body[5 * n :], dtype="<f4")
    out, at = [], 0
    for row in rows:
        t, end = row["tokens"], at + row["tokens"]
        sampled = (
            torch.tensor(ids[at:end], dtype=torch.int32),
            torch.tensor(mask[at:end], dtype=torch.int8),
            torch.tensor(logprobs[at:end], dtype=torch.float32),
            row["truncated"],
        )
        out.append((sampled, Rewards(row["train"], row["checks"], row["reasons"])))
        at += t
    return out, stats


def _number(x) -> bool:
    return type(x) in (int, float)  # JSON numbers (NaN and infinities included), never bool


def _plain(x):
    """A check or stat as a JSON number (ints stay ints, as one process keeps them)."""
    return x if type(x) in (int, float) else float(x)


def _checked(header, bad) -> tuple[list[dict], dict]:
    """The header's rollout rows and stats, every field of the expected type."""
    if not isinstance(header, dict) or set(header) != {"rollouts", "stats"}:
        raise bad("its header is not {rollouts, stats}")
    rows, stats = header["rollouts"], header["stats"]
    if not isinstance(rows, list) or not isinstance(stats, dict):
        raise bad("rollouts is not a list or stats not an object")
    if not all(_number(v) for v in stats.values()):
        raise bad("a stat that is not a number")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != FIELDS:
            raise bad(f"rollout {i} has fields other than {sorted(FIELDS)}")
        t, checks = row["tokens"], row["checks"]
        if type(t) is not int or t < 0 or type(row["truncated"]) is not bool:
            raise bad(f"rollout {i}: tokens or truncated of the wrong type")
        if not _number(row["train"]) or not isinstance(checks, dict):
            raise bad(f"rollout {i}: train or checks of the wrong type")
        if not all(_number(v) for v in checks.values()) or not isinstance(row["reasons"], dict):
            raise bad(f"rollout {i}: a check that is not a number, or reasons not an object")
    return rows, stats

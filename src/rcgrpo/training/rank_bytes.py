"""Bytes between ranks: every rank's byte string, in rank order, on every rank.

The one way data other than tensors crosses between ranks (the RL rollouts, encoded by
rcgrpo.training.grpo.exchange; the rendezvous challenge, rcgrpo.training.rendezvous). It is
what torch.distributed.all_gather_object does, minus the pickle: all_gather of the sizes, then
of the bytes padded to the largest, as uint8 tensors on the backend's device. A size over
`limit` is refused before any buffer is made (another rank's claim must not exhaust memory).

    parts = all_gather_bytes(data, world, device)
    .venv/bin/pytest tests/test_rendezvous.py -q
"""

from __future__ import annotations

import torch

# one rank's share of a step's rollouts, encoded: far above the paper preset's (160 episodes
# of at most 81,920 tokens at 9 bytes = 118 MB), far below what would exhaust memory
LIMIT = 4 * 2**30


def all_gather_bytes(data: bytes, world: int, device, limit: int = LIMIT) -> list[bytes]:
    """Every rank's `data` in rank order (the default process group of `world` ranks)."""
    dist = torch.distributed
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    sizes = [int(s) for s in sizes]
    if max(sizes) > limit:
        rank = max(range(world), key=sizes.__getitem__)
        raise RuntimeError(f"rank {rank} announced {sizes[rank]:,} bytes, over the {limit:,} limit")
    mine = torch.zeros(max(sizes), dtype=torch.uint8)
    if data:
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = [torch.empty(max(sizes), dtype=torch.uint8, device=device) for _ in sizes]
    dist.all_gather(out, mine.to(device))
    return [t[:n].cpu().numpy().tobytes() for t, n in zip(out, sizes, strict=True)]

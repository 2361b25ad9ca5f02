"""The progress protocol between the tool-call sandbox's parent (bfcl/sandbox.py) and its worker
(bfcl/tool_worker.py): a shared memfd holding (call index, start time, reason).

Before each model call the worker writes the call's index and start into it (`mark`), which the
parent reads to enforce the per-call wall-clock limit; a MemoryError inside a tool is reported
through it (`out_of_memory`) before the worker exits. The episode and the replay call the guards
made here, so they need nothing else of the worker.

    .venv/bin/pytest tests/test_sandbox.py -q
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass

IDLE, TRUSTED = -2, -1  # progress marks: between requests; a replayed / ground-truth call
OUT_OF_TIME = "Error during execution: not run: time budget"  # env.message/episode_timeout_s
OOM = 1
LAYOUT = struct.Struct("<qqq")  # call index, start (monotonic ns), reason


@dataclass(frozen=True)
class Failure:
    """A request the worker could not serve (sent back instead of dying)."""

    message: str


_progress: mmap.mmap | None = None  # set only inside a worker process


def attach(memory: mmap.mmap) -> None:
    """Make this process a worker that reports its progress into `memory` (tool_worker.py)."""
    global _progress
    _progress = memory


def mark(index: int) -> None:
    """Record that call `index` starts now (the parent's clock for the wall-clock limit)."""
    if _progress is not None:
        LAYOUT.pack_into(_progress, 0, index, time.monotonic_ns(), 0)


def out_of_memory() -> None:
    """Called on a MemoryError inside a tool: tell the parent why, and end this worker."""
    if _progress is not None:
        index = LAYOUT.unpack_from(_progress, 0)[0]
        LAYOUT.pack_into(_progress, 0, index, time.monotonic_ns(), OOM)
        os._exit(70)
    raise MemoryError


def model_guard(skip: dict[int, str], deadline_ns: int | None = None):
    """Guard for model calls: numbers them, marks each start, answers skipped ones itself, and
    every call that would start at or after `deadline_ns` (CLOCK_MONOTONIC) with OUT_OF_TIME."""
    counter = iter(range(1 << 62))

    def guard() -> str | None:
        index = next(counter)
        if index in skip:
            return skip[index]
        if deadline_ns is not None and time.monotonic_ns() >= deadline_ns:
            return OUT_OF_TIME
        mark(index)
        return None

    return guard


def trusted_guard() -> None:
    mark(TRUSTED)

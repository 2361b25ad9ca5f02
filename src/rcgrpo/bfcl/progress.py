"""The progress protocol between the tool-call sandbox's parent (bfcl/sandbox.py) and its worker
(bfcl/tool_worker.py): a shared memfd holding (call index, start, reason, deadline, since) behind
a write counter (`write`, `read`: a reader never takes a half-written record), and the clock the
tool limits are measured in.

Before each model call the worker writes the call's index and start into it (`mark`), which the
parent reads to enforce the per-call limit; a MemoryError inside a tool is reported through it
(`out_of_memory`) before the worker exits. The episode and the replay call the guards made here,
so they need nothing else of the worker.

Why a call's own time (`OwnClock`) and not wall time: on a busy box a call waits for a CPU most
of the time (a 2 s `square_root` took 11 s of wall at load 25 on 2 cores, past the 5 s limit),
so a wall-clock limit killed legitimate calls and made observations, and rewards, depend on the
box's load. The own clock is CLOCK_MONOTONIC less the time the worker waited for a CPU (the
kernel's run_delay in /proc/PID/schedstat): time on a CPU or blocked counts, time the box gave
to others does not. Without schedstat it is the wall clock.

    .venv/bin/pytest tests/test_sandbox.py tests/test_time_budget.py -q
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import NamedTuple

IDLE, TRUSTED = -2, -1  # progress marks: between requests; a replayed / ground-truth call
OUT_OF_TIME = "Error during execution: not run: time budget"  # env.message/episode_timeout_s
OOM = 1
NO_DEADLINE = 1 << 62
# a write counter, then the record: call index, its start, reason, the message's deadline, the
# message's start (own-clock ns)
SEQ = struct.Struct("<q")
RECORD = struct.Struct("<qqqqq")
SIZE = SEQ.size + RECORD.size


@dataclass(frozen=True)
class Failure:
    """A request the worker could not serve (sent back instead of dying)."""

    message: str


class Reading(NamedTuple):
    """One look at a worker's scheduler counters, all in ns: when (CLOCK_MONOTONIC), its own
    clock then, its CPU time and how many times it was put on a CPU; `exact` when no wait for a
    CPU can be pending (the worker is blocked or stopped, or there is no schedstat)."""

    at: int
    own: int
    cpu: int
    runs: int
    exact: bool


class OwnClock:
    """A process's own time in ns: CLOCK_MONOTONIC less the time its main thread (where tools
    run) waited for a CPU. Read by the worker for itself (`now`) and by the parent for the worker
    (`look`). The kernel adds a wait to run_delay when it ends, so a look while the worker waits
    in the run queue counts that wait: it is an upper bound until `settled`."""

    def __init__(self, pid: int | str = "self"):
        try:
            self._fd: int | None = os.open(f"/proc/{pid}/schedstat", os.O_RDONLY)
            self._stat: int | None = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError:  # no schedstat on this kernel: the wall clock
            self.close()

    def now(self) -> int | None:
        """Own-clock ns; None once the process is gone."""
        if self._fd is None:
            return time.monotonic_ns()
        try:
            waited = int(os.pread(self._fd, 128, 0).split()[1])  # run_delay, ns
        except (OSError, IndexError, ValueError):
            return None
        return time.monotonic_ns() - waited

    def look(self) -> Reading | None:
        """The counters now; None once the process is gone."""
        if self._fd is None:
            at = time.monotonic_ns()
            return Reading(at, at, 0, 0, True)
        try:  # the state first: a wait that begins between the two reads is microseconds old
            state = os.pread(self._stat, 512, 0).rpartition(b")")[2].split()[0]
            cpu, waited, runs = (int(f) for f in os.pread(self._fd, 128, 0).split()[:3])
        except (OSError, IndexError, ValueError):
            return None
        at = time.monotonic_ns()
        return Reading(at, at - waited, cpu, runs, state != b"R")

    def close(self) -> None:
        for fd in (getattr(self, "_fd", None), getattr(self, "_stat", None)):
            if fd is not None:
                os.close(fd)
        self._fd = self._stat = None


def settled(first: Reading | None, now: Reading) -> int | None:
    """A lower bound of the worker's own clock at `now`, or None while it is not known: `now.own`
    when no wait can be pending; else, once the worker has run since the `first` look (its runs
    or CPU time moved), every wait that began before `first.at` has ended and is in now's
    run_delay, so its own clock at `first.at`, and later, is at least `first.at` less that."""
    if now.exact:
        return now.own
    if first is None or (now.runs, now.cpu) == (first.runs, first.cpu):
        return None  # it waits for a CPU since `first` (or has not been looked at before)
    return first.at - (now.at - now.own)


_progress: mmap.mmap | None = None  # set only inside a worker process
_clock: OwnClock | None = None


def attach(memory: mmap.mmap) -> None:
    """Make this process a worker that reports its progress into `memory` (tool_worker.py)."""
    global _progress, _clock
    _progress, _clock = memory, OwnClock()


def own_ns() -> int:
    """This worker's own-clock ns (the wall clock outside a worker)."""
    now = _clock.now() if _clock is not None else None
    return time.monotonic_ns() if now is None else now


def write(memory: mmap.mmap, *record: int) -> None:
    """Write the record (one writer: the worker; the parent before the worker starts).

    The parent reads while the worker writes, and a write is five stores that a preempted writer
    can leave half done: a reader that took the new call index with the previous start (0 in a
    fresh worker) would see a call that had run since then and could kill it. So the counter is
    odd while a write is under way (a seqlock): `read` answers None then, and for a record that
    changed under it. The stores reach the other process in program order (x86-64)."""
    seq = SEQ.unpack_from(memory, 0)[0]
    SEQ.pack_into(memory, 0, seq + 1)
    RECORD.pack_into(memory, SEQ.size, *record)
    SEQ.pack_into(memory, 0, seq + 2)


def read(memory: mmap.mmap) -> tuple[int, int, int, int, int] | None:
    """The record, or None while a write is under way (try again)."""
    seq = SEQ.unpack_from(memory, 0)[0]
    if seq & 1:
        return None
    record = RECORD.unpack_from(memory, SEQ.size)
    return record if SEQ.unpack_from(memory, 0)[0] == seq else None


def mark(index: int, deadline: int = NO_DEADLINE, since: int = 0) -> None:
    """Record that call `index` starts now (the parent's reading for the per-call limit), the
    own-clock `deadline` of its message and when the message's calls began."""
    if _progress is not None:
        write(_progress, index, own_ns(), 0, deadline, since)


def out_of_memory() -> None:
    """Called on a MemoryError inside a tool: tell the parent why, and end this worker."""
    if _progress is not None:
        index, start, _, deadline, since = read(_progress)  # the only writer: never mid-write
        write(_progress, index, start, OOM, deadline, since)
        os._exit(70)
    raise MemoryError


class ModelGuard:
    """Guard for model calls: numbers them, marks each start, answers skipped ones itself, and
    every call once the message's `budget_ns` of own time (from here) is spent with OUT_OF_TIME."""

    def __init__(self, skip: dict[int, str], budget_ns: int | None = None):
        self.skip, self.count = skip, 0
        self.since = own_ns()  # after any replay: only the model's calls count
        self.deadline = NO_DEADLINE if budget_ns is None else self.since + budget_ns

    def __call__(self) -> str | None:
        index, self.count = self.count, self.count + 1
        if index in self.skip:
            return self.skip[index]
        if self.deadline != NO_DEADLINE and own_ns() >= self.deadline:
            return OUT_OF_TIME
        mark(index, self.deadline, self.since)
        return None

    def spent_ns(self) -> int:
        """Own time since the message's calls began."""
        return own_ns() - self.since


def trusted_guard() -> None:
    mark(TRUSTED)

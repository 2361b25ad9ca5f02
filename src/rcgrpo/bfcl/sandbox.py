"""Tool calls run in a worker process with a time and a memory limit enforced from outside.

A BFCL tool is plain Python on model-chosen literals, and some literals never return:
`power(base=10, exponent=300000000)` computes a 10^9-bit integer inside one C call (no signal,
no thread can interrupt it), `logarithm(value=2, base=3, precision=50000000)` asks mpmath for
50 M digits. So every call runs in a long-lived worker subprocess (one per sandbox; `default()`
gives each thread its own) that holds the episodes' API instances:
  * time: before each call the worker writes (call index, start) into a shared 8-byte-aligned
    memfd; the parent waits on the pipe and SIGKILLs the worker once the running call has taken
    `tool_timeout_s` of the worker's own time: wall time less its waits for a CPU, so a busy box
    slows a call down but does not kill it (rcgrpo.bfcl.progress.OwnClock);
  * memory: the worker runs under `RLIMIT_AS = tool_memory_mb`; a MemoryError ends the worker;
  * after a kill (or any death: OOM, segfault, an outside `kill -9`) a fresh worker is started,
    each episode is rebuilt on its next use by replaying its earlier calls (the API classes are
    deterministic, RNGs included), and the faulty call gets the observation
    "Error during execution: timed out after Xs" / "... out of memory (limit N MiB)"; the state
    is that of before the call.
Scoring (`rcgrpo.bfcl.checkers`) sends whole trajectories in one request (a rollout batch: see
agent_loop.results) and replays them in the worker under the same per-call limit. The worker
side is rcgrpo.bfcl.tool_worker; this module is the parent side (the worker's process and how it
is started and stopped: rcgrpo.bfcl.worker_process). Limits: params.yaml `env:`
(rcgrpo.envs.config.EnvConfig, or anything with its five limits), or `--set env.*`.

    from rcgrpo.envs.config import EnvConfig
    sandbox = Sandbox(EnvConfig(tool_timeout_s=1.0))  # Episode(task, sandbox=sandbox)
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from rcgrpo.bfcl.limits import configured
from rcgrpo.bfcl.progress import IDLE, NO_DEADLINE, OOM, TRUSTED, Failure, read, settled
from rcgrpo.bfcl.worker_process import WorkerProcess
from rcgrpo.config import section_class


class SandboxError(RuntimeError):
    """A trusted call (ground truth, a replay of calls that ran before) failed in the worker."""


DIED = "the tool process died"  # a death, not a kill of ours: a trusted call is resent


def _death(code: int | None) -> str:
    return f"{DIED} (exit status {code})"


# -- parent side ---------------------------------------------------------------------------------
class _Killed(Exception):
    def __init__(self, index: int, why: str, spent_ns: int = 0):
        super().__init__(why)
        self.index, self.why = index, why
        self.spent_ns = spent_ns  # own time of the model calls of the message it cut short


class Sandbox:
    """One worker process and the bookkeeping to rebuild it; thread-safe (one request at a time).

    Episodes register here; each keeps its own log of executed calls, which a new worker replays.
    """

    def __init__(self, config=None):
        # an `env:` section (its five limits: rcgrpo.envs.config, found by name), or its defaults
        self.config = config or section_class("env")()
        self._lock = threading.RLock()
        self._worker: WorkerProcess | None = None
        self._live: set[int] = set()  # episodes present in the current worker
        self._tasks: dict[int, object] = {}  # id(task) -> task, sent to the current worker
        self._keep: dict[int, object] = {}  # strong refs so a task id is never reused
        self._drops: list[int] = []
        self._next_id = 0
        self.replaced: list[str] = []  # why each worker was replaced (a kill or a death)
        self._owner = os.getpid()

    # -- process ---------------------------------------------------------------------------------
    def _start(self) -> None:
        self._worker = WorkerProcess.start(self.config)
        self._live.clear()
        self._tasks.clear()
        self._drops.clear()

    def _stop(self) -> None:
        if self._worker is not None:
            self._worker.release()  # once: later calls, and its collection, do nothing

    def close(self) -> None:
        with self._lock:
            self._stop()
            self._worker = None

    @property
    def restarts(self) -> int:
        """Workers replaced after a kill or a death."""
        return len(self.replaced)

    def pid(self) -> int | None:
        """The worker's pid (None before the first request)."""
        return self._worker.proc.pid if self._worker is not None else None

    def _wait(self):
        """The worker's reply, or _Killed once the running call overruns (its own limit, or for
        a model call its message's deadline) or the worker dies. Both are in the worker's own
        time, which runs no faster than the wall clock: waiting `left` never overshoots. A look
        past the limit kills only once `settled` (a look during a wait for a CPU counts it)."""
        limit_ns = int(self.config.tool_timeout_s * 1e9)
        worker = self._worker
        first = None  # the first look past the limit, until it is settled
        while True:
            record = read(worker.progress)
            if record is None:  # the worker is writing it: read again in a moment
                if worker.proc.poll() is not None:  # or died in the middle of the write
                    return self._died()
                time.sleep(0.0005)
                continue
            index, started, _, deadline, since = record
            look = worker.clock.look() if index != IDLE else None
            left, budget = 0.05, False  # idle, or the worker is gone: its pipe or status tells
            if look is not None:
                budget = index >= 0 and deadline < started + limit_ns
                end = deadline if budget else started + limit_ns
                left = (end - look.own) / 1e9
            if left > 0:
                first = None
            else:
                own = settled(first, look)
                if own is not None and own >= end:
                    self._stop()
                    why = (
                        "timed out: time budget"
                        if budget
                        else (f"timed out after {self.config.tool_timeout_s:g}s")
                    )
                    raise _Killed(index, why, own - since if index >= 0 else 0)
                if own is not None or first is None:  # settled short of the end, or a first look
                    first = look
                left = 0.005  # look again once it may have run
            if worker.inp.poll(left):
                try:
                    return worker.inp.recv()
                except (EOFError, OSError):
                    return self._died()
            if worker.proc.poll() is not None:
                return self._died()

    def _died(self):
        # a worker killed in the middle of a write left no record: died between calls
        index, _, reason, _, _ = read(self._worker.progress) or (IDLE, 0, 0, NO_DEADLINE, 0)
        code = self._worker.proc.wait()
        self._stop()
        if reason == OOM:
            why = f"out of memory (limit {self.config.tool_memory_mb} MiB)"
        else:
            why = _death(code)
        raise _Killed(index, why)

    def request(self, op: str, tasks: list, make_args, retries: int = 3, spent=None):
        """Send one request; on a kill, restart the worker and resend with the call skipped.
        Returns (reply, indices of the skipped calls).

        `tasks` are those the arguments name by `id(task)` (sent once per worker); make_args(skip)
        builds the op's arguments (episodes rebuild themselves when not live); skip maps a
        model-call index to its error observation. `spent` ([ns]) gains the own time of the
        model calls each kill cut short (a message's budget spans its resends).
        """
        where = ", ".join(dict.fromkeys(t.id for t in tasks)) or op
        with self._lock:
            if self._owner != os.getpid():  # a forked child: the worker is the parent's
                self._worker, self._owner = None, os.getpid()
            skip: dict[int, str] = {}
            for _ in range(64 + retries):
                if self._worker is not None and self._worker.proc.poll() is not None:
                    self._replace("between requests")
                if self._worker is None:
                    self._start()
                new = {id(t): t for t in tasks if id(t) not in self._tasks}
                message = (op, self._drops[:], new, *make_args(skip))
                try:
                    self._worker.out.send(message)
                    reply = self._wait()
                except (BrokenPipeError, OSError):  # died while idle (an outside kill)
                    self._replace("before the request")
                    continue
                except _Killed as killed:
                    self._worker = None
                    at = {IDLE: "between calls", TRUSTED: "in a trusted call"}
                    self.replaced.append(
                        f"{at.get(killed.index, f'in model call {killed.index}')}: {killed.why}"
                    )
                    if spent is not None:
                        spent[0] += killed.spent_ns
                    if killed.index == TRUSTED and not killed.why.startswith(DIED):
                        raise SandboxError(f"{where}: a trusted call {killed.why}") from None
                    if killed.index >= 0:
                        skip[killed.index] = f"Error during execution: {killed.why}"
                    continue  # IDLE: died between calls; resend as it was
                self._drops.clear()
                if isinstance(reply, Failure):
                    self._tasks.update(new)
                    raise SandboxError(f"{where}: {reply.message}")
                self._tasks.update(new)
                self._keep.update(new)
                return reply, set(skip)
            raise SandboxError(f"{where}: the tool worker keeps failing")

    def _replace(self, at: str) -> None:
        """The worker died outside a request's calls: forget it (the next request starts one)."""
        self._stop()
        code = self._worker.proc.returncode
        self.replaced.append(f"{at}: {_death(code)}")
        self._worker = None

    # -- episodes --------------------------------------------------------------------------------
    def register(self, episode) -> int:
        with self._lock:
            self._next_id += 1
            eid = self._next_id
        weakref.finalize(episode, self._forget, eid)
        return eid

    def _forget(self, eid: int) -> None:
        self._drops.append(eid)
        self._live.discard(eid)

    def run_step(self, eid: int, task, log: list, calls: list, want=None, budget_s=None):
        """Execute `calls` in episode `eid`; returns (observations, ok, extra, overran, seconds,
        spent): overran per call, True for a call that was killed or not run (not part of the
        state); seconds per call, its wall time in the worker; spent, the own time the calls
        took, resends included. Once `budget_s` of it is spent, a call is not run and the one
        running is stopped; worker starts and replays are not counted."""
        spent = [0]

        def make_args(skip):
            replay = None if eid in self._live else list(log)
            left = None if budget_s is None else max(int(budget_s * 1e9) - spent[0], 0)
            return id(task), eid, replay, calls, dict(skip), want, left

        out, _ = self.request("episode", [task], make_args, spent=spent)
        observations, ok, extra, overran, seconds, took = out
        self._live.add(eid)
        return observations, ok, extra, overran, seconds, (spent[0] + took) / 1e9


_local = threading.local()


def default() -> Sandbox:
    """This thread's sandbox (one worker per thread, so threads never wait on each other)."""
    sandbox = getattr(_local, "sandbox", None)
    if sandbox is None:
        sandbox = _local.sandbox = Sandbox(configured())
    return sandbox

"""The worker side of the tool-call sandbox (rcgrpo.bfcl.sandbox starts it and enforces limits).

The worker process holds the episodes' API instances and answers the parent's requests: run a
step of an episode (rebuilding it first from its earlier calls when asked), or score
trajectories (rcgrpo.bfcl.replay.replay_here). Before each model call it writes (call index,
start) into the shared progress memfd, which the parent reads to enforce the per-call limit in
the worker's own time (rcgrpo.bfcl.progress.OwnClock); it runs under RLIMIT_AS and reports a
MemoryError there before exiting. It holds no parent state besides what is sent; model text
reaches it only as parsed `Call`s.

    .venv/bin/pytest tests/test_sandbox.py -q   # started by Sandbox, never by hand
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import sys
from multiprocessing.connection import Connection

from rcgrpo.bfcl import observations, progress
from rcgrpo.bfcl.environment import LocalEpisode
from rcgrpo.bfcl.progress import IDLE, Failure, ModelGuard, mark, trusted_guard
from rcgrpo.bfcl.replay import ground_truth_run, replay_here


def _serve(conn_in: Connection, conn_out: Connection) -> None:
    tasks, episodes = {}, {}
    while True:
        try:
            op, drops, new_tasks, *args = conn_in.recv()
        except EOFError:
            return
        for eid in drops:
            episodes.pop(eid, None)
        tasks.update(new_tasks)
        try:
            if op == "episode":
                task_key, eid, replay, calls, skip, want, budget_ns = args
                if replay is not None:  # (re)build from the initial config + earlier calls
                    episode = episodes[eid] = LocalEpisode(tasks[task_key], hide_missed=False)
                    episode.guard = trusted_guard
                    episode.step(replay)
                episode = episodes[eid]
                episode.guard = guard = ModelGuard(skip, budget_ns)
                step = episode.step(calls)
                extra = None
                if want == "state":
                    extra = episode.state()
                elif want == "instances":
                    extra = episode.instances
                spent = guard.spent_ns()
                reply = (step.observations, step.ok, extra, step.overran, step.seconds, spent)
            elif op == "score":  # several trajectories, model calls numbered across all of them
                items, protocol, paper_too, skip = args
                guard = ModelGuard(skip)
                reply = [
                    replay_here(tasks[key], calls, protocol, paper_too, guard=guard)
                    for key, calls in items
                ]
            else:  # "clear": forget the ground-truth memo (bench/executor.py, cold)
                ground_truth_run.cache_clear()
                reply = None
        except Exception as e:  # our own code failed (not a tool: tools answer in-band)
            reply = Failure(f"{type(e).__name__}: {e}")
        mark(IDLE)
        conn_out.send(reply)
        if new_tasks:  # tasks and their ground-truth memo live as long as the worker: keep the
            gc.freeze()  # cyclic GC from walking them again (worker CPU per replay -25%)


def worker_main() -> None:
    """Entry point of the worker process (argv: in fd, out fd, progress fd, memory MiB,
    observation cap in characters)."""
    import ctypes
    import resource

    fd_in, fd_out, fd_progress, memory_mb, max_chars = (int(a) for a in sys.argv[1:6])
    observations.set_max_chars(max_chars)
    with contextlib.suppress(OSError, AttributeError):  # die with the parent thread that
        ctypes.CDLL(None).prctl(1, 9)  # started us (Linux PR_SET_PDEATHSIG = 1, SIGKILL)
    progress.attach(mmap.mmap(fd_progress, progress.SIZE))
    limit = memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    _serve(Connection(fd_in, writable=False), Connection(fd_out, readable=False))

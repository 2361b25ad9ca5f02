"""One pipeline run at a time per project: `rcgrpo run` and a scheduled run take an exclusive
lock on <project>/cache/locks/rcgrpo-run.lock for the rest of their process; a second one fails
at once, in one line naming the holder (pid, start time, command). The lock folder is the user's
alone (0700, rcgrpo.owned): another local user cannot open the file, so cannot hold the lock.

Why a process-long flock rather than a block: two runs share outputs/ and the MLflow store
(both once created mlflow.db at the same moment, and one died in alembic), so everything a run
does, the store's creation included, must come after the lock. The kernel drops a flock when
its process dies, kill -9 included, so a killed run never leaves a stale lock. A Prefect
deployment runs each flow run in its own process, so the lock is per run there too. Taking it
again in the process that holds it is a no-op (the CLI takes it, then the flow).

    from rcgrpo.run_lock import hold
    hold(project_root())          # RunLocked if another run holds it
    .venv/bin/pytest tests/test_run_lock.py -q
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

from rcgrpo.owned import lock_dir, open_lock

LOCK = "rcgrpo-run.lock"  # in the project's lock folder (rcgrpo.owned.lock_dir)
_held: dict[str, int] = {}  # lock path -> its open descriptor, for the life of the process


class RunLocked(RuntimeError):
    """Another pipeline run of this project holds the lock."""


def hold(root: str | Path, wait_s: float = 0.0) -> Path:
    """Take the project's run lock for the rest of this process (waiting up to `wait_s`);
    RunLocked in one line naming the holder if another process keeps it. Returns its path."""
    fd, path = open_lock(lock_dir(root), LOCK)
    if str(path) in _held:
        os.close(fd)
        return path
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fd)
                os.close(fd)
                raise RunLocked(
                    f"another pipeline run of this project holds {path} ({holder}); wait for "
                    "it to finish or stop it"
                ) from None
            time.sleep(0.5)
    since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200]
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} since {since}: {command}\n".encode(), 0)
    _held[str(path)] = fd
    return path


def _holder(fd: int, wait_s: float = 2.0) -> str:
    """The holder's line. A run that has just taken the lock writes it a moment later (two runs
    started together meet in that moment): read again for up to `wait_s` before "unknown"."""
    deadline = time.monotonic() + wait_s
    while not (text := os.pread(fd, 4096, 0).decode(errors="replace").strip()):
        if time.monotonic() >= deadline:
            return "unknown"
        time.sleep(0.05)
    return text

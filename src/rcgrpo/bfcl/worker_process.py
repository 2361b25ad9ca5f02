"""A tool worker process as the sandbox (rcgrpo.bfcl.sandbox) holds it: its pipes, its progress
memory and the clock its limits are read in; forked by the one spawner thread of this process and
released once (by the sandbox, when the sandbox is collected, or at exit).

Why a spawner thread: the worker asks the kernel for SIGKILL when its parent dies
(PR_SET_PDEATHSIG, set in rcgrpo.bfcl.tool_worker), so that a tool stuck in C code ends with its
owner, after a kill -9 of the owner too. The kernel sends that signal when the *thread* that forked
the worker exits, not the process. A sandbox is shared by threads (the rollout's SandboxPool
serves one thread per episode in flight, and a thread that finishes its last episode exits while
the others run on), so a worker forked by whichever thread first used it was killed in the middle
of another thread's tool call, whose observation became "the tool process died (exit status -9)":
a reward that depended on thread timing. Every worker is forked by a thread that lives as long as
the process instead (started on first use, and again in a forked child, which has no threads).

    .venv/bin/pytest tests/test_sandbox.py -q -k thread
"""

from __future__ import annotations

import mmap
import os
import queue
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from rcgrpo.bfcl.progress import IDLE, NO_DEADLINE, SIZE, OwnClock, write

_lock = threading.Lock()
_requests: queue.SimpleQueue | None = None  # served by this process's spawner thread


def _forked() -> None:  # a forked child has no spawner thread, and _lock may be held
    global _lock, _requests
    _lock, _requests = threading.Lock(), None


os.register_at_fork(after_in_child=_forked)


def popen(argv: list[str], **kwargs) -> subprocess.Popen:
    """subprocess.Popen(argv, **kwargs), forked by the spawner thread."""
    global _requests
    with _lock:
        if _requests is None:
            _requests = queue.SimpleQueue()
            threading.Thread(
                target=_spawner, args=(_requests,), name="rcgrpo-tool-spawner", daemon=True
            ).start()
        requests = _requests
    done, answer = threading.Event(), []
    requests.put((argv, kwargs, answer, done))
    done.wait()
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return answer[0]


def _spawner(requests: queue.SimpleQueue) -> None:
    while True:
        argv, kwargs, answer, done = requests.get()
        try:
            answer.append(subprocess.Popen(argv, **kwargs))
        except BaseException as e:  # noqa: BLE001 - raised in the thread that asked
            answer.append(e)
        done.set()


@dataclass(eq=False)
class WorkerProcess:
    proc: subprocess.Popen
    out: Connection  # requests to the worker
    inp: Connection  # its replies
    progress: mmap.mmap  # (call index, start, ...): rcgrpo.bfcl.progress
    clock: OwnClock  # the worker's own time, read from here

    @classmethod
    def start(cls, config) -> WorkerProcess:
        """A fresh worker under `config`'s memory and observation limits."""
        to_worker, from_parent = os.pipe()[::-1]
        from_worker, to_parent = os.pipe()
        progress_fd = os.memfd_create("rcgrpo-tool-progress")
        os.ftruncate(progress_fd, SIZE)
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        code = "from rcgrpo.bfcl.tool_worker import worker_main; worker_main()"
        fds = (from_parent, to_parent, progress_fd)
        limits = (config.tool_memory_mb, config.max_observation_chars)
        args = [str(fd) for fd in fds] + [str(n) for n in limits]
        proc = popen(
            # -P: `-c` would put the working directory first on sys.path, and a planted
            # mmap.py there would run inside the worker
            [sys.executable, "-P", "-c", code, *args],
            pass_fds=fds,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        os.close(from_parent)
        os.close(to_parent)
        progress = mmap.mmap(progress_fd, SIZE)
        os.close(progress_fd)
        write(progress, IDLE, 0, 0, NO_DEADLINE, 0)
        to, back = Connection(to_worker, readable=False), Connection(from_worker, writable=False)
        return cls(proc, to, back, progress, OwnClock(proc.pid))

    def __post_init__(self):
        self.release = weakref.finalize(
            self, _release, self.proc, self.out, self.inp, self.clock, os.getpid()
        )


def _release(proc: subprocess.Popen, out, inp, clock, owner: int) -> None:
    """Stop a worker and close its pipes and clock (a forked child leaves its parent's alone)."""
    if os.getpid() != owner:
        return
    if proc.poll() is None:
        proc.kill()  # SIGKILL: a tool stuck in C code ignores everything else
    proc.wait()
    out.close()
    inp.close()
    clock.close()

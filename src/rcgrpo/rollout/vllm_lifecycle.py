"""How a vLLM server's life is tied to the process that owns it.

A server holds a GPU's memory (tens of GB) until it exits, so it must die with its owner however
the owner dies:

  * it runs under the parent-death guard of rcgrpo.procs (started as a file, so the server's
    environment carries none of the project's paths): kill -9 or the OOM killer on the owner,
    which run no handler and no atexit, still stop the server within the guard's grace;
  * `stop_on_signals` gives the owner a SIGTERM / SIGHUP handler (torchrun and schedulers stop a
    rank with SIGTERM) that stops every live server before the process exits; it is installed
    only where the handler is still the default, so a caller's own handler is kept;
  * `scrubbed` drops the launcher's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*,
    TORCHELASTIC_*): a server started by a torchrun rank must not think it is one;
  * `leftovers` names a server of this project still running as this user with no guard above
    it (left by an earlier run that died before the guard existed, or whose guard was killed),
    in one line;
  * `ipc_dir` keeps a server's ZMQ sockets in a folder of its own, removed with the server.

    .venv/bin/pytest tests/test_lifecycle.py -q
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

MARK = "rcgrpo_vllm_guard.BearerGuard"  # on every server's command line (--middleware)
LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "ACCELERATE_")

LIVE: set = set()  # the servers this process started and has not stopped (VLLMServer)
_LOCK = threading.Lock()


def scrubbed(env: dict[str, str]) -> dict[str, str]:
    """env without the launcher's (torchrun / accelerate) variables."""
    return {
        k: v
        for k, v in env.items()
        if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)
    }


def group_alive(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of process group pgid, read from /proc."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(int(stat.parent.name))
    return alive


def _cmdline(pid: int | str) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _ppid(pid: int | str) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def servers_running() -> list[int]:
    """Pids of every live vLLM server of this project on this machine that runs as this user
    (any user can start a process whose command line carries MARK: theirs are not ours to name,
    nor to advise killing)."""
    return [int(p) for p in filter(str.isdigit, _pids()) if MARK in _cmdline(p) and _mine(p)]


def _mine(pid: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def _pids() -> list[str]:
    try:
        return [p.name for p in Path("/proc").iterdir()]
    except OSError:
        return []


def leftovers() -> list[int]:
    """Servers of this project whose owner is gone (their parent is no Python process: init or
    a subreaper adopted them): nobody will ever stop them."""
    return [pid for pid in servers_running() if "python" not in _cmdline(_ppid(pid))]


IPC_PREFIX = "rcgrpo-vllm-ipc-"  # + the owner's pid: the temp-dir folder of a server's sockets


def ipc_dir() -> Path:
    """A new folder for one server's ZMQ sockets (vLLM binds ipc://<VLLM_RPC_BASE_PATH>/<uuid>,
    by default straight in the temp dir, where every server left its sockets behind). Its path
    stays short, since a socket path may not pass 107 bytes: in the temp dir, or in /tmp where
    $TMPDIR is long. VLLMServer.stop removes it; the folders of owners that died without
    stopping go at the next server start (only this user's: the temp dir is shared, and a
    folder planted there under this name is left alone, however deep)."""
    import tempfile

    from rcgrpo.owned import sweep_dead

    base = Path(tempfile.gettempdir())
    if len(str(base)) + len(IPC_PREFIX) + 60 > 107:  # pid-random/ + a 36-char uuid
        base = Path("/tmp")
    sweep_dead(base, IPC_PREFIX)
    return Path(tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-", dir=base))


def leftover_line(pids: list[int]) -> str:
    """One line naming the servers left behind, and how to stop them."""
    return (
        f"{len(pids)} vLLM server(s) of an earlier rcgrpo run still running (pid "
        f"{', '.join(map(str, pids))}; they hold their GPU memory): stop them with "
        f"`kill {' '.join(map(str, pids))}`"
    )


def register(server) -> None:
    with _LOCK:
        LIVE.add(server)
    stop_on_signals()


def unregister(server) -> None:
    with _LOCK:
        LIVE.discard(server)


def stop_all() -> None:
    """Stop every live server of this process (signal handlers, atexit)."""
    with _LOCK:
        servers = list(LIVE)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


def _on_signal(signum, _frame) -> None:
    stop_all()
    raise SystemExit(128 + signum)  # atexit and finally blocks still run


def stop_on_signals() -> None:
    """SIGTERM / SIGHUP stop this process's servers, then exit 128+n (main thread only; kept
    where the process already set its own handler)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_signal)

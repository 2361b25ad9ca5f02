"""Child processes that die with the command that started them, and who holds a port.

A server started by `rcgrpo` (the two UIs of `rcgrpo ui`, the Prefect API server of a
`rcgrpo run`) runs under a small guard process, `python -P -m rcgrpo.procs --ppid P -- cmd`:

  * the command runs in its own process group (session), so its workers (MLflow's uvicorn,
    anything the server spawns) are stopped with it;
  * the guard gets prctl(PR_SET_PDEATHSIG, SIGTERM) (Linux) and also polls getppid() every
    0.5 s, so when the caller dies (also by kill -9, which no handler sees) the guard stops the
    group; it re-checks getppid() right after the prctl (the caller may have died before);
  * on SIGTERM / SIGINT / SIGHUP, or when the command exits by itself, the guard sends SIGTERM
    to the whole group and SIGKILL after `--grace` seconds (a uvicorn that waits for a
    browser's open websocket would hold the port much longer), then exits;
  * the guard unblocks those three signals first: a signal mask is inherited across fork and
    exec, and a caller that had SIGTERM blocked (a thread of a library that blocks signals
    while it spawns) gave a guard that never saw its stop, so `servers.stop` killed the guard
    after 15 s and the server ran on, orphaned.

PR_SET_PDEATHSIG fires when the *thread* that forked the guard exits, so `guarded` called from
another thread (a Prefect task's worker thread) asks the guard to rely on the getppid() poll
alone. A caller whose child must not see the project's sys.path (the vLLM server, which runs
another venv) starts the guard as a file (`module=False`): it imports only the standard library. `port_owner(port)` names the process listening on a TCP port (from
/proc/net/tcp and /proc/<pid>/fd), for a one-line "port 4200 is taken by pid ..." error.

    argv = guarded(["mlflow", "ui", ...])        # Popen(argv, start_new_session=True)
    .venv/bin/pytest tests/test_ui.py tests/test_servers.py -q
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 5.0  # SIGTERM -> SIGKILL: ports are free within ~6 s of a stop
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what stops a guard


def guarded(
    cmd: list[str], grace: float = GRACE_S, module: bool = True, pass_fds: tuple[int, ...] = ()
) -> list[str]:
    """argv that runs `cmd` under the guard, watching this process (see the module doc).
    `-P`: the working directory is not put on the guard's sys.path. module=False: the guard
    runs as this file, so it needs no PYTHONPATH (the child inherits the environment as given).
    pass_fds: descriptors the command gets under the same numbers (a listening socket bound by
    the caller; the caller's Popen must pass them to the guard too)."""
    import threading

    guard = ["-m", "rcgrpo.procs"] if module else [str(Path(__file__).resolve())]
    poll = [] if threading.current_thread() is threading.main_thread() else ["--poll-only"]
    fds = [a for fd in pass_fds for a in ("--pass-fd", str(fd))]
    return [
        sys.executable,
        "-P",
        *guard,
        "--ppid",
        str(os.getpid()),
        "--grace",
        str(grace),
        *poll,
        *fds,
        "--",
        *cmd,
    ]


def child_env(env: dict | None = None) -> dict:
    """The environment of a guarded child: rcgrpo importable from where this one was loaded
    (the guard is `-m rcgrpo.procs`), and PYTHONSAFEPATH so that no `python -m` below it puts
    its working directory first on sys.path (a planted json.py there would run)."""
    env = dict(os.environ if env is None else env)
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env["PYTHONSAFEPATH"] = "1"
    return env


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig) on Linux; False where it is not available."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _group_alive(pgid: int) -> bool:
    """Any member of process group `pgid` left that is not a zombie?"""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_group(pgid: int, grace: float = GRACE_S, child: subprocess.Popen | None = None) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after `grace` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if child is not None:
            child.poll()  # reap it, or it stays a member (a zombie) of the group
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def guard_main(argv: list[str]) -> int:
    ppid = int(argv[argv.index("--ppid") + 1])
    grace = float(argv[argv.index("--grace") + 1])
    cmd, own = argv[argv.index("--") + 1 :], argv[: argv.index("--")]
    fds = tuple(int(own[i + 1]) for i, a in enumerate(own) if a == "--pass-fd")
    if "--poll-only" not in own:
        set_parent_death_signal()
    if os.getppid() != ppid:  # the caller died before the prctl took effect
        return 1
    stopping: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda n, _f: stopping.append(n))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # the command inherits this mask
    child = subprocess.Popen(cmd, start_new_session=True, pass_fds=fds)
    while not stopping and os.getppid() == ppid and child.poll() is None:
        time.sleep(0.5)
    stop_group(child.pid, grace, child)
    child.wait()
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on host:port now (SO_REUSEADDR, as uvicorn binds)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _listening(port: int) -> list[list[str]]:
    """The /proc/net/tcp{,6} rows of sockets listening on TCP `port` (fields split)."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()  # sl local_address rem_address st ... uid timeout inode
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                rows.append(f)
    return rows


def port_is_mine(port: int) -> bool:
    """Whether what listens on TCP `port` runs as this user (before sending it a secret)."""
    rows = _listening(port)
    return bool(rows) and all(int(f[7]) == os.getuid() for f in rows)


def port_owner(port: int) -> str:
    """'pid 123 (prefect server start ...)' for the process listening on TCP `port`."""
    inodes = {f[9] for f in _listening(port)}
    for pid in sorted(filter(str.isdigit, os.listdir("/proc")), key=int):
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if any(link[8:-1] in inodes for link in links if link.startswith("socket:[")):
            raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            return f"pid {pid} ({' '.join(raw.decode(errors='replace').split())[:120]})"
    return "a process this user cannot see" if inodes else "a socket not listening yet"


if __name__ == "__main__":
    sys.exit(guard_main(sys.argv[1:]))

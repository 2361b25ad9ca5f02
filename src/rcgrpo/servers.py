"""Start, wait for and stop the local servers: the MLflow UI, the Prefect server (with its UI) of
`rcgrpo ui`; the private Prefect API server of one `rcgrpo run` / `rcgrpo data build` starts
through them (rcgrpo.flow_server).

All bind to 127.0.0.1, with settings that suit 2 cores (MLflow: one worker, job execution off;
Prefect on SQLite). Each runs under a guard (rcgrpo.procs) in its own process group, from a
fixed working directory (the log folder) with PYTHONSAFEPATH set: stopping it (or the death of
the command that started it, also by kill -9) ends it with every worker it spawned, and no
module planted in the caller's working directory is imported by it.

Who may drive them. Any local process can reach 127.0.0.1, and a page in a browser can too
(DNS rebinding: Prefect 3.9 has no Host check). So the Prefect API asks for an auth string
(Prefect's `PREFECT_SERVER_API_AUTH_STRING`; clients send `PREFECT_API_AUTH_STRING`): for
`rcgrpo ui` one per machine, generated on first use and kept in `$PREFECT_HOME/rcgrpo-api-auth`
(mode 0600; the UI asks for it once, at its login page); for a command's own server a fresh one
per run, in its environment only. Without it every /api route but /api/health and /api/ready
answers 401 and the event and log websockets close with 1008. On top, CORS only for the UI's
own origin and CSRF tokens on every POST/PUT/PATCH/DELETE (Prefect's clients fetch them).
The MLflow UI asks for its own login (rcgrpo.mlflow_ui, which starts it). tests/test_schedule.py
and tests/test_servers.py check these against started servers.

Whose port. The caller binds each server's port itself (`listen`) before the server starts, hands
the listening socket over as a file descriptor (`uvicorn --fd`) and keeps its own copy until the
server is stopped. So between the check and the server there is no moment when another user
could take the port: he would get the browser's login and the UI's secrets (a server that
binds by itself seconds after a free-port check loses that race). While the caller lives the
port stays bound, even if the server dies.

    rcgrpo ui                      # both, until Ctrl-C (see rcgrpo.cli.ui)
    from rcgrpo.servers import start_prefect, stop
    server = start_prefect(port=4201); ...; stop(server)
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rcgrpo.owned import private_dir, private_files
from rcgrpo.procs import GRACE_S, child_env, guarded, port_owner
from rcgrpo.runtime import apply_defaults, project_root

HOST = "127.0.0.1"
AUTH_FILE = "rcgrpo-api-auth"  # in PREFECT_HOME, mode 0600: the `rcgrpo ui` server's auth


class ServerError(RuntimeError):
    """A server cannot start (its port is taken, ...); the message says by what."""


@dataclass
class Server:
    name: str
    proc: subprocess.Popen  # the guard (rcgrpo.procs), leader of its own process group
    url: str  # what a browser opens
    health: str  # answers 200 once ready
    log: Path
    auth: str | None = None  # Prefect: the API auth string
    sock: socket.socket | None = None  # the listening socket it was given; closed by stop()


def listen(port: int, option: str) -> socket.socket:
    """A socket listening on HOST:port (0: a free one), bound here for a server to be handed
    (see the module doc); ServerError in one line naming the process that holds the port."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past connections' TIME_WAIT
    try:
        sock.bind((HOST, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise ServerError(
            f"port {port} on {HOST} is taken by {port_owner(port)}: stop it, or pick another "
            f"port with {option}"
        ) from None
    return sock


def _spawn(
    name: str, cmd: list[str], env: dict, health: str, log: Path, sock: socket.socket
) -> Server:
    """The guarded server `cmd`, given `sock` under the same descriptor number (uvicorn --fd);
    `health` the path that answers 200 once it is ready."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = sock.fileno()
    try:
        with log.open("wb") as out:  # never our stdout: a reader of it would wait for the server
            proc = subprocess.Popen(
                guarded(cmd, pass_fds=(fd,)),
                env=child_env(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=log.parent,
                start_new_session=True,
                pass_fds=(fd,),
                umask=0o077,  # what a server writes (its SQLite database) is the user's alone
            )
    except BaseException:
        sock.close()
        raise
    return Server(name, proc, url_of(sock), url_of(sock) + health, log, sock=sock)


def url_of(sock: socket.socket) -> str:
    return f"http://{HOST}:{sock.getsockname()[1]}"


def uvicorn(app_dir: str, factory: str, sock: socket.socket, *options: str) -> list[str]:
    """The command serving the ASGI app `factory` ("module:function") on the listening `sock`
    (`--fd`: _spawn passes it down). `-P` and --app-dir: the working directory never enters
    sys.path (a planted module there would run)."""
    cmd = [sys.executable, "-P", "-m", "uvicorn", "--app-dir", app_dir, "--factory", factory]
    return [*cmd, "--fd", str(sock.fileno()), *options]


def _logs(log_dir: Path | None) -> Path:
    return Path(log_dir or project_root() / "cache" / "logs")


def prefect_home(home: Path | None = None) -> Path:
    return Path(home or os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()


def private_prefect_home(home: Path | None = None) -> Path:
    """PREFECT_HOME as the user's alone before a Prefect server uses it: 0700, its SQLite
    database (every flow run, its parameters and logs) 0600, also one made before."""
    folder = private_dir(prefect_home(home))
    private_files(folder, "prefect.db*")
    return folder


def prefect_auth(home: Path | None = None, create: bool = True) -> str | None:
    """The `rcgrpo ui` server's API auth string ('rcgrpo:<random>'), kept in
    $PREFECT_HOME/rcgrpo-api-auth with mode 0600 (made on first use; a copy that others could
    read is set back to 0600). None if absent and not `create`."""
    path = prefect_home(home) / AUTH_FILE
    if not path.exists():
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # O_EXCL: 0600 from the first byte
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"rcgrpo:{secrets.token_urlsafe(24)}\n")
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    return path.read_text().strip() or None


def start_prefect(
    port: int = 4200,
    home: Path | None = None,
    log_dir: Path | None = None,
    sock: socket.socket | None = None,
) -> Server:
    """Prefect's server with its UI (SQLite under PREFECT_HOME; `home` overrides it, e.g. in
    tests), with the machine's auth string (`prefect_auth`), on `sock` (default: `listen(port)`).
    It is what `prefect server start --background` runs (uvicorn on Prefect's create_app, its
    services in the app), given the socket instead of a port to bind."""
    apply_defaults()
    sock = sock or listen(port, "--prefect-port")
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)  # the server itself must not point at another one
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    private_prefect_home(home)
    url = url_of(sock)
    auth = prefect_auth(home)
    env["PREFECT_SERVER_API_AUTH_STRING"] = env["PREFECT_API_AUTH_STRING"] = auth
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT__SERVER_FINAL"] = "1"  # as `prefect server start` creates its app
    # the UI's settings do not know the port: tell it where its API is
    env["PREFECT_UI_API_URL"] = f"{url}/api"
    # CORS only for the UI's own origin, and CSRF tokens on every POST/PUT/PATCH/DELETE
    env["PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS"] = url
    env["PREFECT_SERVER_API_CORS_ALLOWED_METHODS"] = "GET,POST,PUT,PATCH,DELETE,OPTIONS"
    env["PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED"] = "true"
    site = str(Path(importlib.util.find_spec("prefect").origin).parents[1])
    cmd = uvicorn(site, "prefect.server.api.server:create_app", sock, "--log-level", "warning")
    log = _logs(log_dir) / "prefect-server.log"
    server = _spawn("Prefect UI", cmd, env, "/api/health", log, sock)
    server.auth = auth
    return server


def answers(url: str, timeout: float = 2.0, auth: str | None = None) -> bool:
    """Whether GET `url` answers 200 (with Prefect's Basic auth header when `auth` is given)."""
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:  # 127.0.0.1 only
            return r.status == 200
    except OSError:
        return False


def wait_ready(servers: list[Server], timeout: float = 180.0) -> None:
    """Block until every server's health URL answers; raise with its log tail if one dies."""
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        for s in list(pending):
            if s.proc.poll() is not None:
                tail = s.log.read_text(errors="replace")[-2000:] if s.log.exists() else ""
                raise RuntimeError(f"{s.name} exited with {s.proc.returncode}; {s.log}:\n{tail}")
            if answers(s.health):
                pending.remove(s)
        if pending and time.monotonic() > deadline:
            names = ", ".join(s.name for s in pending)
            raise TimeoutError(f"{names} not ready after {timeout:.0f} s; logs in {pending[0].log}")
        if pending:
            time.sleep(0.5)


def stop(server: Server, timeout: float = GRACE_S + 10) -> None:
    """Stop the server and everything in its process group: SIGTERM to its guard, which stops
    the group (SIGKILL after GRACE_S); SIGKILL to the guard's group if it has not gone by then."""
    import signal

    try:
        if server.proc.poll() is not None:
            return
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
    finally:
        if server.sock is not None:  # the port is free again only now
            server.sock.close()

"""Start, wait for and stop the local servers: the MLflow UI, the Prefect server (with its UI) of
`rcgrpo ui`, and the private Prefect API server of one `rcgrpo run` / `rcgrpo data build`.

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

    rcgrpo ui                      # both, until Ctrl-C (see rcgrpo.cli.pipeline)
    from rcgrpo.servers import start_prefect, stop
    server = start_prefect(port=4201); ...; stop(server)
    with private_prefect():        # PREFECT_API_URL + PREFECT_API_AUTH_STRING set inside
        flow()
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rcgrpo.procs import GRACE_S, child_env, guarded, port_free, port_is_mine, port_owner
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


def _bin(name: str) -> str:
    """The console script next to this interpreter (the venv's), else whatever PATH has."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def check_port(port: int, option: str) -> None:
    """ServerError in one line naming the process that holds 127.0.0.1:<port>, if one does."""
    if not port_free(port, HOST):
        raise ServerError(
            f"port {port} on {HOST} is taken by {port_owner(port)}: stop it, or pick another "
            f"port with {option}"
        )


def _spawn(name: str, cmd: list[str], env: dict, url: str, health: str, log: Path) -> Server:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:  # never our stdout: a reader of it would wait for the server
        proc = subprocess.Popen(guarded(cmd), env=child_env(env), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=log.parent, start_new_session=True)  # fmt: skip
    return Server(name, proc, url, health, log)


def _logs(log_dir: Path | None) -> Path:
    return Path(log_dir or project_root() / "cache" / "logs")


def prefect_home(home: Path | None = None) -> Path:
    return Path(home or os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()


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
    port: int = 4200, home: Path | None = None, log_dir: Path | None = None
) -> Server:
    """`prefect server start` (SQLite under PREFECT_HOME; `home` overrides it, e.g. in tests),
    with the machine's auth string (`prefect_auth`)."""
    apply_defaults()
    check_port(port, "--prefect-port")
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)  # the server itself must not point at another one
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    url = f"http://{HOST}:{port}"
    auth = prefect_auth(home)
    env["PREFECT_SERVER_API_AUTH_STRING"] = env["PREFECT_API_AUTH_STRING"] = auth
    # `--port` does not reach the UI's settings (it would call :4200): tell it where its API is
    env["PREFECT_UI_API_URL"] = f"{url}/api"
    # CORS only for the UI's own origin, and CSRF tokens on every POST/PUT/PATCH/DELETE
    env["PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS"] = url
    env["PREFECT_SERVER_API_CORS_ALLOWED_METHODS"] = "GET,POST,PUT,PATCH,DELETE,OPTIONS"
    env["PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED"] = "true"
    cmd = [_bin("prefect"), "server", "start", "--host", HOST, "--port", str(port),
           "--analytics-off"]  # fmt: skip
    log = _logs(log_dir) / "prefect-server.log"
    server = _spawn("Prefect UI", cmd, env, url, f"{url}/api/health", log)
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

    if server.proc.poll() is not None:
        return
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()


def prefect_api_running(port: int = 4200, home: Path | None = None) -> tuple[str, str] | None:
    """(API URL, auth string) of `rcgrpo ui`'s Prefect server when one answers on
    127.0.0.1:<port>, runs as this user, refuses a request without the auth string and takes
    this machine's one; else None (the string is never sent to anyone else's server)."""
    api = f"http://{HOST}:{port}/api"
    if not port_is_mine(port) or not answers(f"{api}/health", timeout=1.0):
        return None  # the auth string goes only to a server of this user that asks for it
    auth = prefect_auth(home, create=False)
    if not auth or answers(f"{api}/admin/version", 2.0):
        return None
    return (api, auth) if answers(f"{api}/admin/version", 2.0, auth) else None


def prefect_for_flows(stack: contextlib.ExitStack) -> str:
    """Where this command's flows report, entered on `stack`: PREFECT_API_URL if the user set
    one; else `rcgrpo ui`'s server when it answers and takes this machine's auth string (the
    runs show there live); else a `private_prefect` server that stops with the command."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    if found := prefect_api_running():
        stack.enter_context(use_prefect(*found))
        return found[0]
    server = stack.enter_context(private_prefect())
    return f"{server.url}/api (this command's own, stopped with it; `rcgrpo ui` keeps a UI)"


@contextlib.contextmanager
def private_prefect(log_dir: Path | None = None, timeout: float | None = None):
    """A Prefect API server for this command alone (what Prefect's ephemeral server was, but
    it dies with the command: Prefect's outlived a kill -9 or a SIGTERM, re-parented to PID 1,
    and held the command's stdout open). A fresh auth string per run; PREFECT_API_URL and
    PREFECT_API_AUTH_STRING point this process (and its children) at it inside the block.
    Queued Prefect logs and events are sent before it stops. Start it from the main thread."""
    apply_defaults()
    with contextlib.closing(__import__("socket").socket()) as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    auth = f"rcgrpo:{secrets.token_urlsafe(24)}"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {
        "PREFECT_SERVER_API_AUTH_STRING": auth,
        "PREFECT_API_AUTH_STRING": auth,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }  # fmt: skip  (as Prefect starts its ephemeral one)
    site = str(Path(importlib.util.find_spec("prefect").origin).parents[1])
    # --app-dir: uvicorn would put its working directory first on sys.path otherwise
    cmd = [sys.executable, "-P", "-m", "uvicorn", "--app-dir", site, "--factory",
           "prefect.server.api.server:create_app", "--host", HOST, "--port", str(port),
           "--log-level", "error", "--lifespan", "on"]  # fmt: skip
    url = f"http://{HOST}:{port}"
    log = _logs(log_dir) / "prefect-private.log"
    server = _spawn("Prefect API (this command's)", cmd, env, url, f"{url}/api/health", log)
    server.auth = auth
    try:
        limit = timeout or float(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
        wait_ready([server], limit)
        with use_prefect(f"{url}/api", auth):
            yield server
    finally:
        _drain_prefect()
        stop(server)


@contextlib.contextmanager
def use_prefect(api: str, auth: str):
    """Point the Prefect clients of this process and of the processes it starts at `api`, sending
    `auth`. Prefect reads its settings when it is imported, so the environment alone reaches
    only children: this process gets them through prefect's temporary_settings."""
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING")}
    os.environ.update(PREFECT_API_URL=api, PREFECT_API_AUTH_STRING=auth)
    try:
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: auth}):
            yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _drain_prefect() -> None:
    """Send Prefect's queued logs and events before their server stops (else they are lost)."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            worker.drain_all(timeout=10)

"""Where a command's Prefect flows report: the user's PREFECT_API_URL, `rcgrpo ui`'s server, or
a private Prefect API server that lives and dies with the command.

Why a private server and not Prefect's ephemeral one: Prefect's outlived a kill -9 or a SIGTERM
of the command (re-parented to PID 1) and held its stdout open; this one runs under the guard of
rcgrpo.procs like every server of rcgrpo.servers, with a fresh auth string per run, on a port
this command binds and holds until the server stops (rcgrpo.servers.listen). The auth string of
`rcgrpo ui`'s server goes only to a server of this user that asks for it; an exported
PREFECT_API_URL on this machine is used only when its port's listener runs as this user
(`checked_api_url`): any local user can listen on a port that is free.

    with private_prefect():        # PREFECT_API_URL + PREFECT_API_AUTH_STRING set inside
        flow()
    api = prefect_for_flows(stack)   # what `rcgrpo run` does
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import socket
import sys
import time
from pathlib import Path

from rcgrpo.procs import port_is_mine, port_owner
from rcgrpo.runtime import apply_defaults
from rcgrpo.servers import (
    HOST,
    ServerError,
    _logs,
    _spawn,
    answers,
    listen,
    prefect_auth,
    private_prefect_home,
    stop,
    uvicorn,
    wait_ready,
)


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
        return checked_api_url(os.environ["PREFECT_API_URL"])
    if found := prefect_api_running():
        stack.enter_context(use_prefect(*found))
        return found[0]
    server = stack.enter_context(private_prefect())
    return f"{server.url}/api (this command's own, stopped with it; `rcgrpo ui` keeps a UI)"


def checked_api_url(url: str) -> str:
    """`url` (PREFECT_API_URL) if its clients may send it the auth string: a server at an
    address of this machine (loopback included) must run as this user (its port's listener,
    from /proc/net/tcp), since any local user can listen on a free port there; a server
    elsewhere is the user's to vouch for. Else ServerError in one line, before anything is sent."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not on_this_machine(parts.hostname or "") or port_is_mine(port):
        return url
    raise ServerError(
        f"PREFECT_API_URL={url}: port {port} is held by {port_owner(port)}, not by a server of "
        "yours: nothing was sent to it. Unset PREFECT_API_URL (rcgrpo finds `rcgrpo ui`'s "
        "server itself) or start yours on that port"
    )


def on_this_machine(host: str) -> bool:
    """Whether `host` names an address of this machine (a socket can be bound to it here)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError):
        return False
    for family, kind, _, _, address in infos:
        with socket.socket(family, kind) as probe:
            try:
                probe.bind((address[0], 0))
            except OSError:
                continue
            return True
    return False


DRAIN_S = 10.0  # Prefect's queued logs and events, at the end of a command
DRAIN_STOPPING_S = 2.0  # the same when a signal stops it: its output closes within seconds


@contextlib.contextmanager
def private_prefect(log_dir: Path | None = None, timeout: float | None = None):
    """A Prefect API server for this command alone (what Prefect's ephemeral server was, but
    it dies with the command: Prefect's outlived a kill -9 or a SIGTERM, re-parented to PID 1,
    and held the command's stdout open). A fresh auth string per run; PREFECT_API_URL and
    PREFECT_API_AUTH_STRING point this process (and its children) at it inside the block.
    Queued Prefect logs and events are sent before it stops. Start it from the main thread."""
    apply_defaults()
    private_prefect_home()  # its database: the flow runs' parameters and logs
    sock = listen(0, "PREFECT_API_URL")  # bound here, handed to the server, held until it stops
    auth = f"rcgrpo:{secrets.token_urlsafe(24)}"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {  # as Prefect starts its ephemeral one
        "PREFECT_SERVER_API_AUTH_STRING": auth,
        "PREFECT_API_AUTH_STRING": auth,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    site = str(Path(importlib.util.find_spec("prefect").origin).parents[1])
    factory = "prefect.server.api.server:create_app"
    cmd = uvicorn(site, factory, sock, "--log-level", "error", "--lifespan", "on")
    log = _logs(log_dir) / "prefect-private.log"
    server = _spawn("Prefect API (this command's)", cmd, env, "/api/health", log, sock)
    server.auth, url = auth, server.url
    stopping = False
    try:
        limit = timeout or float(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
        wait_ready([server], limit)
        with use_prefect(f"{url}/api", auth):
            yield server
    except BaseException as err:
        stopping = _stopped_by(err)
        raise
    finally:
        _drain_prefect(DRAIN_STOPPING_S if stopping else DRAIN_S)
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


def _stopped_by(err: BaseException) -> bool:
    """`err` is a stop signal or Ctrl-C unwinding the command (rcgrpo's handlers exit 128+n)."""
    if isinstance(err, KeyboardInterrupt):
        return True
    return isinstance(err, SystemExit) and isinstance(err.code, int) and err.code > 128


def _drain_prefect(budget: float) -> None:
    """Send Prefect's queued logs and events before their server stops (else they are lost),
    within `budget` seconds for both queues together: a stalled server must not hold a stopped
    command (and its output) open."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    deadline = time.monotonic() + budget
    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            worker.drain_all(timeout=max(0.1, deadline - time.monotonic()))

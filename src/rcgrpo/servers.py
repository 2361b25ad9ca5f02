"""Start, wait for and stop the two local UIs: the MLflow UI and the Prefect server (with its UI).

Both bind to 127.0.0.1 and use settings that suit 2 cores: MLflow with one worker and its job
execution off, Prefect on SQLite. Prefect allows CORS only from its UI's own origin and requires
CSRF tokens on state-changing requests (MLflow refuses cross-origin requests by default);
tests/test_schedule.py checks both against a started server. Each server is started in its own process group so that Ctrl-C
or `stop()` ends it together with the workers it spawned (and nothing else).

    rcgrpo ui                      # both, until Ctrl-C (see rcgrpo.cli.pipeline)
    from rcgrpo.servers import start_prefect, stop
    server = start_prefect(port=4201); ...; stop(server)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rcgrpo.runtime import apply_defaults, project_root

HOST = "127.0.0.1"


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    url: str  # what a browser opens
    health: str  # answers 200 once ready
    log: Path


def _bin(name: str) -> str:
    """The console script next to this interpreter (the venv's), else whatever PATH has."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def _spawn(name: str, cmd: list[str], env: dict, url: str, health: str, log: Path) -> Server:
    log.parent.mkdir(parents=True, exist_ok=True)
    out = log.open("wb")
    proc = subprocess.Popen(
        cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    out.close()
    return Server(name, proc, url, health, log)


def start_mlflow(store: Path, port: int = 5000, log_dir: Path | None = None) -> Server:
    """`mlflow ui` on <store>/mlflow.db and <store>/artifacts (rcgrpo.tracking.runs.store_dir())."""
    apply_defaults()
    store = Path(store).resolve()
    store.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [
        _bin("mlflow"), "ui",
        "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
        "--artifacts-destination", str(store / "artifacts"),
        "--host", HOST, "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    url = f"http://{HOST}:{port}"
    log = Path(log_dir or project_root() / "cache" / "logs") / "mlflow-ui.log"
    return _spawn("MLflow UI", cmd, env, url, f"{url}/health", log)


def start_prefect(
    port: int = 4200, home: Path | None = None, log_dir: Path | None = None
) -> Server:
    """`prefect server start` (SQLite under PREFECT_HOME; `home` overrides it, e.g. in tests)."""
    apply_defaults()
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)  # the server itself must not point at another one
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    url = f"http://{HOST}:{port}"
    # A page from another origin must not drive the server (it starts flow runs with any
    # parameters): CORS only for the UI's own origin, and CSRF tokens on every POST/PUT/PATCH/
    # DELETE (Prefect's clients fetch them; PREFECT_CLIENT_CSRF_SUPPORT_ENABLED is on by
    # default). Prefect 3.9 has no Host-header check: it binds to 127.0.0.1 only.
    env["PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS"] = url
    env["PREFECT_SERVER_API_CORS_ALLOWED_METHODS"] = "GET,POST,PUT,PATCH,DELETE,OPTIONS"
    env["PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED"] = "true"
    cmd = [
        _bin("prefect"),
        "server",
        "start",
        "--host",
        HOST,
        "--port",
        str(port),
        "--analytics-off",
    ]
    log = Path(log_dir or project_root() / "cache" / "logs") / "prefect-server.log"
    return _spawn("Prefect UI", cmd, env, url, f"{url}/api/health", log)


def answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # 127.0.0.1 only
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


def stop(server: Server, timeout: float = 20.0) -> None:
    """SIGTERM to the server's own process group, SIGKILL if it has not gone after `timeout`."""
    if server.proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(server.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def prefect_api_running(port: int = 4200) -> str | None:
    """The API URL of a Prefect server already answering on 127.0.0.1:<port>, else None."""
    api = f"http://{HOST}:{port}/api"
    return api if answers(f"{api}/health", timeout=1.0) else None

"""`rcgrpo ui` starts the MLflow UI and the Prefect UI on 127.0.0.1, both answer, and it stops
everything it started, with real signals to the real command: on SIGINT
(Ctrl-C), SIGTERM (a service manager, `timeout`), SIGHUP (a closed terminal), when either server
dies, and when the command itself is killed with SIGKILL; each time both ports are free again
within 10 s and no process it started is left (SIGTERM used to leave both servers running under
PID 1, holding the ports). A port already taken fails at once, naming the process holding it.

Runs on free ports with a temp MLflow store and PREFECT_HOME (~15-40 s per start on 2 cores:
two servers start, the Prefect one migrates its SQLite database once); the SIGINT case is not
marked slow, the others are.

    .venv/bin/pytest tests/test_ui.py -q
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_servers import alive, as_from_a_terminal, descendants, started_like_ci


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status
    except OSError:
        return 0


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("ui")


def _start(home):
    """`rcgrpo ui` on free ports; returns (proc, ports, lines so far) once both answer."""
    mport = pport = _free_port()
    while pport == mport:  # the kernel may hand out the same free port twice in a row
        pport = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home / "prefect"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow/mlflow.db"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "rcgrpo.cli", "ui", "--mlflow-port", str(mport),
           "--prefect-port", str(pport)]  # fmt: skip
    with started_like_ci():  # as from a terminal, whatever the runner inherited (test_servers)
        proc = subprocess.Popen(as_from_a_terminal(cmd), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines: list[str] = []
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops both" in line:
            break
    return proc, (mport, pport), "".join(lines)


def _until_exit(proc) -> str:
    """proc's remaining output once it exits (60 s at most); if it does not, it is killed
    (its guards then stop its servers) so that a failed test leaves nothing running."""
    try:
        return proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise


def _ports_free_and_nothing_left(ports, below, within=10.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < within:
        if not any(_get(f"http://127.0.0.1:{p}/") for p in ports) and not alive(below):
            break
        time.sleep(0.2)
    assert not alive(below), f"left running: {alive(below)}"
    for port in ports:
        with socket.socket() as s:  # free to bind again (the next `rcgrpo ui` starts)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    return time.monotonic() - start


def test_ui_starts_both_on_localhost_and_ctrl_c_stops_them(home):
    proc, (mport, pport), text = _start(home)
    try:
        assert f"http://127.0.0.1:{mport}" in text and f"http://127.0.0.1:{pport}" in text, text
        assert _get(f"http://127.0.0.1:{mport}/health") == 200
        assert _get(f"http://127.0.0.1:{pport}/api/health") == 200
        assert _get(f"http://127.0.0.1:{pport}/") == 200  # the Prefect UI page itself
        assert (home / "mlflow" / "mlflow.db").exists()  # the UI serves the store we named
        secret = home / "mlflow" / "ui-password"  # the MLflow UI's login (rcgrpo.mlflow_ui)
        assert f"its login: user rcgrpo, the password in {secret}" in text
        assert secret.stat().st_mode & 0o777 == 0o600
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{mport}/", timeout=5)
        assert refused.value.code == 401  # the UI itself needs the login
        below = descendants(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        rest = _until_exit(proc)
    assert proc.returncode == 0, rest
    assert "stopped" in rest
    _ports_free_and_nothing_left((mport, pport), below)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_everything(home, sig):
    proc, ports, text = _start(home)
    assert "Ctrl-C stops both" in text, text
    below = descendants(proc.pid)
    assert len(below) >= 4  # two guards, two servers (and MLflow's uvicorn)
    start = time.monotonic()
    proc.send_signal(sig)
    rest = _until_exit(proc)
    _ports_free_and_nothing_left(ports, below)
    took = time.monotonic() - start
    assert proc.returncode == 0 and f"stopping ({sig.name})" in rest and "stopped" in rest, rest
    assert took < 10, took
    print(f"{sig.name}: {len(below)} processes gone, ports free {took:.1f} s after the signal")


@pytest.mark.slow
def test_the_death_of_one_server_stops_the_other(home):
    proc, ports, text = _start(home)
    assert "Ctrl-C stops both" in text, text
    below = descendants(proc.pid)
    cmdlines = {p: Path(f"/proc/{p}/cmdline").read_bytes() for p in below}
    app = b"prefect.server.api.server:create_app"  # the Prefect server (uvicorn), not its guard
    prefect = [p for p, c in cmdlines.items() if app in c and b"rcgrpo.procs" not in c]
    assert len(prefect) == 1, prefect
    start = time.monotonic()
    os.kill(prefect[0], signal.SIGKILL)
    rest = _until_exit(proc)
    _ports_free_and_nothing_left(ports, below)
    took = time.monotonic() - start
    assert took < 10, took
    print(f"Prefect server killed: the rest stopped, ports free {took:.1f} s after")
    assert proc.returncode == 1 and "Prefect UI exited; stopping the rest" in rest, rest


@pytest.mark.slow
def test_a_killed_ui_command_leaves_no_server(home):
    """kill -9 reaches no handler: the guards see their caller die (PR_SET_PDEATHSIG)."""
    proc, ports, text = _start(home)
    assert "Ctrl-C stops both" in text, text
    below = descendants(proc.pid)
    start = time.monotonic()
    proc.kill()
    proc.wait()
    _ports_free_and_nothing_left(ports, below)
    took = time.monotonic() - start
    assert took < 10, took
    print(f"SIGKILL: {len(below)} processes gone, ports free {took:.1f} s after")


def test_a_taken_port_is_one_line_naming_its_holder(home):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "rcgrpo.cli", "ui", "--prefect-port", str(port),
                              "--mlflow-port", str(_free_port())], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "COLUMNS": "400"})  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: port {port} on 127.0.0.1 is taken by "
                                                   f"pid {os.getpid()} ("), lines  # fmt: skip
    assert "--prefect-port" in lines[0] and time.monotonic() - start < 30
    assert "starting" not in out.stdout  # nothing was started

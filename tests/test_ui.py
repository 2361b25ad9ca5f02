"""`rcgrpo ui` starts the MLflow UI and the Prefect UI on 127.0.0.1, both answer, Ctrl-C stops both.

Runs on free ports with a temp MLflow store and PREFECT_HOME (~10-15 s on 2 cores: two servers
start, the Prefect one migrates a fresh SQLite database), so it is not marked slow.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


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


def test_ui_starts_both_on_localhost_and_ctrl_c_stops_them(tmp_path):
    mport, pport = _free_port(), _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow/mlflow.db"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "rcgrpo.cli", "ui", "--mlflow-port", str(mport),
           "--prefect-port", str(pport)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops both" in line:
                break
        text = "".join(lines)
        assert f"http://127.0.0.1:{mport}" in text and f"http://127.0.0.1:{pport}" in text, text
        assert _get(f"http://127.0.0.1:{mport}/health") == 200
        assert _get(f"http://127.0.0.1:{pport}/api/health") == 200
        assert _get(f"http://127.0.0.1:{pport}/") == 200  # the Prefect UI page itself
        assert (tmp_path / "mlflow" / "mlflow.db").exists()  # the UI serves the store we named
    finally:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, rest
    assert "stopped" in rest
    assert _get(f"http://127.0.0.1:{mport}/health") == 0
    assert _get(f"http://127.0.0.1:{pport}/api/health") == 0

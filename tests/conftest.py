"""Shared test set-up: telemetry off and offline before anything imports a heavy library; under
pytest-xdist (`make test` runs its files on 2 workers) a Prefect home per worker; the session's
Prefect server and Debian's Chromium (installed here when missing, as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from rcgrpo.runtime import apply_defaults

# the suite never downloads a model (a hub id fails at once instead of after network retries);
# the runtime defaults leave the hub online for hub-id profiles (tests/test_models.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
apply_defaults()
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # the Prefect API server a command starts for itself keeps its SQLite database in
    # PREFECT_HOME: two workers' servers on one database raced in its migrations
    home = Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()
    os.environ["PREFECT_HOME"] = str(home / f"pytest-{worker}")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def prefect_server():
    """One real ephemeral Prefect server (SQLite, 127.0.0.1) for the whole session (~25 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A fresh SQLite MLflow store in a temp folder (MLFLOW_TRACKING_URI, read by rcgrpo.tracking.runs)."""
    store = tmp_path / "mlflow"
    store.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    return store


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium: on PATH, else installed with apt-get as root, else a skip saying why."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("the UI check needs Debian's `chromium` package; it is not installed and this "
                    "user cannot install it (needs root and apt-get: apt-get install -y chromium)")  # fmt: skip
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # two pytest-xdist workers may both install it: the second waits for dpkg's lock
    install = ["apt-get", "install", "-y", "--no-install-recommends", "-o",
               "DPkg::Lock::Timeout=600", "chromium"]  # fmt: skip
    out = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    if out.returncode:  # a fresh machine may not have read its package lists yet
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
        out = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    if out.returncode or not shutil.which("chromium"):
        pytest.skip(f"apt-get install chromium failed: {(out.stdout + out.stderr)[-300:]}")
    return shutil.which("chromium")

"""Shared test set-up: telemetry off and offline before anything imports a heavy library."""

from __future__ import annotations

import os

from rcgrpo.runtime import apply_defaults

# the suite never downloads a model (a hub id fails at once instead of after network retries);
# the runtime defaults leave the hub online for hub-id profiles (tests/test_models.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
apply_defaults()


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

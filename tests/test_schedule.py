"""Schedules against a REAL Prefect server on 127.0.0.1 (`prefect server start`, SQLite in tmp):
flows/deploy.py serves the pipeline with a cron schedule, the deployment appears with that cron,
a triggered run of it completes and leaves its MLflow pipeline run in a temp store.

The run uses the tiniest parameterisation (stages=[]: open the pipeline's MLflow run, record
versions, write the report) so it completes in seconds; the e2e test runs the real stages.
~20-30 s with the server start-up on 2 cores: marked slow.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rcgrpo import servers
from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow
CRON = "30 3 * * *"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect_home")
    srv = servers.start_prefect(_free_port(), home=home, log_dir=home)
    try:
        servers.wait_ready([srv], timeout=180)
        yield f"{srv.url}/api"
    finally:
        servers.stop(srv)


async def _deployment_and_run(api: str, timeout: float = 240.0):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}):
        async with get_client() as client:
            deadline = time.monotonic() + 120
            while True:  # the serve process registers the deployment after it starts
                try:
                    dep = await client.read_deployment_by_name("rcgrpo-pipeline/test")
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(1.0)
            run = await run_deployment("rcgrpo-pipeline/test", timeout=0)
            deadline = time.monotonic() + timeout
            while True:
                fr = await client.read_flow_run(run.id)
                if fr.state and fr.state.is_final():
                    return dep, fr
                if time.monotonic() > deadline:
                    return dep, fr
                await asyncio.sleep(1.0)


def test_served_deployment_has_cron_and_a_triggered_run_completes(server, tmp_path):
    store = tmp_path / "mlflow"
    reports = tmp_path / "reports"
    env = {**os.environ, "PREFECT_API_URL": server,
           "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db"}  # fmt: skip
    env.pop("MLFLOW_REGISTRY_URI", None)  # exported by mlflow.set_registry_uri in other tests
    params = f'{{"stages": [], "report_root": "{reports}"}}'
    log = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(
        [sys.executable, str(project_root() / "flows" / "deploy.py"), "test", CRON, params],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        dep, fr = asyncio.run(_deployment_and_run(server))
    finally:
        # stop the serve process before the server (a serve whose server vanished hangs)
        os.killpg(serve.pid, signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
        log.close()
    serve_log = (tmp_path / "serve.log").read_text()
    assert [s.schedule.cron for s in dep.schedules] == [CRON], serve_log
    assert fr.state.is_completed(), f"{fr.state}\n{serve_log[-3000:]}"
    # the run did the pipeline's work: an MLflow pipeline run and a report folder
    summaries = list(Path(reports).glob("*/summary.md"))
    assert len(summaries) == 1, serve_log[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("rcgrpo").experiment_id])
    assert [r.info.run_name for r in runs] == ["pipeline"]
    assert runs[0].info.status == "FINISHED" and runs[0].data.tags["git.commit"]

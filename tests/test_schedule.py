"""Schedules against a REAL Prefect server on 127.0.0.1 (`prefect server start`, SQLite in tmp):
flows/deploy.py serves the pipeline with a cron schedule, the deployment appears with that cron,
a triggered run of it completes and leaves its MLflow pipeline run in a temp store.

The run uses the tiniest parameterisation (stages=[]: open the pipeline's MLflow run, record
versions, write the report) so it completes in seconds; the e2e test runs the real stages.
~20-30 s with the server start-up on 2 cores: marked slow.
"""

from __future__ import annotations

import asyncio
import json
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


def _request(url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_a_foreign_origin_and_a_post_without_csrf_token_are_refused(server):
    """Issue 12: the server ran with CORS * and CSRF off, so any web page could start runs."""
    ui = server.removesuffix("/api")
    evil = {"Origin": "http://evil.example"}
    status, headers, _ = _request(f"{server}/health", headers=evil)
    allow = {k.lower(): v for k, v in headers.items()}.get("access-control-allow-origin")
    assert status == 200 and allow is None  # the browser hides the answer from the page
    status, headers, _ = _request(f"{server}/health", headers={"Origin": ui})
    assert {k.lower(): v for k, v in headers.items()}["access-control-allow-origin"] == ui
    preflight = {**evil, "Access-Control-Request-Method": "POST"}
    status, _, _ = _request(f"{server}/flows/", "OPTIONS", preflight)
    assert status == 400  # "Disallowed CORS origin"
    body = b'{"name": "planted-by-a-web-page"}'
    status, _, text = _request(f"{server}/flows/", "POST",
                               {**evil, "Content-Type": "application/json"}, body)  # fmt: skip
    assert status == 403 and b"CSRF" in text

    async def client_path():  # the project's own client fetches its CSRF token and works
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: server}):
            async with get_client() as client:
                made = await client.create_flow_from_name("made-by-the-client")
                names = [f.name for f in await client.read_flows()]
        return made, names

    made, names = asyncio.run(client_path())
    assert made and "made-by-the-client" in names and "planted-by-a-web-page" not in names


EPHEMERAL = """
import json, sys, urllib.request
from rcgrpo.runtime import apply_defaults
apply_defaults()
from prefect import flow, task
from prefect.server.api.server import SubprocessASGIServer

@task
def one():
    return 1

@flow
def tiny():
    return one()

def call(url, method="GET", body=None):
    headers = {"Origin": "http://evil.example", "Content-Type": "application/json"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers, method=method)) as r:
            return r.status, r.headers.get("access-control-allow-origin")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("access-control-allow-origin")

result = tiny()  # starts the ephemeral server; the flow's client must work under CSRF
api = SubprocessASGIServer().api_url
print(json.dumps({"result": result, "health": call(api + "/health"),
                  "post": call(api + "/flows/", "POST", b'{"name": "planted"}')}))
"""


def test_the_ephemeral_server_of_a_flow_run_refuses_other_origins(tmp_path):
    """Issue 12: `rcgrpo run` without `rcgrpo ui` runs its flows on Prefect's ephemeral server,
    which kept Prefect's defaults (CORS *, CSRF off). With the project defaults a flow still
    completes; a foreign page gets no CORS grant and its POST is refused."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", EPHEMERAL], env=env, capture_output=True,
                         text=True, timeout=300, cwd=project_root())  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["result"] == 1
    assert seen["health"] == [200, None]  # answered, but the browser hides it from the page
    assert seen["post"] == [403, None]  # no CSRF token: refused

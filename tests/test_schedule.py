"""Schedules against a REAL Prefect server on 127.0.0.1 (`prefect server start`, SQLite in tmp):
flows/deploy.py serves the pipeline with a cron schedule, the deployment appears with that cron,
a triggered run of it completes and leaves its MLflow pipeline run in a temp store. The same
server shows who may drive it: only a client that sends the machine's auth string,
over HTTP and websockets, whatever its Host or Origin; the UI's own login in headless Chromium.

The run uses the tiniest parameterisation (stages=[]: open the pipeline's MLflow run, record
versions, write the report) so it completes in seconds; the e2e test runs the real stages.
~20-30 s with the server start-up on 2 cores: marked slow.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rcgrpo import flow_server, servers
from rcgrpo.runtime import project_root

SCRIPTS = project_root() / "scripts"

pytestmark = pytest.mark.slow
CRON = "30 3 * * *"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prefect(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect_home")
    srv = servers.start_prefect(_free_port(), home=home, log_dir=home)
    try:
        servers.wait_ready([srv], timeout=180)
        yield srv
    finally:
        servers.stop(srv)


@pytest.fixture(scope="module")
def server(prefect):
    return f"{prefect.url}/api"


def _settings(api: str, auth: str):
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: auth})


async def _deployment_and_run(api: str, auth: str, timeout: float = 240.0):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    with _settings(api, auth):
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


def test_served_deployment_has_cron_and_a_triggered_run_completes(server, prefect, tmp_path):
    store = tmp_path / "mlflow"
    reports = tmp_path / "reports"
    env = {**os.environ, "PREFECT_API_URL": server, "PREFECT_API_AUTH_STRING": prefect.auth,
           "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db"}  # fmt: skip
    env.pop("MLFLOW_REGISTRY_URI", None)  # exported by mlflow.set_registry_uri in other tests
    env["TMPDIR"] = str(system_tmp := tmp_path / "system_tmp")  # the shared /tmp, as it sees it
    system_tmp.mkdir()
    params = f'{{"stages": [], "report_root": "{reports}"}}'
    log = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(
        [sys.executable, str(project_root() / "flows" / "deploy.py"), "test", CRON, params],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        dep, fr = asyncio.run(_deployment_and_run(server, prefect.auth))
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
    assert not (system_tmp / "runner_storage").exists()  # Prefect's Runner: under cache/ instead


def _request(url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_a_foreign_origin_and_a_post_without_csrf_token_are_refused(server, prefect):
    """the server ran with CORS * and CSRF off, so any web page could start runs."""
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

        with _settings(server, prefect.auth):
            async with get_client() as client:
                made = await client.create_flow_from_name("made-by-the-client")
                names = [f.name for f in await client.read_flows()]
        return made, names

    made, names = asyncio.run(client_path())
    assert made and "made-by-the-client" in names and "planted-by-a-web-page" not in names


def _basic(auth: str) -> dict:
    import base64

    return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}


def test_without_the_auth_string_a_foreign_host_or_page_gets_nothing(server, prefect, tmp_path):
    """a DNS-rebinding page (Host: evil.example) got /api/csrf-token and created
    flows (201). Now every /api route but the health checks asks for the machine's auth string,
    kept 0600 in PREFECT_HOME; with it, a foreign Host is still fine (it is the secret that
    counts), and the UI's settings tell it to log in."""
    path = servers.prefect_home(prefect.log.parent) / servers.AUTH_FILE
    assert path.stat().st_mode & 0o777 == 0o600 and path.read_text().strip() == prefect.auth
    rebinding = {"Host": "evil.example", "Origin": "http://evil.example"}
    for method, route, body in (("GET", "/csrf-token?client=page", None),
                                ("GET", "/admin/version", None),
                                ("POST", "/flows/filter", b"{}"),
                                ("POST", "/deployments/filter", b"{}")):  # fmt: skip
        status, _, _ = _request(f"{server}{route}", method, rebinding, body)
        assert status in (401, 403), (route, status)  # 403: refused by CSRF before auth
    wrong = _basic("rcgrpo:guessed")
    assert _request(f"{server}/csrf-token?client=page", headers={**rebinding, **wrong})[0] == 401
    status, _, token = _request(f"{server}/csrf-token?client=me",
                                headers={"Host": "evil.example", **_basic(prefect.auth)})  # fmt: skip
    assert status == 200 and b"token" in token
    status, _, settings = _request(f"{prefect.url}/ui-settings")
    assert status == 200 and json.loads(settings)["auth"] == "BASIC"
    assert json.loads(settings)["api_url"] == server  # the UI calls this port, not :4200


def test_the_auth_string_goes_only_to_a_server_that_asks_for_it(prefect):
    """`rcgrpo run` looks for `rcgrpo ui`'s server on its port: it sends the machine's auth
    string only to a server of this user that refuses requests without it. A stand-in that
    answers 200 to everything (what a server planted on 4200 would do) never sees it."""
    import http.server
    import threading

    home = prefect.log.parent
    port = int(prefect.url.rsplit(":", 1)[1])
    assert flow_server.prefect_api_running(port, home) == (f"{prefect.url}/api", prefect.auth)
    seen = []

    class Yes(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    fake = http.server.HTTPServer(("127.0.0.1", 0), Yes)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    try:
        assert flow_server.prefect_api_running(fake.server_address[1], home) is None
    finally:
        fake.shutdown()
    assert seen and not any(seen), seen  # asked, but never with the auth string


def test_websockets_need_the_auth_string_whatever_the_origin(prefect):
    """/api/events/in and /api/events/out took a foreign Origin, forged events and
    streamed flow-run events. Now the first message must carry the auth string."""
    import websockets

    base = prefect.url.replace("http://", "ws://") + "/api"

    async def attempt(path, token, origin="http://evil.example"):
        async with websockets.connect(base + path, subprotocols=["prefect"], origin=origin,
                                      open_timeout=30) as ws:  # fmt: skip
            await ws.send(json.dumps({"type": "auth", "token": token}))
            try:
                return json.loads(await asyncio.wait_for(ws.recv(), 30))["type"]
            except websockets.ConnectionClosed as e:
                return f"closed {e.rcvd.code}"

    async def all_of_them():
        out = {}
        for path in ("/events/in", "/events/out", "/logs/out"):
            out[path] = [await attempt(path, None), await attempt(path, "rcgrpo:guessed"),
                         await attempt(path, prefect.auth, origin=prefect.url)]  # fmt: skip
        return out

    for path, seen in asyncio.run(all_of_them()).items():
        assert seen == ["closed 1008", "closed 1008", "auth_success"], (path, seen)


def test_the_ui_logs_in_with_the_auth_string_in_a_real_browser(prefect, chromium):
    """The Prefect UI in headless Chromium: a login page first (the API answers 401), then,
    with the auth string typed in, the dashboard, whose API calls answer 200."""
    seen = _browse(chromium, prefect.url + "/", prefect.auth)
    print(f"before login: {' '.join(seen['before'].split())[:160]!r}; after: {seen['after_url']}; "
          f"API calls after login: {seen['api_after']}")  # fmt: skip
    assert "password" in seen["before"].lower() or "login" in seen["before"].lower(), seen
    assert "/v2/login" not in seen["after_url"], seen
    assert any(k.endswith("/api/admin/version") or "/api/" in k for k in seen["api_after"]), seen
    assert all(code == 200 for code in seen["api_after"].values()), seen
    assert seen["stored"], seen  # the UI keeps the login (localStorage prefect-password)


def _browse(chromium: str, url: str, auth: str) -> dict:
    """Drive headless Chromium (scripts/headless.py: over a pipe, no DevTools port): open `url`,
    read the page, type `auth` into its password field, submit, read again; the API responses
    are recorded."""
    spec = importlib.util.spec_from_file_location("headless", SCRIPTS / "headless.py")
    headless = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headless)
    api = {}

    def note(m):
        if m.get("method") == "Network.responseReceived":
            r = m["params"]["response"]
            if "/api/" in r["url"]:
                api[r["url"].split("?")[0]] = r["status"]

    with headless.Browser(chromium, on_event=note) as browser:

        def settle(seconds, until):
            end = time.monotonic() + seconds
            while time.monotonic() < end and until not in browser.text().lower():
                browser.pump(0.5)

        for domain in ("Network", "Runtime"):
            browser.cmd(f"{domain}.enable")
        browser.cmd("Page.navigate", url=url)
        settle(60, until="password")
        before = browser.js("document.location.href + ' ' + document.body.innerText") or ""
        api.clear()
        typed = """(() => { const i = document.querySelector('input[type=password]');
            if (!i) return 'no password field';
            Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(i, AUTH);
            i.dispatchEvent(new Event('input', {bubbles: true}));
            const b = [...document.querySelectorAll('button')].find(b => /log ?in/i.test(b.innerText))
              || document.querySelector('button[type=submit]');
            if (b) { b.click(); return 'clicked'; } i.closest('form').requestSubmit(); return 'sent';
          })()""".replace("AUTH", json.dumps(auth))
        browser.js(typed)
        settle(60, until="flow runs")
        return {"before": before, "after_url": browser.js("document.location.href"),
                "after": browser.text(), "api_after": dict(api),
                "stored": browser.js("localStorage.getItem('prefect-password')")}  # fmt: skip


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
    """`rcgrpo run` without `rcgrpo ui` runs its flows on Prefect's ephemeral server,
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

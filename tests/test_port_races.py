"""Another local user against the ports of the servers rcgrpo starts (tests/squatter.py: user
nobody when the tests run as root, else this user):

* `rcgrpo ui` checked its ports free, then its servers bound them seconds later: a squatter in
  between got the browser's MLflow login and Prefect auth string. Now the command binds both
  before either server starts and holds them: the squatter never gets a port, nor a byte;
* a command's own Prefect server had its port on its command line before binding it: a
  squatter took it and was sent the run's auth string. Now the server is handed the socket;
* with PREFECT_API_URL exported, `rcgrpo data build` sent the auth string to whoever listened
  on that port. Now a listener on this machine that is not this user's gets nothing, and the
  command stops in one line (vLLM's port: tests/test_vllm_servers.py).

    .venv/bin/pytest tests/test_port_races.py -q
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from squatter import Squatter, other_user, watch
from test_servers import PARENT, as_from_a_terminal
from test_ui import _free_port

from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow


def _get(url: str, auth: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_rcgrpo_ui_holds_its_ports_from_before_its_servers_start(tmp_path):
    mport, pport = _free_port(), _free_port()
    while pport == mport:
        pport = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow/mlflow.db"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "rcgrpo.cli", "ui", "--mlflow-port", str(mport),
           "--prefect-port", str(pport)]  # fmt: skip
    with Squatter() as squatter:
        proc = subprocess.Popen(as_from_a_terminal(cmd), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("starting the MLflow UI"):  # its checks are done: race it
                    squatter.take(mport)
                    squatter.take(pport)
                if "Ctrl-C stops both" in line:
                    break
            text = "".join(lines)
            assert "Ctrl-C stops both" in text, text
            # what the user's browser sends once it is told the URLs
            password = (tmp_path / "mlflow" / "ui-password").read_text().strip()
            login = "Basic " + base64.b64encode(f"rcgrpo:{password}".encode()).decode()
            status, page = _get(f"http://127.0.0.1:{mport}/", login)
            auth = (tmp_path / "prefect" / "rcgrpo-api-auth").read_text().strip()
            basic = "Basic " + base64.b64encode(auth.encode()).decode()
            answer = _get(f"http://127.0.0.1:{pport}/api/admin/version", basic)
            time.sleep(1.0)  # what the squatter was sent has been read
            assert squatter.took() == [] and squatter.seen() == [], squatter.lines
            assert status == 200 and b"MLflow" in page  # the real servers answered
            assert answer[0] == 200 and answer[1].strip(b'"')[:1].isdigit(), answer
            assert "export PREFECT_API_URL" not in text  # never advised bare
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)


def test_a_commands_prefect_server_is_handed_its_socket(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"PREFECT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(project_root() / "src")}
    with Squatter() as squatter:
        proc = subprocess.Popen([sys.executable, "-P", "-c", PARENT], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        stop = threading.Event()
        watch(proc.pid, squatter, stop)  # every port named on a command line below it
        try:
            seen = json.loads(proc.stdout.readline())
            assert seen["result"] == 1  # the flow ran against its own server
            time.sleep(1.0)
            assert squatter.took() == [] and squatter.seen() == [], squatter.lines
        finally:
            stop.set()
            proc.kill()
            proc.wait()


EXPORTED = """
import contextlib
from rcgrpo.runtime import apply_defaults
apply_defaults()
from prefect import flow
from rcgrpo.flow_server import prefect_for_flows

@flow(name="probe")
def probe():
    return 1

with contextlib.ExitStack() as stack:  # what `rcgrpo data build` does first
    prefect_for_flows(stack)
    probe()
"""


def test_an_exported_prefect_api_url_held_by_another_user_gets_nothing(tmp_path):
    if not other_user():
        pytest.skip("needs root with setpriv to listen as another user (see the next test)")
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(project_root() / "src"),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_API_AUTH_STRING": "rcgrpo:the-machines-auth-string"}  # fmt: skip
    with Squatter() as squatter:
        squatter.take(port)
        deadline = time.monotonic() + 60
        while port not in squatter.took() and time.monotonic() < deadline:
            time.sleep(0.1)
        out = subprocess.run([sys.executable, "-P", "-c", EXPORTED], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        time.sleep(1.0)
        assert squatter.seen() == [], squatter.seen()  # not one request, not the auth string
    assert out.returncode != 0
    said = out.stderr.strip().splitlines()[-1]
    assert said.startswith(
        f"rcgrpo.servers.ServerError: PREFECT_API_URL=http://127.0.0.1:{port}/api: port {port} "
        "is held by "
    ), said
    assert "not by a server of yours: nothing was sent to it" in said


def test_the_exported_url_check_compares_the_listeners_user(monkeypatch):
    """The same check in this process, the listener's user made another by the test (a second
    user cannot be created without root): refused; a remote host is the user's to vouch for."""
    import socket

    from rcgrpo import flow_server
    from rcgrpo.servers import ServerError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}/api"
        assert flow_server.checked_api_url(url) == url  # this user's listener
        uid = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)
        with pytest.raises(ServerError, match="not by a server of yours"):
            flow_server.checked_api_url(url)
        with pytest.raises(ServerError):
            flow_server.checked_api_url(url.replace("127.0.0.1", "localhost"))
    assert flow_server.checked_api_url("https://prefect.example.org/api")  # not this machine

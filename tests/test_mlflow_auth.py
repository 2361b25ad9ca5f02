"""The MLflow UI of `rcgrpo ui` is its user's alone (rcgrpo.mlflow_ui), probed against a started
server as a real second local user: `setpriv --reuid nobody` running curl, the way another user
of the machine would try it. The assistant config, run search, run delete and model-version
delete are refused and change nothing; a private-prefix rebinding Host is refused even with the
login; the logged-in user still reads the runs. Skipped, saying why, where the test cannot
switch users (not root, or no setpriv/curl). ~25 s on 2 cores.

    .venv/bin/pytest tests/test_mlflow_auth.py -q
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess

import pytest

from rcgrpo import mlflow_ui, servers

AS_NOBODY = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _curl(args: list[str], user: str = "") -> tuple[int, str]:
    """(HTTP status, body) of curl run as `user` ('' = this one)."""
    cmd = [
        *(AS_NOBODY if user == "nobody" else []),
        "curl",
        "-s",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "--max-time",
        "20",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/").stdout
    body, _, code = out.rpartition("\n")
    return int(code or 0), body


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A store with one run and model version rcgrpo/1 (written in-process, as the pipeline
    does), and the guarded UI on it."""
    from mlflow.tracking import MlflowClient

    store = tmp_path_factory.mktemp("mlflow_auth") / "mlflow"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)  # not a registry another test set
    exp = client.create_experiment("rcgrpo", artifact_location=str(store / "artifacts"))
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "reward/mean", 0.5)
    client.set_terminated(run.info.run_id)
    client.create_registered_model("rcgrpo")
    client.create_model_version("rcgrpo", str(store / "artifacts"), run.info.run_id)
    server = mlflow_ui.start_mlflow(store, _free_port(), log_dir=store.parent / "logs")
    try:
        servers.wait_ready([server], 180)
        yield server, store, client, run.info.run_id
    finally:
        servers.stop(server)


def test_guard_verdicts_by_hand():
    """Host first, then the login, then the assistant switch; /health open."""
    login = "rcgrpo:pw"
    guard = mlflow_ui.LoginGuard(None, login, {"127.0.0.1:5000"})
    ok = b"Basic " + base64.b64encode(login.encode())

    def scope(path, host=b"127.0.0.1:5000", auth=b"", method="GET"):
        return {
            "type": "http",
            "method": method,
            "path": path,
            "headers": [(b"host", host), (b"authorization", auth)],
        }

    assert guard.verdict(scope("/health")) == 0
    assert guard.verdict(scope("/health", host=b"10.evil.example:5000")) == 403
    assert guard.verdict(scope("/")) == 401
    assert guard.verdict(scope("/", auth=b"Basic " + base64.b64encode(b"rcgrpo:no"))) == 401
    assert guard.verdict(scope("/", auth=b"Basic !!!")) == 401
    assert guard.verdict(scope("/", auth=ok)) == 0
    assert guard.verdict(scope("/", host=b"192.168.attacker.example:5000", auth=ok)) == 403
    assert guard.verdict(scope(mlflow_ui.ASSISTANT + "/config", auth=ok, method="PUT")) == 403
    on = mlflow_ui.LoginGuard(None, login, {"127.0.0.1:5000"}, assistant=True)
    assert on.verdict(scope(mlflow_ui.ASSISTANT + "/config", auth=ok, method="PUT")) == 0


def test_password_file_is_private(tmp_path):
    secret = mlflow_ui.password(tmp_path)
    assert (
        len(secret) >= 24 and (tmp_path / mlflow_ui.PASSWORD_FILE).stat().st_mode & 0o777 == 0o600
    )
    (tmp_path / mlflow_ui.PASSWORD_FILE).chmod(0o644)
    assert mlflow_ui.password(tmp_path) == secret  # the same one, set back to 0600
    assert (tmp_path / mlflow_ui.PASSWORD_FILE).stat().st_mode & 0o777 == 0o600


def test_second_local_user_is_refused(ui):
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("curl"):
        pytest.skip("needs root with setpriv and curl to run the probes as user nobody")
    server, store, client, run_id = ui
    url, json_hdr = server.url, ["-H", "Content-Type: application/json"]
    assistant = json.dumps({"providers": {"claude_code": {"model": "x", "selected": True}}})
    probes = {
        "assistant config": [
            "-X",
            "PUT",
            *json_hdr,
            "-d",
            assistant,
            f"{url}/ajax-api/3.0/mlflow/assistant/config",
        ],
        "run search": ["-X", "POST", *json_hdr, "-d", "{}", f"{url}/api/2.0/mlflow/runs/search"],
        "run delete": [
            "-X",
            "POST",
            *json_hdr,
            "-d",
            json.dumps({"run_id": run_id}),
            f"{url}/api/2.0/mlflow/runs/delete",
        ],
        "model-version delete": [
            "-X",
            "DELETE",
            *json_hdr,
            "-d",
            json.dumps({"name": "rcgrpo", "version": "1"}),
            f"{url}/api/2.0/mlflow/model-versions/delete",
        ],
        "artifact read": [f"{url}/api/2.0/mlflow-artifacts/artifacts/x"],
    }
    for name, args in probes.items():
        code, body = _curl(args, user="nobody")
        assert code == 401, (name, code, body[:300])
    # the rebinding name with the right login (a page cannot have it, but even so): refused
    login = ["-H", f"Authorization: {mlflow_ui.basic_auth_header(store)}"]
    port = url.rsplit(":", 1)[1]
    for host in (f"10.evil.example:{port}", f"192.168.attacker.example:{port}"):
        code, _ = _curl(
            [*login, "-H", f"Host: {host}", f"{url}/api/2.0/mlflow-artifacts/artifacts"]
        )
        assert code == 403, host
    # a page on another localhost origin: its preflight carries no login and fails
    code, _ = _curl(
        [
            "-X",
            "OPTIONS",
            "-H",
            "Origin: http://localhost:8123",
            "-H",
            "Access-Control-Request-Method: PUT",
            f"{url}/ajax-api/3.0/mlflow/assistant/config",
        ]
    )
    assert code == 401
    # nothing changed; the user, logged in, still searches, and the assistant stays off
    assert client.get_run(run_id).info.lifecycle_stage == "active"
    assert client.get_model_version("rcgrpo", "1").status == "READY"
    code, body = _curl(
        [
            *login,
            "-X",
            "POST",
            *json_hdr,
            "-d",
            json.dumps({"experiment_ids": [client.get_experiment_by_name("rcgrpo").experiment_id]}),
            f"{url}/api/2.0/mlflow/runs/search",
        ]
    )
    assert code == 200 and run_id in body
    code, _ = _curl(
        [
            *login,
            "-X",
            "PUT",
            *json_hdr,
            "-d",
            assistant,
            f"{url}/ajax-api/3.0/mlflow/assistant/config",
        ]
    )
    assert code == 403
    assert not (store / "assistant").exists()

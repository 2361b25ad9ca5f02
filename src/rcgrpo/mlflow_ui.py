"""The MLflow UI of `rcgrpo ui`, for its user only: a login on every route, this host's names
only, the UI's own origin only, the assistant and the AI gateway off unless asked for.

Why not plain `mlflow ui` on 127.0.0.1: MLflow 3.17 answers every route without a login and
its assistant trusts any loopback client, so another local user could delete runs and model
versions, or select an assistant "provider" whose Bash tool calls then ran as us. Its default
Host allow-list also lets private-prefix names through (`10.*`, `192.168.*`, `172.16-31.*`), so
a rebinding web page could read artifacts.

MLflow's own `--app-name basic-auth` needs Flask-WTF (the `mlflow[auth]` extra) and a users'
database; it would still let the logged-in user reach the assistant. So, as for vLLM
(rcgrpo.rollout.vllm_guard), the server is MLflow's own FastAPI app under a guard of ours:
`uvicorn --factory rcgrpo.mlflow_ui:create_app`, started with the settings `mlflow server`
would give it (store URIs, served artifacts, `--allowed-hosts 127.0.0.1:<port>,localhost:<port>`
and CORS for those two origins, jobs off). The guard, before MLflow sees a request:
- a Host header other than those two -> 403;
- no HTTP Basic login `rcgrpo:<password>` -> 401 with `WWW-Authenticate` (the browser asks for
  it once; scripts send `basic_auth_header`); only `GET /health` is open;
- the assistant routes -> 403 unless RCGRPO_MLFLOW_ASSISTANT=1; the gateway is off through
  MLFLOW_ENABLE_AI_GATEWAY=false unless RCGRPO_MLFLOW_GATEWAY=1.
The password is random, new at each start, kept in <store>/ui-password (mode 0600).

The pipeline itself writes to the SQLite store in-process; none of this is in its way.

    rcgrpo ui                                   # prints the user and the password file
    server = start_mlflow(store, port=5000); ...; rcgrpo.servers.stop(server)
    .venv/bin/pytest tests/test_mlflow_auth.py -q
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import uuid
from pathlib import Path

from rcgrpo.owned import private_dir
from rcgrpo.runtime import apply_defaults
from rcgrpo.servers import HOST, Server, _logs, _spawn, listen, url_of, uvicorn

USER = "rcgrpo"
PASSWORD_FILE = "ui-password"  # in the store folder, mode 0600
OPEN = {"/health"}  # liveness, answered without the login (GET/HEAD only)
ASSISTANT = "/ajax-api/3.0/mlflow/assistant"


def password(store: Path, new: bool = False) -> str:
    """The UI password of `store` (made on first use, 0600 from the first byte; a copy others
    could read is set back to 0600). `new`: replace it (each UI start: a browser tab left open
    after the UI stopped sends the old one to whoever listens on the port next)."""
    path = Path(store) / PASSWORD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if new:  # written beside it, 0600 from the first byte, then put in its place
        tmp = path.with_name(f".{PASSWORD_FILE}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        _write_new(tmp)
        os.replace(tmp, path)
    elif not path.exists():
        with contextlib.suppress(FileExistsError):  # another start made it first
            _write_new(path)
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    return path.read_text().strip()


def _write_new(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(24) + "\n")


def basic_auth_header(store: Path) -> str:
    """The `Authorization` header value that logs a script in to the UI of `store`."""
    return "Basic " + base64.b64encode(f"{USER}:{password(store)}".encode()).decode()


class LoginGuard:
    """ASGI middleware: Host allow-list, HTTP Basic login, assistant off (see the module)."""

    def __init__(self, app, login: str, hosts: set[str], assistant: bool = False):
        self.app, self.hosts, self.assistant = app, {h.lower() for h in hosts}, assistant
        self.digest = hashlib.sha256(login.encode()).digest()

    def verdict(self, scope) -> int:
        """0 to pass the request on, else the status to answer with."""
        headers = dict(scope.get("headers") or [])
        if headers.get(b"host", b"").decode("latin-1").lower() not in self.hosts:
            return 403  # DNS rebinding: a name that is not this server's
        path = scope["path"]
        if scope["type"] == "http" and scope.get("method") in ("GET", "HEAD") and path in OPEN:
            return 0
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        try:
            given = base64.b64decode(token, validate=True)
        except ValueError:
            given = b""
        ok = hmac.compare_digest(hashlib.sha256(given).digest(), self.digest)
        if scheme.lower() != "basic" or not ok:
            return 401
        return 403 if path.startswith(ASSISTANT) and not self.assistant else 0

    async def __call__(self, scope, receive, send):
        status = self.verdict(scope) if scope["type"] in ("http", "websocket") else 0
        if not status:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        headers = [(b"content-type", b"application/json")]
        if status == 401:  # the browser's login prompt
            headers.append((b"www-authenticate", b'Basic realm="rcgrpo MLflow", charset="UTF-8"'))
        body = b'{"error": "Unauthorized"}' if status == 401 else b'{"error": "Forbidden"}'
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def create_app():
    """The server process's app (uvicorn --factory): MLflow's stores initialised as `mlflow
    server` does before it starts uvicorn, then its FastAPI app under the guard."""
    from mlflow.server.constants import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR
    from mlflow.server.handlers import initialize_backend_stores

    uri = os.environ[BACKEND_STORE_URI_ENV_VAR]
    initialize_backend_stores(uri, uri, os.environ[ARTIFACT_ROOT_ENV_VAR])
    from mlflow.server.fastapi_app import app

    store = Path(os.environ["RCGRPO_MLFLOW_STORE"])
    hosts = set(os.environ["MLFLOW_SERVER_ALLOWED_HOSTS"].split(","))
    assistant = os.environ.get("RCGRPO_MLFLOW_ASSISTANT") == "1"
    return LoginGuard(app, f"{USER}:{password(store)}", hosts, assistant)


def start_mlflow(store: Path, port: int = 5000, log_dir: Path | None = None, sock=None) -> Server:
    """The MLflow UI on <store>/mlflow.db and <store>/artifacts, behind the guard (see above),
    on `sock` (default: rcgrpo.servers.listen(port): bound by this process, handed over)."""
    apply_defaults()
    store = private_dir(Path(store).resolve())  # the runs are the user's alone (0700)
    sock = sock or listen(port, "--mlflow-port")
    port = sock.getsockname()[1]
    password(store, new=True)  # a fresh one per start, made before the server reads it
    url = url_of(sock)
    db = f"sqlite:///{store / 'mlflow.db'}"
    env = {
        **os.environ,
        "RCGRPO_MLFLOW_STORE": str(store),
        # what `mlflow server --serve-artifacts --artifacts-destination ...` sets for its app
        "_MLFLOW_SERVER_FILE_STORE": db,
        "_MLFLOW_SERVER_REGISTRY_STORE": db,
        "_MLFLOW_SERVER_ARTIFACT_ROOT": "mlflow-artifacts:/",
        "_MLFLOW_SERVER_SERVE_ARTIFACTS": "true",
        "_MLFLOW_SERVER_ARTIFACT_DESTINATION": str(store / "artifacts"),
        "_MLFLOW_SGI_NAME": "uvicorn",
        "_MLFLOW_SERVER_BOOT_ID": uuid.uuid4().hex,
        "MLFLOW_ENABLE_WORKSPACES": "false",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_SERVER_ALLOWED_HOSTS": f"{HOST}:{port},localhost:{port}",
        "MLFLOW_SERVER_CORS_ALLOWED_ORIGINS": f"{url},http://localhost:{port}",
        "MLFLOW_ENABLE_AI_GATEWAY": "true" if os.environ.get("RCGRPO_MLFLOW_GATEWAY") else "false",
    }
    src = str(Path(__file__).resolve().parents[1])  # --app-dir: never the working directory
    cmd = uvicorn(
        src, "rcgrpo.mlflow_ui:create_app", sock, "--workers", "1", "--log-level", "warning"
    )
    return _spawn("MLflow UI", cmd, env, "/health", _logs(log_dir) / "mlflow-ui.log", sock)

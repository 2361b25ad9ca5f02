"""The episode schedulers (rcgrpo.rollout.scheduler) on the CPU with the HF engine: async gives the
lock-step rollouts bit for bit, respects rollout.max_in_flight, runs tool calls of different
episodes at once in the sandbox pool, the local backend runs one call (no shards one after the
other), an RL step logs the engine's metrics; the router and the config's server layout.

    .venv/bin/pytest tests/test_scheduler.py -q
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from rcgrpo.bfcl.tasks import get_task, tasks_in
from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.engine import Engine, Sample
from rcgrpo.rollout.execution import make_engine
from rcgrpo.rollout.router import Router
from rcgrpo.rollout.scheduler import Flight

# bfcl protocol: several messages per episode (rounds); max_batch 3 < 6 episodes: 2 batches a round
CFG = RolloutConfig(protocol="bfcl", max_new_tokens=12, max_total_tokens=1500, max_batch=3)


@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig(profile="tiny"))


@pytest.fixture(scope="module")
def tasks():
    return tasks_in("train")[::90][:6]  # across the four categories


def run(policy, tasks, **kw):
    engine = make_engine(replace(CFG, **kw), policy, BFCL)
    return engine, engine.rollout(tasks, [HIGH, LOW] * 3, seed=7)


def same(a, b):
    assert [r.ids for r in a] == [r.ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    assert [r.mask for r in a] == [r.mask for r in b]
    assert [(r.reward, r.stop_reason, r.calls) for r in a] == [
        (r.reward, r.stop_reason, r.calls) for r in b
    ]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_async_gives_the_lockstep_rollouts_bit_for_bit(policy, tasks, temperature):
    lock_engine, lock = run(policy, tasks, scheduler="lockstep", temperature=temperature)
    async_engine, out = run(policy, tasks, scheduler="async", temperature=temperature)
    same(out, lock)
    assert max(sum(m["role"] == "assistant" for m in r.messages) for r in out) >= 2  # rounds
    for key in ("rollout/prompt_tokens", "rollout/prefill_tokens", "rollout/prefix_cache_hit_rate"):
        assert async_engine.last_stats[key] == lock_engine.last_stats[key]
    assert 0 < async_engine.last_stats["rollout/prefix_cache_hit_rate"] < 1  # K/V reused
    assert async_engine.last_stats["perf/in_flight_max"] == len(tasks)  # all at once


def test_max_in_flight_bounds_the_episodes_in_flight(policy, tasks):
    _, lock = run(policy, tasks, scheduler="lockstep", temperature=0.0)
    engine, out = run(policy, tasks, scheduler="async", temperature=0.0, max_in_flight=2)
    assert engine.in_flight_max == 2
    # smaller rounds: other batch shapes, the same greedy ids
    assert [r.ids for r in out] == [r.ids for r in lock]


def test_flight_hands_a_finished_slot_to_the_next_episode():
    flight = Flight(n=5, max_in_flight=2)
    assert (flight.active, flight.next) == (2, 2)  # episodes 0 and 1 handed out by the caller
    assert flight.claim(finished=True) == 2 and flight.active == 2  # never dips in between
    assert flight.claim(finished=True) == 3 and flight.claim(finished=True) == 4
    assert flight.claim(finished=True) is None and flight.active == 1
    flight.fail(RuntimeError("boom"))
    assert flight.claim(finished=True) is None and flight.active == 0


class Scripted(Engine):
    """Answers each prompt with the next text of `script` (real tokenizer ids): the test looks at
    the scheduler, agent loop and tool sandboxes, which are real."""

    def __init__(self, cfg, policy, script):
        super().__init__(cfg, policy, BFCL)
        self.texts = script
        self.script = [self.renderer.encode(t) + [policy.stop_id] for t in script]

    def sync(self, policy):
        pass

    def generate(self, prompts, max_new, seeds, episodes=None):
        out = []
        for prompt in prompts:  # the script's messages already in the prompt: its step
            step = self.renderer.decode(prompt).count(self.texts[0])
            ids = self.script[min(step, len(self.script) - 1)]
            out.append(Sample(list(ids), [0.0] * len(ids)))
        return out


def test_tool_calls_of_different_episodes_run_at_once(policy, monkeypatch):
    """Four episodes each make a slow MathAPI call (~0.4 s, 10^(10^6) digits) then done(): async
    runs them in two sandbox processes at the same time; lock-step runs every call in one."""
    from rcgrpo.bfcl import sandbox

    calls: list[tuple[int, float, float]] = []  # (worker pid, start, end) per tool request
    lock, run_step = threading.Lock(), sandbox.Sandbox.run_step

    def timed(self, *args, **kw):
        start = time.perf_counter()
        out = run_step(self, *args, **kw)
        with lock:
            calls.append((self.pid(), start, time.perf_counter()))
        return out

    monkeypatch.setattr(sandbox.Sandbox, "run_step", timed)
    math_tasks = [get_task(f"multi_turn_base_{n}") for n in (15, 28, 31, 32)]
    script = ["power(base=10, exponent=1000000)", "done()"]
    results = {}
    for name in ("lockstep", "async"):
        cfg = RolloutConfig(max_new_tokens=32, max_total_tokens=4000, scheduler=name,
                            tool_workers=2)  # fmt: skip
        calls.clear()
        results[name] = Scripted(cfg, policy, script).rollout(math_tasks, HIGH, seed=0)
        pids = {pid for pid, _, _ in calls}
        overlap = any(a[0] != b[0] and a[1] < b[2] and b[1] < a[2] for a in calls for b in calls)
        assert (len(pids), overlap) == ((1, False) if name == "lockstep" else (2, True)), calls
    for a, b in zip(results["async"], results["lockstep"], strict=True):
        assert a.messages == b.messages and a.stop_reason == b.stop_reason == "done"
        assert "power" in a.calls[0][0][0]


def test_an_engine_error_ends_the_rollout_instead_of_hanging(policy, tasks):
    class Failing(type(make_engine(CFG, policy, BFCL))):
        def generate(self, prompts, max_new, seeds, episodes=None):
            if self.generated_tokens:  # the second round: a fault (e.g. out of GPU memory)
                raise MemoryError("out of memory in round 2")
            return super().generate(prompts, max_new, seeds, episodes)

    engine = Failing(replace(CFG, max_batch=64), policy, BFCL)
    with pytest.raises(MemoryError, match="round 2"):
        engine.rollout(tasks, HIGH, seed=0)


def test_local_backend_runs_the_whole_call_at_once(policy, tasks):
    """execution.shard_size no longer cuts a local rollout into shards run one after another."""
    from rcgrpo.rollout.execution import ExecutionConfig, RolloutSpec, session

    with session(ExecutionConfig(shard_size=2)) as backend:
        engine = backend.engine(policy, RolloutSpec(policy.config, None, CFG, BFCL), group=2)
        out = engine.rollout(tasks, [HIGH, LOW] * 3, seed=7)
    assert engine.local.in_flight_max == len(tasks)
    assert engine.last_stats == engine.local.last_stats and engine.last_stats
    _, lock = run(policy, tasks, scheduler="lockstep")
    same(out, lock)


def test_an_rl_step_logs_the_engine_metrics(policy, tmp_path):
    import copy

    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    trained = copy.deepcopy(policy)
    cfg = RLConfig(tasks_per_step=2, group_size=2, steps=1, lr=1e-3, save_every=0,
                   micro_batch_size=4, kl_coef=0.0, out_dir=str(tmp_path))  # fmt: skip
    (metrics,) = Trainer(
        trained,
        make_engine(CFG, trained, BFCL),
        tasks_in("train")[:4],
        cfg,
        BFCL.scorer(cfg.protocol),
    ).train()
    assert metrics["rollout/prompt_tokens"] >= metrics["rollout/prefill_tokens"] > 0
    assert 0 <= metrics["rollout/prefix_cache_hit_rate"] < 1
    assert 0 < metrics["perf/engine_busy_frac"] <= 1 and metrics["perf/in_flight_max"] == 4


def test_router_sends_first_turns_to_the_least_loaded_server_then_sticks():
    router = Router(2)
    assert router.acquire(episode=0) == 0  # both idle: the lowest index
    assert router.acquire(episode=1) == 1  # server 0 has one in progress
    assert router.acquire(episode=2) == 0  # 1 : 1, lowest index
    router.release(0)
    router.release(0)  # server 0 idle, server 1 has episode 1's request
    assert router.acquire(episode=1) == 1  # a later turn stays, though server 0 is idle
    assert router.acquire(episode=3) == 0
    router.forget(1)
    assert router.acquire(episode=1) == 0  # forgotten: routed afresh (0 has 1, 1 has 2)
    assert router.served == [4, 2] and router.load == [2, 2]


def test_server_layout_from_the_config():
    assert RolloutConfig(vllm_servers=2).server_devices([]) == [None, None]  # CPU: no devices
    two_tp = RolloutConfig(vllm_servers=2, tensor_parallel_size=2)
    assert two_tp.server_devices(["0", "1", "2", "3"]) == ["0,1", "2,3"]
    with pytest.raises(ValueError, match="needs 4 GPUs, 3 visible"):
        two_tp.server_devices(["0", "1", "2"])
    listed = RolloutConfig(vllm_devices=("1", "2", "3"))
    assert listed.n_servers == 3 and listed.server_devices(["0", "1", "2", "3"]) == ["1", "2", "3"]
    with pytest.raises(ValueError, match="lists 1 GPU"):
        RolloutConfig(vllm_devices=("1",), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="one server per device entry"):
        RolloutConfig(vllm_devices=("1", "2"), vllm_servers=3)
    with pytest.raises(
        ValueError, match="RolloutConfig.scheduler=continuous: must be one of async"
    ):
        RolloutConfig(scheduler="continuous")


def test_config_ranges_are_checked_before_anything_runs():
    from rcgrpo.config import ConfigError, build

    with pytest.raises(ConfigError, match=r"max_in_flight=0: must be in \[1, inf\)"):
        build(RolloutConfig, {"max_in_flight": 0}, "params.yaml:rollout")
    with pytest.raises(ConfigError, match="vllm_servers"):
        build(RolloutConfig, {"vllm_servers": 0}, "params.yaml:rollout")


def test_prometheus_text_is_summed_over_label_sets():
    from rcgrpo.rollout.call_stats import parse_metrics

    text = (
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.\n"
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="base"} 640.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="policy-v1"} 128.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="base"} 1400.0\n'
        "vllm:num_requests_running 3\n"
    )
    assert parse_metrics(text) == {
        "vllm:prefix_cache_hits_total": 768.0,
        "vllm:prefix_cache_queries_total": 1400.0,
        "vllm:num_requests_running": 3.0,
    }


def test_a_ranks_one_server_runs_on_the_ranks_gpu(monkeypatch):
    """One process per GPU (rcgrpo run --procs): the default one server follows the engine's
    device through CUDA_VISIBLE_DEVICES; an explicit layout (vllm_devices, several servers,
    tensor parallelism) is taken as configured."""
    from types import SimpleNamespace

    from rcgrpo.rollout.vllm_engine import VLLMEngine

    def devices(device, **kw):
        return VLLMEngine.server_devices(SimpleNamespace(cfg=RolloutConfig(**kw), device=device))

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr("shutil.which", lambda name: None)  # no nvidia-smi: no visible GPUs
    assert devices("cuda:1") == ["3"]  # rank 1 of 2 on physical GPU 3, not GPU 0
    assert devices("cuda") == ["2"]
    assert devices("cuda:1", vllm_devices=("5",)) == ["5"]  # as configured
    assert devices("cpu") == [None]
    assert devices("cuda:0", vllm_servers=2) == [None, None]  # the config's layout (no GPUs)


def test_engine_metrics_of_shards_and_ranks_are_merged_by_hand_values():
    from rcgrpo.rollout.call_stats import merge_stats

    parts = [
        {"rollout/prompt_tokens": 1000.0, "rollout/prefill_tokens": 400.0,
         "perf/engine_busy_frac": 0.5, "perf/in_flight_max": 8.0, "rollout/episode_errors": 1.0,
         "rollout/tool_workers_replaced": 2.0},
        {"rollout/prompt_tokens": 3000.0, "rollout/prefill_tokens": 600.0,
         "perf/engine_busy_frac": 0.9, "perf/in_flight_max": 12.0, "rollout/episode_errors": 2.0},
    ]  # fmt: skip
    assert merge_stats(parts) == {
        "rollout/prompt_tokens": 4000.0,
        "rollout/prefill_tokens": 1000.0,
        "rollout/prefix_cache_hit_rate": 0.75,  # 1 - 1000 / 4000, not the mean 0.7 of 0.6, 0.8
        "perf/engine_busy_frac": 0.7,
        "perf/in_flight_max": 12.0,
        "rollout/episode_errors": 3.0,
        "rollout/tool_workers_replaced": 2.0,  # a part without it (a rank of no tool calls): 0
    }
    assert merge_stats([]) == {}

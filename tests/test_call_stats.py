"""What a rollout call cost, by hand: per vLLM server from two /metrics snapshots, the totals,
and the vLLM server's arguments for a rollout config.

    .venv/bin/pytest tests/test_call_stats.py -q
"""

from __future__ import annotations

from pathlib import Path

from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.call_stats import per_server, totals
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.vllm_args import server_args

Q, H, P = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
)


def test_two_servers_figures_are_the_differences_of_their_counters():
    before = {"metrics": [{Q: 100, H: 40, P: 100}, {}], "busy": [1.0, 0.0], "served": [3, 0]}
    after = {
        "metrics": [{Q: 300, H: 190, P: 300}, {Q: 100, H: 0, P: 100}],
        "busy": [3.0, 1.0],
        "served": [7, 2],
    }
    servers = per_server(before, after, wall=4.0)
    assert servers == [
        {"busy_frac": 0.5, "requests": 4, "queries": 200, "hits": 150, "prompt_tokens": 200},
        {"busy_frac": 0.25, "requests": 2, "queries": 100, "hits": 0, "prompt_tokens": 100},
    ]
    assert totals(servers) == {
        "rollout/prefill_tokens": 150,  # 300 queried - 150 hit
        "rollout/prefix_cache_hit_rate": 0.5,
        "perf/engine_busy_frac": 0.375,
    }
    assert per_server(before, after, wall=0.0)[0]["busy_frac"] == 0.0  # an empty call


def test_server_args_serve_lora_at_an_allowed_rank_and_gpu_memory_only_on_cuda():
    cfg = RolloutConfig(max_total_tokens=1000, max_new_tokens=24, vllm_max_num_seqs=4)
    model = ModelConfig(profile="tiny", lora=True, lora_r=4, dtype="float32")
    args = server_args(cfg, model, Path("/x/base"), "base", lora=True, on_cuda=False)
    value = lambda flag: args[args.index(flag) + 1]  # noqa: E731
    assert value("--max-model-len") == "1024" and value("--tokenizer") == "/x/base"
    assert value("--max-lora-rank") == str(cfg.served_lora_rank(4)) and "--max-loras" in args
    assert "--gpu-memory-utilization" not in args
    full = server_args(cfg, model, Path("/x/base"), "base", lora=False, on_cuda=True)
    assert "--enable-lora" not in full and "--gpu-memory-utilization" in full

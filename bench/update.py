"""Benchmark (not a test): one RL update with each group's shared prompt computed once, against
the same update unshared (`rl.shared_prefix` true / false), on replayed BFCL episodes.

What: `--tasks` tasks of each of the four categories (base, miss_func, miss_param,
long_context), G = 5 rollouts each with RC-GRPO goals (<|high_reward|> / <|low_reward|> drawn
i.i.d. at p = 0.5, so most groups differ in the goal and share the prompt up to it). Each
rollout is the task's ground truth replayed through the agent loop (rcgrpo.data.ceiling.replay,
the qwen-shape tokenizer, full JSON tool docs, the combined protocol: real prompts and tool
observations) with its sampled tokens redrawn at random per rollout, as G samples differ.
The model: Qwen2 architecture at hidden 512, 4 layers, 8 query / 2 key-value heads, MLP 2752
(Qwen2.5-7B's ratios), the qwen-shape vocabulary (152,064 rows, untied head), LoRA r = 16 as
the 7B profiles: wide enough that the decoder layers, not the Python around them, take the
time on the CPU. The update: pi_old and the reference (a frozen LoRA adapter) log-probs, then
forward + backward of the PPO/KL loss and one AdamW step (rcgrpo.training.grpo.update), over
token-budget micro-batches (`--max-tokens`; unshared: sorted by length, padded; shared: whole
groups, the budget counting the tokens the shared forward computes). Both sides run in this
process on a fresh copy of the same model; each prints seconds, computed tokens (through the
decoder, every forward) and peak memory (VmHWM - VmRSS before it, after a peak reset), and the
loss, which must agree (1e-4). Last lines: `shared/unshared peak memory: Y` (target <= 1.0)
and `shared/unshared update time: X` (target <= 0.65).

With `--against REF`: instead, the update of this checkout against the same update at commit
REF, built in a temporary git worktree and run in the same bench (bench/update_against.py):
`update time HEAD/REF: X`, so a slowdown between commits is caught (docs/benchmarks.md).

    OMP_NUM_THREADS=2 .venv/bin/python bench/update.py                # ~5-15 min on 2 cores
    .venv/bin/python bench/update.py --tasks 1 --threads 2 --layers 2  # a quicker look
    .venv/bin/python bench/update.py --against 007baed                # ~15 min on 2 cores
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from memory import status_kb  # bench/memory.py: /proc/self/status fields

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
GB = 1e9


def episodes(tasks_per_category: int, group: int, seed: int):
    """Rollouts (ids, loss_mask, logprobs), group-major, and the tokenizer's vocabulary size."""
    from rcgrpo.bfcl.tasks import load_tasks
    from rcgrpo.chat.prompts import Renderer
    from rcgrpo.chat.record import HIGH, LOW
    from rcgrpo.data.ceiling import replay
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import PROFILES, ModelConfig
    from rcgrpo.rollout.agent_loop import Limits
    from rcgrpo.training.grpo.core_algos import sample_reward_tokens

    profile = PROFILES["qwen-shape"]
    policy = load_policy(ModelConfig(profile="qwen-shape"))
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    limits = Limits(profile.max_new_tokens, profile.max_total_tokens, 20)
    by_id = load_tasks()
    tasks = [
        t
        for c in CATEGORIES
        for t in sorted((t for t in by_id.values() if t.category == c), key=lambda t: t.number)[
            :tasks_per_category
        ]
    ]
    g = torch.Generator().manual_seed(seed)
    high = sample_reward_tokens(len(tasks), group, 0.5, "iid", g)  # (n, G)
    vocab = policy.model.config.vocab_size
    out = []
    for task, goals in zip(tasks, high.tolist(), strict=True):
        for h in goals:
            rollout, _ = replay(task, renderer, "combined", limits, False, HIGH if h else LOW)
            ids = torch.tensor(rollout.ids)
            mask = torch.as_tensor(rollout.loss_mask, dtype=torch.float32)
            sampled = mask.bool()  # redrawn: G samples of one prompt differ
            ids[sampled] = torch.randint(0, vocab, (int(sampled.sum()),), generator=g)
            out.append(SimpleNamespace(ids=ids.tolist(), loss_mask=mask, logprobs=mask * 0))
    return out, policy


def bench_model(vocab: int, hidden: int, layers: int, seed: int):
    """The Qwen2 of the docstring with the project's LoRA (B non-zero: a trained adapter)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rcgrpo.models.lora import apply_lora
    from rcgrpo.models.profiles import ModelConfig

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 43 // 8,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256),
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    )
    base = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model = apply_lora(base, ModelConfig(profile="qwen-shape", train_reward_rows=False), [])
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(seed))
    model.training_attention = "sdpa"
    return model.eval(), cfg


def one_update(rollouts, model, shared: bool, max_tokens: int, group: int) -> dict:
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.training.balance import model_coef
    from rcgrpo.training.grpo import update
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.core_algos import minibatch_indices
    from rcgrpo.training.grpo.trainer import Trainer
    from rcgrpo.training.shared_prefix import forward_metrics

    n = len(rollouts)
    cfg = RLConfig(
        tasks_per_step=n // group,
        group_size=group,
        micro_batch_size=n,
        max_tokens_per_micro_batch=max_tokens,
        shared_prefix=shared,
    )
    batch = update.to_batch(rollouts)
    lengths = [len(r.ids) for r in rollouts]
    sampled = [int(r.loss_mask.sum()) for r in rollouts]
    rows = [r.ids for r in rollouts] if shared else None  # shared: the budget counts computed
    coef = model_coef(model)  # the shared clusters weigh attention as the trainer's do
    passes = minibatch_indices(n, 0, n, 1, None, lengths, max_tokens, False, sampled, 0, rows, coef)
    adv = torch.randn(n, generator=torch.Generator().manual_seed(1))
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    base = status_kb("VmRSS")
    t0 = time.perf_counter()
    trainer = Trainer(
        SimpleNamespace(model=model), None, [], cfg, BFCL.scorer(cfg.protocol), temperature=1.0
    )
    assert trainer.shared == shared
    first = [c for mini in passes[0] for c in mini]
    old, ref, _ = update.behaviour_logprobs(
        model, batch, first, trainer._logprobs, 1.0, trainer._ref_logprobs
    )
    ups = update.ppo_updates(
        model,
        trainer.optimizer,
        trainer.ranks,
        batch,
        old,
        ref,
        adv,
        passes,
        cfg,
        trainer._logprobs,
    )
    seconds = time.perf_counter() - t0
    tokens = forward_metrics(batch.ids, lengths, passes, False, shared, coef)
    # forwards: pi_old, the reference, the PPO pass (its backward not counted)
    return {
        "s": seconds,
        "tokens": 3 * tokens["perf/update_tokens"],
        "peak_gb": (status_kb("VmHWM") - base) * 1024 / GB,
        "loss": ups[0]["total"],
        "micro_batches": len(first),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1, help="tasks per category (G rollouts each)")
    ap.add_argument("--group", type=int, default=5, help="G, rollouts per task")
    ap.add_argument("--hidden", type=int, default=512, help="model width (heads of 64)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers")
    ap.add_argument("--max-tokens", type=int, default=40960, help="micro-batch token budget")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: 2; --against: 1)")
    ap.add_argument("--seed", type=int, default=0, help="goals, redrawn tokens, weights")
    # against an earlier commit (bench/update_against.py): the CPU default's update, HEAD vs REF
    ap.add_argument("--against", metavar="REF", help="time HEAD's update against commit REF's")
    ap.add_argument("--repeats", type=int, default=3, help="--against: HEAD/REF pairs")
    ap.add_argument("--steps", type=int, default=2, help="--against: updates per process")
    args = ap.parse_args()
    from rcgrpo.runtime import apply_defaults

    apply_defaults()  # caches (tiktoken's for the qwen-shape tokenizer) in cache/, not /tmp
    args.threads = args.threads or (1 if args.against else 2)
    if args.against:
        from update_against import against  # bench/update_against.py

        against(args.against, args.repeats, args.steps, args.threads, [])
        return
    torch.set_num_threads(args.threads)
    rollouts, policy = episodes(args.tasks, args.group, args.seed)
    vocab = policy.model.config.vocab_size
    del policy
    lengths = [len(r.ids) for r in rollouts]
    print(
        f"{len(rollouts)} rollouts ({args.tasks} task(s) x 4 categories x G = {args.group}), "
        f"tokens {min(lengths)}-{max(lengths)}, sum {sum(lengths)}; Qwen2 hidden {args.hidden}, "
        f"{args.layers} layers, vocab {vocab}, LoRA; {args.threads} threads"
    )
    res = {}
    for shared in (False, True):
        model, _ = bench_model(vocab, args.hidden, args.layers, args.seed)
        res[shared] = r = one_update(rollouts, model, shared, args.max_tokens, args.group)
        del model
        side = "shared  " if shared else "unshared"
        print(
            f"{side}: {r['s']:7.1f} s  {r['tokens'] / 1e3:8.1f}k computed tokens  "
            f"peak {r['peak_gb']:5.2f} GB  loss {r['loss']:+.6f}  {r['micro_batches']} micro-batches"
        )
    gap = abs(res[True]["loss"] - res[False]["loss"])
    assert gap < 1e-4, f"the shared update's loss differs by {gap}"
    print(f"shared/unshared computed tokens: {res[True]['tokens'] / res[False]['tokens']:.3f}")
    print(f"shared/unshared peak memory: {res[True]['peak_gb'] / res[False]['peak_gb']:.3f}")
    print(f"shared/unshared update time: {res[True]['s'] / res[False]['s']:.3f}")


if __name__ == "__main__":
    main()

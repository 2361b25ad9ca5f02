"""Device probe: one RL update micro-batch of a random-init Qwen2.5-7B on one GPU, measured
against `rcgrpo plan`'s terms. Needs only torch, transformers, peft, pyyaml and src/ (no vLLM,
no hub, no bfcl-eval): the model is built from its config with random weights, the LoRA and the
log-prob / loss functions are the project's own (models/lora, training/grpo/update, head).

Per run: pi_old (no grad) and one PPO forward + backward over a micro-batch of --tokens tokens
with --share of them sampled, gradient checkpointing on, under training_attention (bf16 LoRA
compute). Printed: time, TFLOP/s (6 x params x tokens, the update's dense FLOPs), peak
allocated and reserved, and one line per plan term: plan vs measured. With --emulate GB the
same under torch.cuda.set_per_process_memory_fraction emulating that GPU with vLLM asleep and
awake (rollout.vllm_gpu_memory_utilization). On a machine without CUDA it runs on the CPU at
the width given and says so: memory figures need a GPU.

    .venv/bin/python scripts/gpu_update_probe.py --tokens 75264 --emulate 80          # H200
    .venv/bin/python scripts/gpu_update_probe.py --hidden 256 --layers 2 --tokens 512  # CPU smoke
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

GB = 1e9


def build(args, dev):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rcgrpo.models.lora import apply_lora
    from rcgrpo.models.profiles import ModelConfig

    heads = max(1, args.hidden // 128)
    cfg = Qwen2Config(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate or args.hidden * 37 // 7,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 7),
        head_dim=args.hidden // heads,
        vocab_size=152064,
        tie_word_embeddings=False,
    )
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model.gradient_checkpointing_enable({"use_reentrant": False})
    model.config.use_cache = False
    rows = [151_665, 151_666]  # the two reward-token rows in the padding, as load_policy adds
    return apply_lora(model, ModelConfig(profile="qwen2.5-7b-instruct"), rows).to(dev), cfg


def step(model, tokens, share, dev):
    """pi_old, then one PPO forward + backward: (seconds, peak allocated, peak reserved)."""
    from rcgrpo.training.forward import training_attention
    from rcgrpo.training.grpo.core_algos import policy_loss
    from rcgrpo.training.grpo.update import logprobs

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 151_643, (1, tokens), generator=g)
    attn = torch.ones_like(ids)
    mask = (torch.rand(1, tokens - 1, generator=g) < share).float()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with training_attention(model):
        model.eval()
        with torch.no_grad():
            old = logprobs(model, ids, attn, mask)[0]
        model.train()
        logp, sampled, where = logprobs(model, ids, attn, mask)
        loss, _ = policy_loss(logp, old, torch.tensor([1.0], device=dev), mask.to(dev), None)
        loss.backward()
    model.zero_grad(set_to_none=True)
    if dev.type != "cuda":
        return time.perf_counter() - t0, None, None
    torch.cuda.synchronize()
    return (
        time.perf_counter() - t0,
        torch.cuda.max_memory_allocated(),
        torch.cuda.max_memory_reserved(),
    )


def plan_terms(cfg, tokens, share):
    """What rcgrpo plan counts for this micro-batch's activations (qwen2.5-7b's measured layer)."""
    from rcgrpo.training.plan.constants import Arch
    from rcgrpo.training.plan.memory import measured_layer, update_terms

    arch = Arch(
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.vocab_size,
        False,
        "probe",
    )
    layer = measured_layer("qwen2.5-7b-instruct", "bfloat16")
    return arch, update_terms(arch, tokens, int(share * tokens), 2, True, layer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=3584, help="hidden size (7B: 3584)")
    ap.add_argument("--intermediate", type=int, default=18944, help="MLP size (7B: 18944)")
    ap.add_argument("--layers", type=int, default=28, help="decoder layers (7B: 28)")
    ap.add_argument("--tokens", type=int, default=75264, help="micro-batch tokens (paper budget)")
    ap.add_argument("--share", type=float, default=0.033, help="sampled share")
    ap.add_argument("--emulate", type=float, default=0.0, help="GB of a GPU to emulate (0: off)")
    ap.add_argument("--vllm-share", type=float, default=0.7, help="vLLM's share when awake")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        print("no CUDA device: CPU smoke run, float32, timings only (memory figures need a GPU)")
    model, cfg = build(args, dev)
    n = sum(p.numel() for p in model.parameters())
    weights = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
    secs, alloc, reserved = step(model, args.tokens, args.share, dev)
    tflops = 6 * n * args.tokens / secs / 1e12  # forward 2 + backward 4 per param and token
    print(
        f"model {n / 1e9:.2f}B params, {args.tokens:,} tokens, {args.share:.1%} sampled: "
        f"{secs:.1f} s, {tflops:.2f} TFLOP/s"
    )
    arch, terms = plan_terms(cfg, args.tokens, args.share)
    predicted = sum(t.bytes for t in terms)
    for t in terms:
        print(f"  plan  {t.name:<56} {t.bytes / GB:8.2f} GB")
    if alloc is None:
        return
    print(
        f"  measured activations (peak allocated - weights/LoRA) {(alloc - weights) / GB:8.2f} GB"
        f"   measured / plan {(alloc - weights) / predicted:.2f}"
    )
    print(f"  peak allocated {alloc / GB:.2f} GB, reserved {reserved / GB:.2f} GB")
    if args.emulate:
        total = torch.cuda.mem_get_info()[1]
        physical = args.emulate * 79.2 * 2**30 / 80
        for name, keep in (("vLLM asleep", 0.03), ("vLLM awake", args.vllm_share)):
            fraction = (physical * (1 - keep)) / total
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(fraction)
            try:
                secs, alloc, reserved = step(model, args.tokens, args.share, dev)
                print(
                    f"  {args.emulate:g} GB GPU, {name}: fits, {secs:.1f} s, peak "
                    f"{alloc / GB:.2f} GB allocated, {reserved / GB:.2f} reserved"
                )
            except torch.OutOfMemoryError:
                print(
                    f"  {args.emulate:g} GB GPU, {name}: out of memory at fraction {fraction:.3f}"
                )
        torch.cuda.set_per_process_memory_fraction(1.0)


if __name__ == "__main__":
    main()

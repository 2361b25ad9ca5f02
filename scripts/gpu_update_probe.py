"""Device probe: RL update micro-batches of a random-init Qwen2.5-7B on one GPU, measured against
`rcgrpo plan`'s terms. Needs only torch, transformers, peft, pyyaml and src/ (no vLLM, no hub,
no bfcl-eval): the model is built from its config with random weights; the LoRA, the reference
adapter, the log-prob and loss functions, the shared-prefix forward and the micro-batching are
the project's own (scripts/probe_cases.py builds the inputs).

Each case runs pi_old and the reference (no grad), then one PPO forward + backward with the KL
term, gradient checkpointing on, under training_attention (bf16 LoRA compute), with PyTorch's
cache emptied and its peaks reset before it (each case's memory is its own):
1. worst case: one --tokens episode with --share of it sampled;
2. typical rows: the first micro-batch the trainer forms from one rank's share of a mini-batch
   of replayed episodes (padded rows);
3. typical rows, shared prefixes: the same rollouts with `rl.shared_prefix` on (the default):
   the trainer's shared micro-batch through its shared forward (rcgrpo.training.shared_forward);
4. reference forward: the chunked LM head against the plain path (the model's full (B, T, V)
   logits) on a --ref-tokens episode: peak memory of each, log-probs and gradients compared.
Printed per case: time, FLOPs as rcgrpo.training.plan.flops counts them (the pass, the recompute,
pi_old and the reference, attention, the head) and TFLOP/s, peak allocated and reserved, the
plan's activation terms beside the measured peak. With --emulate GB cases 1-2 run again under
torch.cuda.set_per_process_memory_fraction emulating that GPU with vLLM asleep and awake.
Without CUDA it runs on the CPU at the width given and says so: memory figures need a GPU.
scripts/gpu_day_one.sh runs it (with the other probes) and turns it into calibration.json.

    .venv/bin/python scripts/gpu_update_probe.py --emulate 80    # one GPU, ~3 min (estimated)
    .venv/bin/python scripts/gpu_update_probe.py --smoke         # CPU, small width, ~1 min
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import probe_cases as pc  # noqa: E402
import torch  # noqa: E402

GB = 1e9
VOCAB, REWARD_ROWS = 152_064, [151_665, 151_666]


def config(args):
    """The probe's Qwen2 config: Qwen2.5-7B's shape at --hidden / --intermediate / --layers
    (heads of 128, 7 query heads per KV head)."""
    from transformers import Qwen2Config

    heads = max(1, args.hidden // 128)
    return Qwen2Config(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate or args.hidden * 37 // 7,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 7),
        head_dim=args.hidden // heads,
        vocab_size=VOCAB,
        tie_word_embeddings=False,
    )


def build(args, dev):
    """(model with LoRA and the reward rows, its config, the reference adapter's name, the
    LoRA ModelConfig) on `dev`, random weights."""
    from transformers import AutoModelForCausalLM

    from rcgrpo.models.lora import add_reference_adapter, apply_lora
    from rcgrpo.models.profiles import ModelConfig

    cfg = config(args)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model.gradient_checkpointing_enable({"use_reentrant": False})
    model.config.use_cache = False
    # the two reward-token rows in the padding, as load_policy adds them
    lora = ModelConfig(profile="qwen2.5-7b-instruct")
    model = apply_lora(model, lora, REWARD_ROWS).to(dev)
    return model, cfg, add_reference_adapter(model), lora


def plain_logprobs(model, ids, attn, mask):
    """The reference path: the model's full logits (B, T, V), log-softmax at every position,
    then the mask (B, T-1): what the chunked head replaces."""
    from rcgrpo.training.grpo.core_algos import token_logprobs
    from rcgrpo.training.grpo.update import device_of

    dev = device_of(model)
    ids, attn, mask = ids.to(dev), attn.to(dev), mask.to(dev)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # (B, T-1, V)
    return token_logprobs(logits, ids[:, 1:]) * mask


def chunked_logprobs(model, ids, attn, mask):
    from rcgrpo.training.grpo.update import logprobs

    return logprobs(model, ids, attn, mask)[0]


def step(model, ref_name, ids, attn, mask, dev, plain: bool = False):
    """pi_old and the reference (no grad), then one PPO forward + backward with the KL term.
    PyTorch's cache is emptied and its peaks reset first. Returns seconds, peak allocated and
    reserved (None on the CPU), the policy's log-probs (B, T-1) and the LoRA gradients."""
    from rcgrpo.models.lora import using_adapter
    from rcgrpo.training.forward import training_attention
    from rcgrpo.training.grpo.core_algos import policy_loss

    fn = plain_logprobs if plain else chunked_logprobs
    adv = torch.ones(ids.shape[0], device=dev)
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # else a case reports the reserve an earlier one left
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with training_attention(model):
        model.eval()
        with torch.no_grad():
            old = fn(model, ids, attn, mask)
            with using_adapter(model, ref_name):
                ref = fn(model, ids, attn, mask)
        model.train()
        logp = fn(model, ids, attn, mask)
        loss, _ = policy_loss(logp, old, adv, mask.to(dev), ref)
        loss.backward()
    grads = [p.grad.detach().float().cpu() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    peaks = (None, None)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peaks = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    return time.perf_counter() - t0, *peaks, logp.detach().float().cpu(), grads


def plan_terms(arch, tokens: int, sampled: int):
    """What rcgrpo plan counts for a micro-batch's activations (qwen2.5-7b's measured layer)."""
    from rcgrpo.training.plan.memory import measured_layer, update_terms

    layer = measured_layer("qwen2.5-7b-instruct", "bfloat16")
    return update_terms(arch, tokens, sampled, 2, True, layer)


def run_case(name, model, probe, inputs, shared: bool = False) -> dict:
    """Run one case, print its lines and return its figures (calibration.json's `cases`)."""
    from rcgrpo.training import shared_forward
    from rcgrpo.training.plan.flops import step_flops

    ids, attn, mask = inputs
    work = pc.work(ids, attn, mask, shared)
    flops = step_flops(probe.arch, work, True, probe.lora_params)  # pi_old, ref, one pass
    shared_forward.enable(model, shared)
    try:
        secs, alloc, reserved, _, _ = step(model, probe.ref, ids, attn, mask, probe.dev)
    finally:
        shared_forward.enable(model, False)
    sampled = int(mask.sum())
    print(
        f"{name}: {ids.shape[0]} rows x {ids.shape[1]:,} = {work.tokens:,.0f} computed tokens, "
        f"{sampled:,} sampled ({sampled / work.tokens:.1%}): {secs:.1f} s, "
        f"{flops / 1e12:,.3g} TFLOP (plan/flops.py) = {flops / secs / 1e12:.3g} TFLOP/s"
    )
    terms = plan_terms(probe.arch, int(work.tokens), sampled)
    for t in terms:
        print(f"  plan  {t.name:<56} {t.bytes / GB:8.2f} GB")
    out = {"name": name, "rows": ids.shape[0], "width": ids.shape[1], "tokens": work.tokens}
    out |= {"pairs": work.pairs, "sampled": sampled, "seconds": secs, "flops": flops}
    out |= {"plan_activation_bytes": sum(t.bytes for t in terms)}
    if alloc is None:
        return out
    measured = alloc - probe.weights
    print(
        f"  measured activations (peak allocated - weights/LoRA) {measured / GB:8.2f} GB"
        f"   measured / plan {measured / out['plan_activation_bytes']:.2f}"
    )
    print(f"  peak allocated {alloc / GB:.2f} GB, reserved {reserved / GB:.2f} GB")
    return out | {"peak_allocated": alloc, "peak_reserved": reserved}


def compare_reference(model, ref_name, tokens: int, share: float, dev) -> float:
    """The chunked head against the plain full-logits path on one episode: peaks, and the
    largest log-prob and gradient differences (relative to the gradient's scale). Returns the
    larger of the two differences."""
    inputs = pc.one_episode(tokens, share)
    c_secs, c_alloc, _, c_logp, c_grads = step(model, ref_name, *inputs, dev)
    p_secs, p_alloc, _, p_logp, p_grads = step(model, ref_name, *inputs, dev, plain=True)
    dlogp = float((c_logp - p_logp).abs().max())
    scale = max(float(g.abs().max()) for g in p_grads)
    dgrad = max(float((c - p).abs().max()) for c, p in zip(c_grads, p_grads, strict=True)) / scale
    print(
        f"reference forward, {tokens:,} tokens, {share:.1%} sampled: chunked head {c_secs:.1f} s, "
        f"plain (B, T, V) logits {p_secs:.1f} s; max |d log-prob| {dlogp:.2e}, "
        f"max |d grad| / max |grad| {dgrad:.2e} (max |grad| {scale:.2e})"
    )
    if c_alloc is not None:
        print(
            f"  peak allocated: chunked {c_alloc / GB:.2f} GB, plain {p_alloc / GB:.2f} GB "
            f"(plain / chunked {p_alloc / c_alloc:.2f})"
        )
    return max(dlogp, dgrad)


def emulate(args, model, ref_name, cases, dev) -> None:
    """The cases again under a memory fraction emulating an --emulate GB GPU, vLLM asleep
    (rollout.colocate's share) and awake (--vllm-share)."""
    from rcgrpo.rollout.colocate import VLLM_ASLEEP_SHARE
    from rcgrpo.training.plan.constants import PHYSICAL_PER_GB

    total = torch.cuda.mem_get_info()[1]
    physical = args.emulate * PHYSICAL_PER_GB  # bytes CUDA reports for the marketed size
    for phase, keep in (("vLLM asleep", VLLM_ASLEEP_SHARE), ("vLLM awake", args.vllm_share)):
        fraction = physical * (1 - keep) / total
        for name, inputs in cases:
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(fraction)
            where = f"  {args.emulate:g} GB GPU, {phase}, {name}"
            try:
                secs, alloc, reserved, _, _ = step(model, ref_name, *inputs, dev)
                peaks = f"peak {alloc / GB:.2f} GB allocated, {reserved / GB:.2f} reserved"
                print(f"{where}: fits, {secs:.1f} s, {peaks}")
            except torch.OutOfMemoryError:
                model.zero_grad(set_to_none=True)  # a backward may have stopped half-way
                print(f"{where}: out of memory at fraction {fraction:.3f}")
    torch.cuda.set_per_process_memory_fraction(1.0)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # the model: Qwen2.5-7B's shape unless --smoke
    ap.add_argument("--hidden", type=int, default=3584, help="hidden size (7B: 3584)")
    ap.add_argument("--intermediate", type=int, default=18944, help="MLP size (7B: 18944)")
    ap.add_argument("--layers", type=int, default=28, help="decoder layers (7B: 28)")
    # the cases
    ap.add_argument("--tokens", type=int, default=75264, help="micro-batch tokens (paper budget)")
    ap.add_argument("--share", type=float, default=0.033, help="sampled share, worst case")
    ap.add_argument("--rows", type=int, default=40, help="typical rows drawn (320 / 8 ranks)")
    ap.add_argument("--scale", type=int, default=1, help="divide the replayed episodes' lengths")
    ap.add_argument("--max-sampled", type=int, default=0, help="rl.max_sampled_per_micro_batch")
    ap.add_argument("--ref-tokens", type=int, default=8192, help="reference forward's tokens")
    ap.add_argument("--ref-share", type=float, default=0.25, help="reference's sampled share")
    # the emulated GPU
    ap.add_argument("--emulate", type=float, default=0.0, help="GB of a GPU to emulate (0: off)")
    ap.add_argument("--vllm-share", type=float, default=0.7, help="vLLM's share when awake")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="small width (256, 2 layers), episodes / 16, 2,048 tokens: CPU check",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.hidden, args.intermediate, args.layers = 256, 512, 2
        args.tokens, args.rows, args.scale, args.ref_tokens = 2048, 10, 16, 256
    return args


def run(args, dev) -> dict:
    """Build the model and run the cases (module docstring); returns {"params", "cases",
    "reference"} (the largest chunked/plain difference). A warm-up step first: the first
    kernels, cuBLAS handles and autotuning are no case's time."""
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model, cfg, ref, lora = build(args, dev)
    from rcgrpo.models.profiles import LORA_TARGETS

    arch = pc.probe_arch(cfg)
    weights = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
    lora_params = arch.lora_params(lora.lora_r, tuple(LORA_TARGETS["qwen2"]))
    probe = argparse.Namespace(
        arch=arch, ref=ref, dev=dev, weights=weights, lora_params=lora_params
    )
    n = sum(p.numel() for p in model.parameters())
    print(f"model {n / 1e9:.2f}B params, built in {time.perf_counter() - t0:.1f} s")
    step(model, ref, *pc.one_episode(min(args.tokens, 1024), args.share), dev)  # warm-up
    rollouts = pc.replayed(args.rows, args.scale)
    cases = [
        ("worst case: one episode", pc.one_episode(args.tokens, args.share), False),
        (
            "typical rows",
            pc.first_micro_batch(rollouts, args.tokens, False, args.max_sampled),
            False,
        ),
    ]
    from rcgrpo.training import shared_forward

    if shared_forward.enable(model, True):  # the default path where the model trains on SDPA
        shared_forward.enable(model, False)
        inputs = pc.first_micro_batch(rollouts, args.tokens, True, args.max_sampled)
        cases.append(("typical rows, shared prefixes", inputs, True))
    else:
        print("shared prefixes: not this model's training attention; case skipped")
    results = [run_case(name, model, probe, inputs, shared) for name, inputs, shared in cases]
    worst = compare_reference(model, ref, args.ref_tokens, args.ref_share, dev)
    if args.emulate and dev.type == "cuda":
        emulate(args, model, ref, [(name, inputs) for name, inputs, _ in cases[:2]], dev)
    print(f"probe done in {time.perf_counter() - t0:.1f} s")
    return {"params": n, "cases": results, "reference": worst}


def main(argv=None) -> dict:
    """The probe on its own: the trainer's allocator settings, the contexts, the cases."""
    from probe_contexts import measure_contexts

    from rcgrpo.rollout.colocate import trainer_allocator

    print(f"allocator settings: {trainer_allocator() or '(defaults)'}")  # before CUDA starts
    args = parse(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        print("no CUDA device: CPU run, float32, timings only (memory figures need a GPU)")
    measure_contexts()
    return run(args, dev)


if __name__ == "__main__":
    main()

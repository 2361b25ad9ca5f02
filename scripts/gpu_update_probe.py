"""Device probe: RL update micro-batches of a random-init Qwen2.5-7B on one GPU, measured against
`rcgrpo plan`'s terms. Needs only torch, transformers, peft, pyyaml and src/ (no vLLM, no hub,
no bfcl-eval): the model is built from its config with random weights; the LoRA, the reference
adapter, the log-prob and loss functions and the micro-batching are the project's own.

Each case runs pi_old and the reference (no grad), then one PPO forward + backward with the KL
term, gradient checkpointing on, under training_attention (bf16 LoRA compute):
1. worst case: one --tokens episode with --share of it sampled;
2. typical rows: the first (longest, budget-filled) micro-batch of one rank's share of a
   mini-batch of episodes drawn from the replayed ground truths (plan/episodes.json), grouped
   by rcgrpo.training.batching.micro_batches as the trainer groups them;
3. reference forward: the chunked LM head against the plain path (the model's full (B, T, V)
   logits, log-softmax everywhere) on a --ref-tokens episode small enough for the plain path
   to fit: peak memory of each, and log-probs and gradients compared.
Printed per case: time, TFLOP/s (6 x decoder params x tokens), peak allocated and reserved, the
plan's activation terms beside the measured peak. On a GPU it also measures what the plan
assumes (CUDA context, NCCL buffers) and prints each beside its assumed value; with --emulate
GB cases 1-2 run again under torch.cuda.set_per_process_memory_fraction emulating that GPU with
vLLM asleep and awake. Without CUDA it runs on the CPU at the width given and says so: memory
figures need a GPU.

    .venv/bin/python scripts/gpu_update_probe.py --emulate 80    # H200, ~4 min (estimated)
    .venv/bin/python scripts/gpu_update_probe.py --smoke         # CPU, small width, ~1 min
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from probe_contexts import measure_contexts  # noqa: E402

GB = 1e9
VOCAB, TEXT_ROWS, REWARD_ROWS = 152_064, 151_643, [151_665, 151_666]


def build(args, dev):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rcgrpo.models.lora import add_reference_adapter, apply_lora
    from rcgrpo.models.profiles import ModelConfig

    heads = max(1, args.hidden // 128)
    cfg = Qwen2Config(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate or args.hidden * 37 // 7,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 7),
        head_dim=args.hidden // heads,
        vocab_size=VOCAB,
        tie_word_embeddings=False,
    )
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model.gradient_checkpointing_enable({"use_reentrant": False})
    model.config.use_cache = False
    # the two reward-token rows in the padding, as load_policy adds them
    model = apply_lora(model, ModelConfig(profile="qwen2.5-7b-instruct"), REWARD_ROWS).to(dev)
    return model, cfg, add_reference_adapter(model)


def one_episode(tokens: int, share: float):
    """One row of `tokens` random ids, `share` of the targets sampled: ids, attn (1, T), mask
    (1, T-1)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, TEXT_ROWS, (1, tokens), generator=g)
    mask = (torch.rand(1, tokens - 1, generator=g) < share).float()
    return ids, torch.ones_like(ids), mask


def typical_rows(tokens: int, rows: int, packed: bool, max_sampled: int):
    """The first micro-batch the trainer would form from `rows` episodes drawn from the replayed
    ground truths (groups of 5, as rl.group_size): ids, attn (B, T), mask (B, T-1)."""
    from rcgrpo.training.batching import micro_batches
    from rcgrpo.training.grpo.update import to_batch
    from rcgrpo.training.plan.timing import draw_step, episode_shapes

    episodes = [e for group in draw_step(episode_shapes(), max(1, rows // 5), 5) for e in group]
    g = torch.Generator().manual_seed(0)
    rollouts = []
    for shape in episodes:
        loss_mask = [m for prefill, sampled in shape for m in [0] * prefill + [1] * sampled]
        ids = torch.randint(0, TEXT_ROWS, (len(loss_mask),), generator=g).tolist()
        rollouts.append(SimpleNamespace(ids=ids, loss_mask=loss_mask, logprobs=[0.0] * len(ids)))
    lengths = [len(r.ids) for r in rollouts]
    sampled = [sum(r.loss_mask) for r in rollouts]
    first = micro_batches(lengths, tokens, packed, sampled, max_sampled)[0]
    batch = to_batch([rollouts[i] for i in first])
    return batch.ids, batch.attn, batch.mask


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
    Returns seconds, peak allocated and reserved (None on the CPU), the policy's log-probs
    (B, T-1) and the LoRA gradients (list)."""
    from rcgrpo.models.lora import using_adapter
    from rcgrpo.training.forward import training_attention
    from rcgrpo.training.grpo.core_algos import policy_loss

    fn = plain_logprobs if plain else chunked_logprobs
    adv = torch.ones(ids.shape[0], device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
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


def plan_terms(cfg, tokens: int, sampled: int):
    """What rcgrpo plan counts for a micro-batch's activations (qwen2.5-7b's measured layer)."""
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
    return update_terms(arch, tokens, sampled, 2, True, layer)


def decoder_params(model) -> int:
    """Weights of the decoder layers: the dense FLOPs per token are 6 x these (the embedding is
    a lookup; the LM head runs at the sampled positions only)."""
    return sum(p.numel() for name, p in model.named_parameters() if ".layers." in name)


def report(name, model, cfg, ref_name, inputs, dev, weights) -> None:
    """Run one case and print its line, the plan's terms and the measured peak."""
    ids, attn, mask = inputs
    tokens, sampled = int(ids.numel()), int(mask.sum())
    secs, alloc, reserved, _, _ = step(model, ref_name, ids, attn, mask, dev)
    n = decoder_params(model)
    print(
        f"{name}: {ids.shape[0]} rows x {ids.shape[1]:,} = {tokens:,} computed tokens, "
        f"{sampled:,} sampled ({sampled / tokens:.1%}): {secs:.1f} s, "
        f"{6 * n * tokens / secs / 1e12:.2f} decoder TFLOP/s"
    )
    terms = plan_terms(cfg, tokens, sampled)
    for t in terms:
        print(f"  plan  {t.name:<56} {t.bytes / GB:8.2f} GB")
    if alloc is None:
        return
    measured, predicted = alloc - weights, sum(t.bytes for t in terms)
    print(
        f"  measured activations (peak allocated - weights/LoRA) {measured / GB:8.2f} GB"
        f"   measured / plan {measured / predicted:.2f}"
    )
    print(f"  peak allocated {alloc / GB:.2f} GB, reserved {reserved / GB:.2f} GB")


def compare_reference(model, ref_name, tokens: int, share: float, dev) -> float:
    """The chunked head against the plain full-logits path on one episode: peaks, and the
    largest log-prob and gradient differences (relative to the gradient's scale). Returns the
    larger of the two differences."""
    inputs = one_episode(tokens, share)
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
    ap.add_argument("--max-sampled", type=int, default=0, help="rl.max_sampled_per_micro_batch")
    ap.add_argument("--ref-tokens", type=int, default=8192, help="reference forward's tokens")
    ap.add_argument("--ref-share", type=float, default=0.25, help="reference's sampled share")
    # the emulated GPU
    ap.add_argument("--emulate", type=float, default=0.0, help="GB of a GPU to emulate (0: off)")
    ap.add_argument("--vllm-share", type=float, default=0.7, help="vLLM's share when awake")
    ap.add_argument(
        "--smoke", action="store_true", help="small width (256, 2 layers, 512 tokens): CPU check"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.hidden, args.intermediate, args.layers = 256, 512, 2
        args.tokens, args.rows, args.ref_tokens = 512, 5, 256
    return args


def main(argv=None) -> float:
    """Run the probe; returns the reference comparison's largest difference (tests read it)."""
    args = parse(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        print("no CUDA device: CPU run, float32, timings only (memory figures need a GPU)")
    measure_contexts()
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model, cfg, ref_name = build(args, dev)
    from rcgrpo.training.forward import packs

    weights = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
    n = sum(p.numel() for p in model.parameters())
    print(f"model {n / 1e9:.2f}B params, built in {time.perf_counter() - t0:.1f} s")
    cases = [
        ("worst case: one episode", one_episode(args.tokens, args.share)),
        ("typical rows", typical_rows(args.tokens, args.rows, packs(model), args.max_sampled)),
    ]
    for name, inputs in cases:
        report(name, model, cfg, ref_name, inputs, dev, weights)
    worst = compare_reference(model, ref_name, args.ref_tokens, args.ref_share, dev)
    if args.emulate and dev.type == "cuda":
        emulate(args, model, ref_name, cases, dev)
    print(f"probe done in {time.perf_counter() - t0:.1f} s")
    return worst


if __name__ == "__main__":
    main()

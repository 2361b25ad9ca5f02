"""The text `rcgrpo plan` prints: per-GPU memory phase by phase, the step time, and every
constant with its source, "assumed" where no measurement backs it yet (each is a debt that the
GPU probes, scripts/gpu_update_probe.py, are there to pay).

    rcgrpo plan --profile qwen2.5-7b-instruct --preset paper --gpus 8 --gpu-memory 80
"""

from __future__ import annotations

import math

from rcgrpo.training.batching import pad_frac
from rcgrpo.training.plan import constants as C
from rcgrpo.training.plan import sharing as S
from rcgrpo.training.plan import timing as T


def step_time(arch, b, rl, rollout, gpus, gpu, kv_tok, lora, ckpt, mfu) -> list[str]:
    """The RL step's time lines: rollouts lock-step and async, update, sync, tokens/s/GPU."""
    groups = T.draw_step(T.episode_shapes(), rl.tasks_per_step, rl.group_size, seed=0)
    args = dict(arch=arch, b=b, gpu=gpu, kv_tokens=kv_tok, max_seqs=rollout.vllm_max_num_seqs)
    lock = T.rollout_seconds(groups, gpus, args, lock_step=True)
    free = T.rollout_seconds(groups, gpus, args, lock_step=False)
    lengths = [sum(p + s for p, s in ep) for g in groups for ep in g]
    micro = T.step_micro_batches(
        lengths,
        rl.max_tokens_per_micro_batch,
        rl.micro_batch_size,
        rl.mini_batch_size,
        packed=False,
    )
    recompute = rl.behaviour_logprobs == "recompute"  # engine: no pi_old forward
    shape = (rl.inner_epochs, rl.kl_coef > 0, ckpt, lora, recompute)
    flops = T.update_flops(arch, lengths, micro, False, *shape)
    update = flops / (gpus * gpu.bf16_flops * mfu)
    pad = pad_frac(lengths, micro)
    tokens = sum(lengths)
    lines = [
        f"rl step: {rl.tasks_per_step} tasks x G {rl.group_size} = {len(lengths):,} episodes, "
        f"{tokens / 1e6:.1f}M tokens (replayed ground-truth shapes), "
        f"{math.ceil(len(groups) / gpus)} groups per rank",
        f"  rollouts, scheduler lockstep             {lock:8.0f} s",
        f"  rollouts, scheduler async (the default)  {free:8.0f} s   async/lock-step: {lock / free:.2f}x",
        f"  update: {flops / 1e15:,.0f} PFLOP at MFU {mfu:.2f} on {gpus} GPUs      {update:8.0f} s"
        f"   ({len(micro)} micro-batches a pass, pad_frac {pad:.3f}, padded rows)",
        f"  weight sync                              {C.SYNC_S:8.0f} s",
    ]
    share = S.shared_ratio(arch, groups, micro, rl.mini_batch_size)
    lines.append(
        f"  update, rl.shared_prefix: {share['ratio']:.2f} x the FLOPs          "
        f"{update * share['ratio']:8.0f} s   ({share['tokens'] / 1e6:.1f}M of "
        f"{share['unshared_tokens'] / 1e6:.1f}M tokens a forward; causal FLOPs)"
    )
    for name, roll in (("lock-step", lock), ("async", free)):
        for label, upd in (("", update), (", shared", update * share["ratio"])):
            step = roll + upd + C.SYNC_S
            lines.append(
                f"  step ({name}{label}): {step:,.0f} s = {step / 3600:.2f} h; {rl.steps} steps "
                f"{rl.steps * step / 3600:,.0f} h; {tokens / step / gpus:,.0f} tokens/s/GPU"
            )
    lines.append(f"  peer: {C.PEER[0]}: {C.PEER[1]:,.0f} tokens/s/GPU")
    return lines


CONSTANTS = [
    ("sampled share of a micro-batch", lambda: f"{C.SAMPLED_SHARE:.3f}", C.SAMPLED_SOURCE),
    ("logits bytes per (position, row)", lambda: f"{C.LOGITS_BYTES}", C.LOGITS_SOURCE),
    (
        "physical bytes per marketed GB",
        lambda: f"{C.PHYSICAL_PER_GB / C.GB:.3f} GB",
        C.PHYSICAL_SOURCE,
    ),
    ("headroom kept in every phase", lambda: f"{C.HEADROOM:.0%}", "vLLM alone keeps 10 %"),
    ("CUDA context per process", lambda: f"{C.CUDA_CONTEXT_GB} GB", "assumed"),
    ("vLLM context + non-torch memory", lambda: f"{C.VLLM_CONTEXT_GB} GB", "assumed"),
    ("NCCL buffers per trainer (> 1 GPU)", lambda: f"{C.NCCL_GB} GB", "assumed"),
    ("allocator slack", lambda: f"{C.ALLOCATOR_SLACK:.0%}", "assumed"),
    ("vLLM activations + CUDA graphs", lambda: f"{C.VLLM_OVERHEAD_GB} GB", "assumed"),
    ("decode bandwidth efficiency", lambda: f"{C.BANDWIDTH_EFF}", "assumed (copies: 0.9 measured)"),
    ("prefill / decode matmul efficiency", lambda: f"{C.PREFILL_EFF}", "assumed"),
    ("engine iteration overhead", lambda: f"{C.ITERATION_S * 1e3:g} ms", "assumed"),
    (
        "tokens per engine iteration",
        lambda: f"{C.CHUNK_TOKENS:,}",
        "assumed (vLLM chunked prefill)",
    ),
    ("tool call", lambda: f"{C.TOOL_S * 1e3:g} ms", "sandbox round trip + replay (README)"),
    (
        "prefix shared by a group's first prompts",
        lambda: f"all but {T.PREFIX_TAIL} tokens",
        "assumed (vLLM prefix caching, on by default)",
    ),
    ("weight sync per step", lambda: f"{C.SYNC_S:g} s", "assumed for a 7B LoRA adapter"),
]


def render(plan, mfu: float = C.MFU) -> str:
    """A rcgrpo.training.plan.report.Plan as the command prints it."""
    out = ["rcgrpo plan", *("  " + h for h in plan.head), ""]
    out.append(f"memory per GPU (GB = 1e9 B; {plan.gpu_bytes / C.GB:.1f} GB physical each)")
    for phase in plan.phases:
        out.append(f"  {phase.title}")
        for t in phase.terms:
            out.append(f"    {t.name:<56} {t.bytes / C.GB:8.2f}   {t.formula}")
        free = 1 - phase.bytes / plan.gpu_bytes
        verdict = "fits" if free >= C.HEADROOM else f"DOES NOT FIT (headroom >= {C.HEADROOM:.0%})"
        out.append(f"    {'total':<56} {phase.bytes / C.GB:8.2f}   headroom {free:.1%}: {verdict}")
    if plan.timing:
        out += ["", "time per RL step (estimate)", *plan.timing]
    out += [
        "",
        "constants (rcgrpo/training/plan/constants.py)",
        f"  {'model FLOPs utilisation of the update':<44} {mfu:<10} assumed (--mfu)",
    ]
    out += [f"  {name:<44} {value():<10} {source}" for name, value, source in CONSTANTS]
    out.append("fits: yes" if not plan.problems else f"fits: no: {plan.problems[0]}")
    return "\n".join(out)

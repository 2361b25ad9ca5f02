"""The text `rcgrpo plan` prints: per-GPU memory phase by phase, the step time, and every
constant with its source, "assumed" where no measurement backs it yet (each is a debt that
`scripts/gpu_day_one.sh` pays on a GPU: `rcgrpo plan --calibration DIR/calibration.json`).

    rcgrpo plan --profile qwen2.5-7b-instruct --preset paper --gpus 8 --gpu-memory 80
"""

from __future__ import annotations

import math

from rcgrpo.training.batching import pad_frac
from rcgrpo.training.plan import constants as C
from rcgrpo.training.plan import sharing as S
from rcgrpo.training.plan import timing as T
from rcgrpo.training.plan.calibration import ASSUMED, Assumed


def step_time(
    arch, b, rl, rollout, gpus, gpu, kv_tok, lora_params, ckpt, k: Assumed = ASSUMED
) -> list[str]:
    """The RL step's time lines: rollouts lock-step and async, update, sync, tokens/s/GPU
    (lora_params 0: a full fine-tune)."""
    groups = T.draw_step(T.episode_shapes(), rl.tasks_per_step, rl.group_size, seed=0)
    args = dict(arch=arch, b=b, gpu=gpu, kv_tokens=kv_tok, max_seqs=rollout.vllm_max_num_seqs, k=k)
    lock = T.rollout_seconds(groups, gpus, args, lock_step=True)
    free = T.rollout_seconds(groups, gpus, args, lock_step=False)
    lengths = [sum(p + s for p, s in ep) for g in groups for ep in g]
    sampled = [sum(s for _, s in ep) for g in groups for ep in g]
    micro = T.step_micro_batches(
        lengths,
        rl.max_tokens_per_micro_batch,
        rl.micro_batch_size,
        rl.mini_batch_size,
        packed=False,
    )
    recompute = rl.behaviour_logprobs == "recompute"  # engine: no pi_old forward
    lora = lora_params > 0
    shape = (rl.inner_epochs, rl.kl_coef > 0, ckpt, lora, recompute, lora_params, sampled)
    flops = T.update_flops(arch, lengths, micro, False, *shape)
    update = flops / (gpus * gpu.bf16_flops * k.mfu)
    pad = pad_frac(lengths, micro)
    tokens = sum(lengths)
    lines = [
        f"rl step: {rl.tasks_per_step} tasks x G {rl.group_size} = {len(lengths):,} episodes, "
        f"{tokens / 1e6:.1f}M tokens (replayed ground-truth shapes), "
        f"{math.ceil(len(groups) / gpus)} groups per rank",
        f"  rollouts, scheduler lockstep             {lock:8.0f} s",
        f"  rollouts, scheduler async (the default)  {free:8.0f} s   async/lock-step: {lock / free:.2f}x",
        f"  update: {flops / 1e15:,.0f} PFLOP at MFU {k.mfu:.2f} on {gpus} GPUs      {update:8.0f} s"
        f"   ({len(micro)} micro-batches a pass, pad_frac {pad:.3f}, padded rows)",
        f"  weight sync                              {k.sync_s:8.0f} s",
    ]
    share = S.shared_ratio(arch, groups, micro, rl.mini_batch_size)
    shared = update * share["ratio"] * k.mfu / k.mfu_shared
    lines.append(
        f"  update, rl.shared_prefix: {share['ratio']:.2f} x the FLOPs at MFU {k.mfu_shared:.2f}"
        f" {shared:8.0f} s   ({share['tokens'] / 1e6:.1f}M of "
        f"{share['unshared_tokens'] / 1e6:.1f}M tokens a forward; SDPA path)"
    )
    for name, roll in (("lock-step", lock), ("async", free)):
        for label, upd in (("", update), (", shared", shared)):
            step = roll + upd + k.sync_s
            lines.append(
                f"  step ({name}{label}): {step:,.0f} s = {step / 3600:.2f} h; {rl.steps} steps "
                f"{rl.steps * step / 3600:,.0f} h; {tokens / step / gpus:,.0f} tokens/s/GPU"
            )
    lines.append(f"  peer: {C.PEER[0]}: {C.PEER[1]:,.0f} tokens/s/GPU")
    return lines


def constants(k: Assumed) -> list[tuple[str, str, str]]:
    """(what, value, source) of every constant the plan uses, assumed or measured."""

    def gb(name: str) -> tuple[str, str]:
        return f"{getattr(k, name):.2g} GB", k.source(name)

    def share(name: str) -> tuple[str, str]:
        return f"{getattr(k, name):.2f}", k.source(name)

    return [
        ("model FLOPs utilisation of the update", *share("mfu")),
        ("MFU of the shared-prefix update", *share("mfu_shared")),
        ("sampled share of a micro-batch", f"{C.SAMPLED_SHARE:.3f}", C.SAMPLED_SOURCE),
        ("logits bytes per (position, row)", f"{C.LOGITS_BYTES}", C.LOGITS_SOURCE),
        ("physical bytes per marketed GB", f"{C.PHYSICAL_PER_GB / C.GB:.3f} GB", C.PHYSICAL_SOURCE),
        ("headroom kept in every phase", f"{C.HEADROOM:.0%}", "vLLM alone keeps 10 %"),
        ("CUDA context per process", *gb("cuda_context_gb")),
        ("vLLM non-torch memory (in its share)", *gb("vllm_non_torch_gb")),
        ("NCCL buffers per trainer (> 1 GPU)", *gb("nccl_gb")),
        ("allocator slack", f"{k.allocator_slack:.1%}", k.source("allocator_slack")),
        ("vLLM activations + CUDA graphs", *gb("vllm_overhead_gb")),
        ("decode bandwidth efficiency", *share("bandwidth_eff")),
        ("prefill / decode matmul efficiency", *share("prefill_eff")),
        ("engine iteration overhead", f"{k.iteration_s * 1e3:.3g} ms", k.source("iteration_s")),
        ("tokens per engine iteration", f"{k.chunk_tokens:,.0f}", k.source("chunk_tokens")),
        ("tool call", f"{C.TOOL_S * 1e3:g} ms", "sandbox round trip + replay (README)"),
        (
            "prefix shared by a group's first prompts",
            f"all but {T.PREFIX_TAIL} tokens",
            "assumed (vLLM prefix caching, on by default)",
        ),
        ("weight sync per step", f"{k.sync_s:g} s", k.source("sync_s")),
    ]


def render(plan) -> str:
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
    out += ["", "constants (rcgrpo/training/plan/constants.py; measured: --calibration)"]
    out += [f"  {name:<44} {value:<10} {source}" for name, value, source in constants(plan.k)]
    out.append("fits: yes" if not plan.problems else f"fits: no: {plan.problems[0]}")
    return "\n".join(out)

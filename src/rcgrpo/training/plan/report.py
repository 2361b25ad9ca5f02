"""`rcgrpo plan`: per-GPU memory and a per-step time estimate of a config, before any set-up.

`make_plan(...)` turns the resolved sections (model, rollout, rl and the fine-tuning stage)
into phases of terms (rcgrpo.training.plan.memory) and a time estimate
(rcgrpo.training.plan.timing); `check(plan)` raises NoFit with one line saying what to change;
`render(plan)` is the text the command prints, every constant listed with its source.

Layout assumed: one training process per GPU (data parallel, `accelerate launch`), each with
its own rollout engine on the same GPU (the vLLM server reserves rollout.vllm_gpu_memory_
utilization of it for the whole run; the transformers engine keeps its KV cache in the trainer
between updates). A micro-batch holds at most max(budget, longest sequence) tokens: a sequence
longer than the budget runs alone (rcgrpo.training.batching).

    rcgrpo plan --profile qwen2.5-7b-instruct --preset paper --gpus 8 --gpu-memory 80
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rcgrpo.training.batching import pad_frac
from rcgrpo.training.plan import constants as C
from rcgrpo.training.plan import memory as M
from rcgrpo.training.plan import timing as T


@dataclass
class Phase:
    title: str
    terms: list[M.Term]

    @property
    def bytes(self) -> float:
        return M.total(self.terms)


@dataclass
class Plan:
    head: list[str]
    gpu_bytes: float
    phases: list[Phase] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what to change, most binding first
    timing: list[str] = field(default_factory=list)


def _trainer(arch, b, lora_params, gpus, reference, tokens, sampled, ckpt, layer):
    terms = M.static_terms(arch, b, lora_params, gpus, reference)
    terms += M.update_terms(arch, tokens, sampled, b, ckpt, layer)
    return terms + M.process_terms(M.total(terms), gpus)


def _idle(arch, b, lora_params, gpus, reference):
    """The trainer between updates with its allocator cache emptied (what vLLM wakes beside)."""
    terms = M.static_terms(arch, b, lora_params, gpus, reference)
    return terms + M.process_terms(M.total(terms), gpus)


def make_plan(model, rollout, rl, sft, stage: str, gpus: int, gpu: C.GPU, gpu_gb: float,
              share: float = C.SAMPLED_SHARE, mfu: float = C.MFU) -> Plan:  # fmt: skip
    """model/rollout/rl/sft: the resolved ModelConfig, RolloutConfig, RLConfig and the SFTConfig
    of the fine-tuning `stage` ("rctp" | "sft")."""
    from rcgrpo.models.profiles import LORA_TARGETS, PROFILES
    from rcgrpo.rollout.colocate import sleep_mode
    from rcgrpo.training.plan.measure import COMMAND, cuda_dtype, recorded

    profile = PROFILES[model.profile]
    dtype = cuda_dtype(model.profile) if model.dtype == "auto" else model.dtype
    arch, b, room = C.architecture(model.profile), M.dtype_bytes(dtype), gpu_gb * C.PHYSICAL_PER_GB
    layer = M.measured_layer(model.profile, dtype)
    lora = profile.lora if model.lora is None else model.lora
    targets = tuple(model.lora_target_modules) or LORA_TARGETS["qwen2"]
    lora_params = arch.lora_params(model.lora_r, targets) if lora else 0
    ckpt = profile.gradient_checkpointing
    ckpt = ckpt if model.gradient_checkpointing is None else model.gradient_checkpointing
    longest = (rollout.max_total_tokens or profile.max_total_tokens) + (
        rollout.max_new_tokens or profile.max_new_tokens
    )
    compute = (
        "LoRA in bf16 under autocast, fp32 master weights and AdamW states"
        if lora and dtype != "float32"
        else f"{dtype} compute"
    )
    plan = Plan([
        f"{model.profile}: {arch.params() / 1e9:.2f}B params ({arch.source}), {dtype}, "
        + (f"LoRA r={model.lora_r} ({lora_params / 1e6:.1f}M)" if lora else "full fine-tune")
        + f", gradient checkpointing {'on' if ckpt else 'off'}, attention {model.attention}",
        f"{compute}; per layer and token (measured by `{COMMAND}`, {recorded()['date']}): "
        f"saved {layer.saved / 1e3:.1f} kB, forward + backward peak {layer.peak / 1e3:.1f} kB",
        f"{gpus} x {gpu.name} at {gpu_gb:g} GB = {room / C.GB:.1f} GB physical ({gpu.source})",
        f"one training process per GPU, each with its own {rollout.engine} rollout engine",
    ], room)  # fmt: skip
    usable = room * (1 - C.HEADROOM)

    # fine-tuning: the whole GPU, no engine
    ft_len = sft.max_len or profile.sft_max_len
    ft_tok = max(sft.max_tokens_per_micro_batch, ft_len) if sft.max_tokens_per_micro_batch else (
        sft.micro_batch_size * ft_len)  # fmt: skip
    ft = _trainer(arch, b, lora_params, gpus, False, ft_tok, math.ceil(share * ft_tok), ckpt, layer)
    ft_problems: list[str] = []
    plan.phases.append(Phase(f"{stage} update: micro-batch of {ft_tok:,} tokens "
                             f"({stage}.max_tokens_per_micro_batch {sft.max_tokens_per_micro_batch:,}, "
                             f"longest example {ft_len:,})", ft))  # fmt: skip
    idle = _idle(arch, b, lora_params, gpus, True)
    if M.total(ft) > usable:
        fit = M.largest_tokens(arch, b, ckpt, share, usable - M.total(idle), layer)
        ft_problems.append(
            f"{stage}: a {ft_tok:,}-token micro-batch needs "
            f"{M.total(ft) / C.GB:.0f} GB per GPU, {usable / C.GB:.1f} GB usable "
            f"({C.HEADROOM:.0%} headroom): "
            + _lower(f"{stage}.max_tokens_per_micro_batch", f"{stage}.max_len", ft_len, fit)
        )

    # RL: rollouts and the update, vLLM asleep during the update in sleep mode
    budget = rl.max_tokens_per_micro_batch
    rl_tok = max(budget, longest) if budget else rl.micro_batch_size * longest
    ref = rl.kl_coef > 0
    upd = _trainer(arch, b, lora_params, gpus, ref, rl_tok, math.ceil(share * rl_tok), ckpt, layer)
    idle = _idle(arch, b, lora_params, gpus, ref)
    title = (
        f"micro-batch of {rl_tok:,} tokens (rl.max_tokens_per_micro_batch {budget:,}, "
        f"longest episode {longest:,})"
    )
    episodes = rl.tasks_per_step * rl.group_size
    kv_tok = 0.0
    beside = []  # what stays on the GPU beside the update
    if rollout.engine == "vllm":
        rank = rollout.served_lora_rank(model.lora_r)
        slots = 2 * arch.lora_params(rank, targets) * b if lora else 0.0  # --max-loras 2
        awake, kv_tok = M.vllm_terms(arch, b, rollout.vllm_gpu_memory_utilization, room, slots)
        if sleep_mode(rollout, model.profile, on_cuda=True):
            plan.phases.append(Phase("rl rollouts: vLLM awake, trainer cache empty", idle + awake))
            beside = M.vllm_asleep_terms(slots)
            plan.phases.append(Phase(f"rl update, vLLM asleep: {title}", upd + beside))
        else:
            beside = awake
            plan.phases.append(Phase(f"rl update beside a resident vLLM: {title}", upd + awake))
        roll_bytes = M.total(idle) + rollout.vllm_gpu_memory_utilization * room
        u_max = math.floor((usable - M.total(idle)) / room * 100) / 100
        u_min = (
            M.total(awake) - M.total(awake[-1:]) + longest * M.kv_bytes_per_token(arch, b)
        ) / room
        if roll_bytes > usable:
            plan.problems.append(
                f"rl: set rollout.vllm_gpu_memory_utilization <= {u_max:.2f} (now "
                f"{rollout.vllm_gpu_memory_utilization}): the rollouts phase leaves less than "
                f"{C.HEADROOM:.0%} headroom beside the idle trainer"
            )
        elif kv_tok < longest:
            plan.problems.append(
                f"rl: raise rollout.vllm_gpu_memory_utilization to >= {u_min + 0.005:.2f} "
                f"(<= {u_max:.2f}): its KV cache holds {kv_tok:,.0f} tokens, one episode needs "
                f"{longest:,}"
            )
    else:  # transformers engine: each in-flight episode's K/V stays in the trainer process
        shapes = T.episode_shapes()
        mean = sum(sum(p + s for p, s in e) for e in shapes.values()) / len(shapes)
        kv = M.kv_bytes_per_token(arch, b)
        held = math.ceil(episodes / gpus) * mean * kv + rollout.max_batch * longest * kv
        roll = M.static_terms(arch, b, lora_params, gpus, ref) + [
            M.Term("KV of every in-flight episode (prefix store)", math.ceil(episodes / gpus)
                   * mean * kv, f"{math.ceil(episodes / gpus)} episodes x {mean:,.0f} tok x "
                   f"{kv / 1e3:.0f} kB"),
            M.Term("generate's static cache", rollout.max_batch * longest * kv,
                   f"{rollout.max_batch} rows x {longest:,} tok x {kv / 1e3:.0f} kB")]  # fmt: skip
        plan.phases.append(Phase("rl rollouts (transformers engine)", roll))
        plan.phases.append(Phase(f"rl update: {title}", upd))
        if M.total(roll) > usable:
            plan.problems.append(
                f"rl: the transformers engine keeps {held / C.GB:.0f} GB of KV per GPU in the "
                "trainer: set rollout.engine=vllm (paged KV, shared prefixes)"
            )
    need = M.total(upd) + M.total(beside)
    if need > usable and not any(p.startswith("rl:") for p in plan.problems):
        fit = M.largest_tokens(
            arch, b, ckpt, share, usable - M.total(idle) - M.total(beside), layer
        )
        plan.problems.append(f"rl: a {rl_tok:,}-token micro-batch needs {need / C.GB:.0f} GB "
                             f"per GPU with what stays beside it, {usable / C.GB:.1f} GB usable "
                             f"({C.HEADROOM:.0%} headroom): "
                             + _lower("rl.max_tokens_per_micro_batch",
                                      "rollout.max_total_tokens + max_new_tokens", longest, fit))  # fmt: skip
    plan.problems += ft_problems  # after RL's: RL sets the memory of the run
    if problem := budget_problem(model, rollout):  # first: it fails the run's first stage
        plan.problems.insert(0, problem)
    if rollout.engine == "vllm":
        plan.timing = step_time(arch, b, rl, rollout, gpus, gpu, kv_tok, lora, ckpt, mfu)
    return plan


def _lower(budget: str, cap: str, longest: int, fit: int) -> str:
    """What to change when a micro-batch of `longest` tokens does not fit but `fit` would."""
    if fit < 1024:
        return "no micro-batch fits: use GPUs with more memory"
    if longest > fit:  # a sequence longer than the budget runs alone: cap the sequences too
        return (
            f"cap {cap} (the longest sequence, now {longest:,}) and {budget} at <= "
            f"{fit:,} tokens, or use GPUs with more memory"
        )
    return f"set {budget} <= {fit:,}"


def step_time(arch, b, rl, rollout, gpus, gpu, kv_tok, lora, ckpt, mfu) -> list[str]:
    """The RL step's time lines: rollouts lock-step and async, update, sync, tokens/s/GPU."""
    groups = T.draw_step(T.episode_shapes(), rl.tasks_per_step, rl.group_size, seed=0)
    args = dict(arch=arch, b=b, gpu=gpu, kv_tokens=kv_tok, max_seqs=rollout.vllm_max_num_seqs)
    lock = T.rollout_seconds(groups, gpus, args, lock_step=True)
    free = T.rollout_seconds(groups, gpus, args, lock_step=False)
    lengths = [sum(p + s for p, s in ep) for g in groups for ep in g]
    micro = T.step_micro_batches(lengths, rl.max_tokens_per_micro_batch, rl.micro_batch_size,
                                 rl.mini_batch_size, packed=False)  # fmt: skip
    flops = T.update_flops(arch, lengths, micro, False, rl.inner_epochs, rl.kl_coef > 0, ckpt, lora)
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
    ]  # fmt: skip
    for name, roll in (("lock-step", lock), ("async", free)):
        step = roll + update + C.SYNC_S
        lines.append(f"  step ({name}): {step:,.0f} s = {step / 3600:.2f} h; {rl.steps} steps "
                     f"{rl.steps * step / 3600:,.0f} h; {tokens / step / gpus:,.0f} tokens/s/GPU")  # fmt: skip
    lines.append(f"  peer: {C.PEER[0]}: {C.PEER[1]:,.0f} tokens/s/GPU")
    return lines


def budget_problem(model, rollout) -> str | None:
    """What to change when the longest first prompt leaves no room for a sampled token in the
    episode budget (the data stage would raise it after loading the model and its engine)."""
    from rcgrpo.models.profiles import PROFILES

    profile = PROFILES[model.profile]
    compact = profile.compact_docs if model.compact_docs is None else model.compact_docs
    first = C.FIRST_PROMPT_MAX[(compact, rollout.protocol)]
    budget = rollout.max_total_tokens or profile.max_total_tokens
    if first + 1 < budget:
        return None
    docs = "compact" if compact else "full JSON"
    return (
        f"rollout: the longest first prompt ({first:,} tokens, {docs} tool docs, "
        f"{rollout.protocol} protocol) does not fit rollout.max_total_tokens = {budget:,}; "
        f"raise it, or set it to 0 for the profile's ({profile.max_total_tokens:,}), "
        "e.g. --preset paper"
    )


def check(plan: Plan) -> None:
    """Raise NoFit with the most binding thing to change."""
    if plan.problems:
        raise M.NoFit(plan.problems[0])


CONSTANTS = [
    ("sampled share of a micro-batch", lambda: f"{C.SAMPLED_SHARE:.3f}", C.SAMPLED_SOURCE),
    ("logits bytes per (position, row)", lambda: f"{C.LOGITS_BYTES}", C.LOGITS_SOURCE),
    ("physical bytes per marketed GB", lambda: f"{C.PHYSICAL_PER_GB / C.GB:.3f} GB", C.PHYSICAL_SOURCE),
    ("headroom kept in every phase", lambda: f"{C.HEADROOM:.0%}", "vLLM alone keeps 10 %"),
    ("CUDA context per process", lambda: f"{C.CUDA_CONTEXT_GB} GB", "assumed"),
    ("vLLM context + non-torch memory", lambda: f"{C.VLLM_CONTEXT_GB} GB", "assumed"),
    ("NCCL buffers per trainer (> 1 GPU)", lambda: f"{C.NCCL_GB} GB", "assumed"),
    ("allocator slack", lambda: f"{C.ALLOCATOR_SLACK:.0%}", "assumed"),
    ("vLLM activations + CUDA graphs", lambda: f"{C.VLLM_OVERHEAD_GB} GB", "assumed"),
    ("decode bandwidth efficiency", lambda: f"{C.BANDWIDTH_EFF}", "assumed (copies: 0.9 measured)"),
    ("prefill / decode matmul efficiency", lambda: f"{C.PREFILL_EFF}", "assumed"),
    ("engine iteration overhead", lambda: f"{C.ITERATION_S * 1e3:g} ms", "assumed"),
    ("tokens per engine iteration", lambda: f"{C.CHUNK_TOKENS:,}", "assumed (vLLM chunked prefill)"),
    ("tool call", lambda: f"{C.TOOL_S * 1e3:g} ms", "sandbox round trip + replay (README)"),
    ("prefix shared by a group's first prompts", lambda: f"all but {T.PREFIX_TAIL} tokens",
     "assumed (vLLM prefix caching, on by default)"),
    ("weight sync per step", lambda: f"{C.SYNC_S:g} s", "assumed for a 7B LoRA adapter"),
]  # fmt: skip


def render(plan: Plan, mfu: float = C.MFU) -> str:
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
    out += ["", "constants (rcgrpo/training/plan/constants.py)",
            f"  {'model FLOPs utilisation of the update':<44} {mfu:<10} assumed (--mfu)"]  # fmt: skip
    out += [f"  {name:<44} {value():<10} {source}" for name, value, source in CONSTANTS]
    out.append("fits: yes" if not plan.problems else f"fits: no: {plan.problems[0]}")
    return "\n".join(out)

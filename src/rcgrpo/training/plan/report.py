"""`rcgrpo plan`: per-GPU memory and a per-step time estimate of a config, before any set-up.

`make_plan(...)` turns the resolved sections (model, rollout, rl and the fine-tuning stage)
into phases of terms (rcgrpo.training.plan.memory) and a time estimate
(rcgrpo.training.plan.timing); `check(plan)` raises NoFit with one line saying what to change;
its text is rcgrpo.training.plan.render.

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

from rcgrpo.training.plan import constants as C
from rcgrpo.training.plan import memory as M
from rcgrpo.training.plan import timing as T
from rcgrpo.training.plan.calibration import ASSUMED, Assumed
from rcgrpo.training.plan.render import step_time


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
    k: Assumed = ASSUMED  # the assumed values it used (or a calibration's measured ones)


def _trainer(arch, b, lora_params, gpus, reference, tokens, sampled, ckpt, layer, k):
    terms = M.static_terms(arch, b, lora_params, gpus, reference)
    terms += M.update_terms(arch, tokens, sampled, b, ckpt, layer)
    return terms + M.process_terms(M.total(terms), gpus, k)


def _idle(arch, b, lora_params, gpus, reference, k):
    """The trainer between updates with its allocator cache emptied (what vLLM wakes beside)."""
    terms = M.static_terms(arch, b, lora_params, gpus, reference)
    return terms + M.process_terms(M.total(terms), gpus, k)


def make_plan(
    model,
    rollout,
    rl,
    sft,
    stage: str,
    gpus: int,
    gpu: C.GPU,
    gpu_gb: float,
    share: float = C.SAMPLED_SHARE,
    mfu: float | None = None,
    k: Assumed = ASSUMED,
) -> Plan:
    """model/rollout/rl/sft: the resolved ModelConfig, RolloutConfig, RLConfig and the SFTConfig
    of the fine-tuning `stage` ("rctp" | "sft"); k: the assumed values (or a calibration's), mfu
    given: in place of k's for both update paths."""
    if mfu:
        k = k.given("mfu", mfu, "--mfu").given("mfu_shared", mfu, "--mfu")
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
    plan = Plan(
        [
            f"{model.profile}: {arch.params() / 1e9:.2f}B params ({arch.source}), {dtype}, "
            + (f"LoRA r={model.lora_r} ({lora_params / 1e6:.1f}M)" if lora else "full fine-tune")
            + f", gradient checkpointing {'on' if ckpt else 'off'}, attention {model.attention}",
            f"{compute}; per layer and token (measured by `{COMMAND}`, {recorded()['date']}): "
            f"saved {layer.saved / 1e3:.1f} kB, forward + backward peak {layer.peak / 1e3:.1f} kB",
            f"{gpus} x {gpu.name} at {gpu_gb:g} GB = {room / C.GB:.1f} GB physical ({gpu.source})",
            f"one training process per GPU, each with its own {rollout.engine} rollout engine",
        ],
        room,
        k=k,
    )
    if k.origin:
        plan.head.append(f"calibration {k.origin}")
        if C.GPUS.get(k.kind or "") is not gpu:
            plan.head.append(f"  measured on {k.kind or 'another device'}, not this {gpu.name}")
    usable = room * (1 - C.HEADROOM)

    # fine-tuning: the whole GPU, no engine
    ft_len = sft.max_len or profile.sft_max_len
    ft_tok = (
        max(sft.max_tokens_per_micro_batch, ft_len)
        if sft.max_tokens_per_micro_batch
        else (sft.micro_batch_size * ft_len)
    )
    ft_sampled = math.ceil(share * ft_tok)
    ft = _trainer(arch, b, lora_params, gpus, False, ft_tok, ft_sampled, ckpt, layer, k)
    ft_problems: list[str] = []
    plan.phases.append(
        Phase(
            f"{stage} update: micro-batch of {ft_tok:,} tokens "
            f"({stage}.max_tokens_per_micro_batch {sft.max_tokens_per_micro_batch:,}, "
            f"longest example {ft_len:,})",
            ft,
        )
    )
    idle = _idle(arch, b, lora_params, gpus, True, k)
    if M.total(ft) > usable:
        fit = M.largest_tokens(
            arch, b, ckpt, share, usable - M.total(idle), layer, k.allocator_slack
        )
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
    cap = rl.max_sampled_per_micro_batch  # a bound the batching keeps, else the assumed share
    sampled = min(cap, rl_tok) if cap and budget else math.ceil(share * rl_tok)
    upd = _trainer(arch, b, lora_params, gpus, ref, rl_tok, sampled, ckpt, layer, k)
    idle = _idle(arch, b, lora_params, gpus, ref, k)
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
        util = rollout.vllm_gpu_memory_utilization
        awake, kv_tok = M.vllm_terms(arch, b, util, room, slots, k)
        context, kv = awake[0].bytes, awake[-1].bytes  # outside its share; what fills it
        if sleep_mode(rollout, model.profile, on_cuda=True):
            plan.phases.append(Phase("rl rollouts: vLLM awake, trainer cache empty", idle + awake))
            beside = M.vllm_asleep_terms(slots, k)
            plan.phases.append(Phase(f"rl update, vLLM asleep: {title}", upd + beside))
        else:
            beside = awake
            plan.phases.append(Phase(f"rl update beside a resident vLLM: {title}", upd + awake))
        roll_bytes = M.total(idle) + context + util * room
        u_max = math.floor((usable - M.total(idle) - context) / room * 100) / 100
        inside = M.total(awake) - context - kv  # the share's fixed part
        u_min = (inside + longest * M.kv_bytes_per_token(arch, b)) / room
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
            M.Term(
                "KV of every in-flight episode (prefix store)",
                math.ceil(episodes / gpus) * mean * kv,
                f"{math.ceil(episodes / gpus)} episodes x {mean:,.0f} tok x {kv / 1e3:.0f} kB",
            ),
            M.Term(
                "generate's static cache",
                rollout.max_batch * longest * kv,
                f"{rollout.max_batch} rows x {longest:,} tok x {kv / 1e3:.0f} kB",
            ),
        ]
        roll += M.process_terms(M.total(roll), gpus, k)  # the trainer's context, NCCL, slack
        plan.phases.append(Phase("rl rollouts (transformers engine)", roll))
        plan.phases.append(Phase(f"rl update: {title}", upd))
        if M.total(roll) > usable:
            plan.problems.append(
                f"rl: the transformers engine keeps {held / C.GB:.0f} GB of KV per GPU in the "
                "trainer: set rollout.engine=vllm (paged KV, shared prefixes)"
            )
    need = M.total(upd) + M.total(beside)

    def fits(n: int) -> bool:  # the update with n sampled positions, beside what stays
        terms = _trainer(arch, b, lora_params, gpus, ref, rl_tok, n, ckpt, layer, k)
        return M.total(terms) + M.total(beside) <= usable

    if need > usable and cap and budget and fits(0):  # the sampled cap is what does not fit
        lo, hi = 0, sampled  # the most sampled positions that fit: fits(lo), not fits(hi)
        while hi - lo > 1:
            lo, hi = ((lo + hi) // 2, hi) if fits((lo + hi) // 2) else (lo, (lo + hi) // 2)
        plan.problems.append(
            f"rl: {sampled:,} sampled positions per micro-batch need {need / C.GB:.0f} GB per "
            f"GPU, {usable / C.GB:.1f} GB usable: set rl.max_sampled_per_micro_batch <= {lo:,}"
        )
    if need > usable and not any(p.startswith("rl:") for p in plan.problems):
        room_left = usable - M.total(idle) - M.total(beside)
        fit = M.largest_tokens(arch, b, ckpt, share, room_left, layer, k.allocator_slack)
        plan.problems.append(
            f"rl: a {rl_tok:,}-token micro-batch needs {need / C.GB:.0f} GB "
            f"per GPU with what stays beside it, {usable / C.GB:.1f} GB usable "
            f"({C.HEADROOM:.0%} headroom): "
            + _lower(
                "rl.max_tokens_per_micro_batch",
                "rollout.max_total_tokens + max_new_tokens",
                longest,
                fit,
            )
        )
    plan.problems += ft_problems  # after RL's: RL sets the memory of the run
    if problem := budget_problem(model, rollout):  # first: it fails the run's first stage
        plan.problems.insert(0, problem)
    if rollout.engine == "vllm":
        plan.timing = step_time(arch, b, rl, rollout, gpus, gpu, kv_tok, lora_params, ckpt, k)
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

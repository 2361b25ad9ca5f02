"""`rcgrpo plan`: what GPU 0 holds in each stage of a run, counting every process there.

Every stage runs in a process of its own and the process that runs the flow holds no GPU memory
(rcgrpo.tracking.stage_process), so GPU 0 holds, per stage: data and the evaluations, vLLM server
0 (the stage's process loads the policy on the CPU with vLLM: only its export is served), or with
the transformers engine that process's policy; fine-tuning, rank 0's trainer; RL, rank 0's
trainer and its own vLLM server, in the rollout phase (awake) and the update (asleep or
resident). A server asks for min(configured, (free - margin) / total) of the GPU when it starts
(rcgrpo.rollout.gpu_memory): free is the GPU less what the stage's other processes already hold;
its own CUDA context comes on top of its share (rcgrpo.training.plan.memory.vllm_terms).

    rcgrpo plan --profile qwen2.5-7b-instruct --preset paper --gpus 8 --gpu-memory 80
"""

from __future__ import annotations

from rcgrpo.rollout.gpu_memory import GIB, MARGIN_GIB, server_share
from rcgrpo.training.plan import constants as C
from rcgrpo.training.plan import memory as M

EVALUATIONS = "eval_rl_tasks_before, eval_rl_tasks_after, eval"


def _gb(x: float) -> str:
    return f"{x / C.GB:.1f} GB"


def _server(util: float, held: float, room: float, context: float) -> tuple[float, str]:
    """(bytes, text) of a vLLM server started beside `held` bytes on a `room`-byte GPU: its
    share, and its CUDA context (`context` bytes) outside it."""
    share = server_share(util, int(room - held), int(room), int(MARGIN_GIB * GIB))
    lowered = "" if share == util else f" (lowered from {util:.2f}: {_gb(room - held)} free)"
    return share * room + context, f"vLLM server 0 at {share:.2f}{lowered} + its context"


def gpu0_by_stage(cfg: dict, plan, room: float, k) -> list[str]:
    """Lines: GPU 0 per stage, with the processes holding it. `cfg`: cli.plan.resolve's
    sections; `plan`: make_plan's result (its fine-tuning and RL phases); `k`: its assumed
    values (rcgrpo.training.plan.calibration: a process's CUDA context)."""
    from rcgrpo.models.profiles import PROFILES

    roll, model = cfg["rollout"], cfg["model"]
    phases = {p.title.split(":")[0]: p for p in plan.phases}
    context = k.cuda_context_gb * C.GB
    out = [f"GPU 0 per stage ({_gb(room)}; the flow's own process: nothing on any GPU)"]
    for stage, section in (("data", cfg["dataset"]), (EVALUATIONS, cfg["eval"])):
        if roll.engine == "vllm":
            held, text = _server(section.vllm_gpu_memory_utilization, 0.0, room, context)
            out.append(f"  {stage}: stage process 0 GB (policy on the CPU) + {text} = {_gb(held)}")
        else:
            arch = C.architecture(model.profile)
            dtype = model.dtype if model.dtype != "auto" else "bfloat16"
            weights = arch.params() * M.dtype_bytes(dtype) + context
            if PROFILES[model.profile].source not in ("hub", "gguf"):
                weights = context  # the built-here models: a few MB
            out.append(
                f"  {stage}: stage process (policy + transformers engine) {_gb(weights)} "
                "+ the KV cache of its batches"
            )
    ft = plan.phases[0]
    out.append(f"  {ft.title.split(' ')[0]}: rank 0 trainer, update peak {_gb(ft.bytes)}")
    awake = phases.get("rl rollouts")
    if awake is not None and roll.engine == "vllm":
        trainer = M.total([t for t in awake.terms if not t.name.startswith("vLLM")])
        held, text = _server(roll.vllm_gpu_memory_utilization, trainer, room, context)
        update = next(p for p in plan.phases if p.title.startswith("rl update"))
        out.append(
            f"  rl: rank 0 trainer {_gb(trainer)} + its {text}: rollouts {_gb(trainer + held)}, "
            f"update {_gb(update.bytes)} (vLLM asleep)"
        )
    else:
        peak = max(p.bytes for p in plan.phases[1:])
        out.append(f"  rl: rank 0 trainer and its rollout engine, peak {_gb(peak)}")
    return out

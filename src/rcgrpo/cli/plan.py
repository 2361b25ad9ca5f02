"""`rcgrpo plan`: per-GPU memory and a per-step time estimate of a config, before any set-up.

Reads params.yaml with a preset (default: pipeline.preset) and `--set section.key=value`
pairs on top, as `rcgrpo run` does, and prints what one GPU holds in the fine-tuning and RL
updates (weights, LoRA + optimizer, reference, checkpointed activations and one recomputed
layer at the micro-batch's tokens, logits at the sampled positions, vLLM weights + KV cache),
the RL step's time (rollouts simulated lock-step and async, the update from FLOPs at --mfu) and
every constant with its source (rcgrpo.training.plan): measured where a `--calibration` file
(scripts/gpu_day_one.sh) holds a measurement, assumed elsewhere. A config that does not fit
exits 2 with one line saying what to change (`--table` prints the breakdown before it).

    rcgrpo plan --profile qwen2.5-7b-instruct --preset paper --gpus 8 --gpu-memory 80
    rcgrpo plan --profile qwen2.5-7b-instruct --preset paper --gpus 1 --gpu-memory 24   # exit 2
    rcgrpo plan --profile qwen-shape --set rl.max_tokens_per_micro_batch=8192
    rcgrpo plan --measure    # the per-layer figures: one full-width layer per profile, CPU
    rcgrpo plan --preset paper --profile qwen2.5-7b-instruct --calibration DIR/calibration.json
"""

from __future__ import annotations

import typer

SET_HELP = "override a params.yaml field, section.key=value (repeatable), e.g. rl.tasks_per_step=64"


def resolve(preset: str, sets: list[str], profile: str) -> dict:
    """The model, rollout, rl and fine-tuning sections as a run with this preset and these
    --sets would use them (rcgrpo.run_config.resolve, as `rcgrpo run` builds them):
    {"model", "rollout", "rl", "finetune", "stage", "preset"}."""
    from rcgrpo.config import parse_sets, read_params
    from rcgrpo.run_config import resolve as resolve_run

    params = read_params()
    given = parse_sets([*sets, *([f"model.profile={profile}"] if profile else [])], True)
    rc = resolve_run(params, preset=preset, sets=given)  # "" = params.yaml pipeline.preset
    preset = rc.plan.preset or "none (params.yaml's sections)"
    stage = rc.rl.init  # the fine-tuning stage RL starts from
    return {
        "model": rc.model,
        "rollout": rc.rollout,
        "rl": rc.rl,
        "finetune": getattr(rc, stage),
        "stage": stage,
        "preset": preset,
        "eval": rc.eval,
        "dataset": rc.dataset,
    }


def stage_gpus(cfg: dict, gpus: int) -> str:
    """Each stage's use of the `gpus` GPUs: training on one rank each, the data stage and the
    evaluations on vLLM servers of their own (rcgrpo.rollout.config.for_inference)."""
    from rcgrpo.rollout.config import for_inference

    roll = cfg["rollout"]
    if roll.engine != "vllm":
        return f"GPUs per stage: {gpus} training ranks; data and evaluation: transformers engine"
    visible = [str(i) for i in range(gpus)]
    parts = []
    for name in ("dataset", "eval"):
        sec = cfg[name]
        r = for_inference(roll, sec.vllm_servers, sec.vllm_gpu_memory_utilization, visible)
        parts.append(
            f"{name} {r.n_servers} vLLM servers x {r.tensor_parallel_size} GPU at "
            f"{r.vllm_gpu_memory_utilization:.2f}"
        )
    rl = f"rl {gpus} ranks, 1 vLLM server each at {roll.vllm_gpu_memory_utilization:.2f}"
    return f"GPUs per stage ({gpus}): {parts[0]}; fine-tuning {gpus} ranks; {rl}; {parts[1]}"


def pick_gpu(name: str, memory: float):
    """(GPU specs, memory in GB): by name, else the one with that much memory (H100 if none)."""
    from rcgrpo.config import ConfigError
    from rcgrpo.training.plan.constants import GPUS

    if name:
        if name not in GPUS:
            raise ConfigError(f"--gpu {name!r}: pick one of {sorted(GPUS)}")
        return GPUS[name], memory or GPUS[name].memory_gb
    match = [g for g in GPUS.values() if g.memory_gb == memory]
    return (match[0] if match else GPUS["h100"]), memory or 80.0


def plan(
    profile: str = typer.Option("", help="model profile (shortcut for --set model.profile=...)"),
    preset: str = typer.Option(
        "", help="paper: a params.yaml preset (default: pipeline.preset, none: the sections)"
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    gpus: int = typer.Option(8, min=1, help="GPUs, one training process + rollout engine each"),
    gpu_memory: float = typer.Option(0.0, help="GB per GPU (default: the --gpu's)"),
    gpu: str = typer.Option(
        "", help="h100 | h200 | a100 | l4 (default: by --gpu-memory, else h100)"
    ),
    mfu: float = typer.Option(0.0, help="model FLOPs utilisation of the update (default 0.35)"),
    calibration: str = typer.Option(
        "", help="a calibration.json (scripts/gpu_day_one.sh): its measurements replace the assumed"
    ),
    sampled_share: float = typer.Option(0.0, help="sampled share of a micro-batch (default 0.033)"),
    table: bool = typer.Option(False, help="print the breakdown also when it does not fit"),
    measure: bool = typer.Option(
        False, help="measure one decoder layer of each profile on the CPU into layers.json"
    ),
) -> None:
    """Per-GPU memory and the RL step time of a config; exit 2 with what to change if it does not fit."""
    if measure:
        from rcgrpo.training.plan.measure import PROFILES, measure_all, write

        path = write(measure_all((profile,) if profile else PROFILES, merge=bool(profile)))
        typer.echo(f"wrote {path}")
        return
    from rcgrpo.training.plan import calibration as cal
    from rcgrpo.training.plan import constants
    from rcgrpo.training.plan.render import render
    from rcgrpo.training.plan.report import check, make_plan
    from rcgrpo.training.plan.stages import gpu0_by_stage

    cfg = resolve(preset, set_, profile)
    spec, memory = pick_gpu(gpu, gpu_memory)
    assumed = cal.load(calibration) if calibration else cal.ASSUMED
    result = make_plan(
        cfg["model"],
        cfg["rollout"],
        cfg["rl"],
        cfg["finetune"],
        cfg["stage"],
        gpus,
        spec,
        memory,
        sampled_share or constants.SAMPLED_SHARE,
        mfu or None,
        assumed,
    )
    result.head.append(f"preset {cfg['preset']}, fine-tuning stage {cfg['stage']}")
    result.head.append(stage_gpus(cfg, gpus))
    result.head += gpu0_by_stage(cfg, result, memory * constants.PHYSICAL_PER_GB, assumed)
    if not result.problems or table:
        typer.echo(render(result))
    check(result)  # NoFit: `error: <what to change>`, exit 2 (rcgrpo.cli.main)

"""Prefect flow for one training stage: RCTP-FT / SFT (`rcgrpo.training.sft`) or RC-GRPO / GRPO
(`rcgrpo.training.grpo.trainer`), as one MLflow run nested under the pipeline's run.

The flow passes paths and run ids only: it loads the stage's params.yaml section with overrides,
trains in one task (metrics stream to MLflow at every step through `tracking.metrics_logger`, and
a rich progress bar shows steps and the headline metrics), logs
the saved model folder as the run's `model` artifact (an I/O task, retried) and returns
{"run_id", "model_path", "config"}. Registration in the Model Registry happens after evaluation
(flows/pipeline.py) so the version carries the held-out metrics. RL writes sampled rollouts as
MLflow traces of the run as it trains (params.yaml `traces:`, rcgrpo.tracking.traces).

On several GPUs (`rcgrpo run --procs 8`, exported as $RCGRPO_TRAIN_PROCS) the stage's training
runs as `torchrun --standalone --nproc_per_node 8 flows/train.py --launched SPEC`: one process
per GPU (each binds cuda:LOCAL_RANK, rcgrpo.training.distributed), the stage's configs in the
SPEC file, rank 0 logging every step to this stage's MLflow run and saving the model; the flow,
the data stage and the evaluation stay in the one driver process. On a CPU box the ranks run
over gloo (tests/test_cli_pipeline.py runs 2).

    .venv/bin/python flows/train.py rctp '{"epochs": 1}'      # one stage on its own
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rcgrpo.config import load_section
from rcgrpo.runtime import apply_defaults, project_root
from rcgrpo.tracking import runs as tracking

apply_defaults()

STAGES = ("rctp", "sft", "rl")
PROCS_ENV = "RCGRPO_TRAIN_PROCS"  # `rcgrpo run --procs N`: training stages on N ranks


def train_procs() -> int:
    """Processes (GPUs) each training stage runs on: $RCGRPO_TRAIN_PROCS, else 1."""
    raw = os.environ.get(PROCS_ENV, "1")
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"${PROCS_ENV} must be a positive integer, got {raw!r}")
    return int(raw)


def _abs(path: str, root: Path) -> str:
    """params.yaml paths are relative to the project; tasks may run from any working dir."""
    return path if not path or Path(path).is_absolute() else str(root / path)


def stage_config(stage: str, overrides: dict | None = None, root: Path | None = None):
    """The frozen config of `stage` from params.yaml + overrides, with absolute paths."""
    root = Path(root or project_root())
    overrides = dict(overrides or {})
    if stage == "rl":
        from rcgrpo.training.grpo.config import RLConfig as cls
    else:
        from rcgrpo.training.sft import SFTConfig as cls
    cfg = load_section(stage, cls, overrides=overrides)
    fixes = {"out_dir": _abs(cfg.out_dir, root)}
    if stage == "rl":
        fixes["init_path"] = _abs(cfg.init_path, root)
        fixes["tasks_from"] = _abs(cfg.tasks_from, root)
    else:
        fixes["data"] = _abs(cfg.data, root)
    return dataclasses.replace(cfg, **fixes)


def model_config(overrides: dict | None = None):
    from rcgrpo.models.profiles import ModelConfig

    return load_section("model", ModelConfig, overrides=overrides)


def rollout_config(overrides: dict | None = None):
    from rcgrpo.rollout.engine import RolloutConfig

    return load_section("rollout", RolloutConfig, overrides=overrides)


def traces_config(overrides: dict | None = None):
    from rcgrpo.tracking.traces import TracesConfig

    return load_section("traces", TracesConfig, overrides=overrides)


def total_steps(stage: str, cfg) -> int | None:
    """Optimizer steps the stage will take (for the progress bar); None if unknown."""
    if stage == "rl":
        return cfg.steps
    try:
        rows = sum(1 for line in Path(cfg.data).read_text().splitlines() if line.strip())
    except OSError:
        return None
    return cfg.epochs * -(-rows // cfg.batch_size)  # ceil: a last partial batch is a step


@task(cache_policy=NO_CACHE)
def fit(stage: str, cfg, model_cfg, rollout_cfg, run_id: str, traces_cfg=None) -> str:
    """Train with a rich progress bar; every step's metrics go to MLflow (and, for RL, the
    sampled episodes as traces). Returns the folder of the final model (save_policy layout)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if (procs := train_procs()) > 1:  # one process per GPU: torchrun, rank 0 logs and saves
        tracking.set_tags(run_id, {"train.procs": str(procs)})
        return launch(stage, cfg, model_cfg, rollout_cfg, run_id, procs, traces_cfg)
    to_mlflow = tracking.metrics_logger(run_id)
    shown = ("sft/loss", "reward/mean", "rollout/zero_variance_frac")
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[info]}")]  # fmt: skip
    with Progress(*columns, transient=False) as bar:
        job = bar.add_task(f"{stage} steps", total=total_steps(stage, cfg), info="")

        def log(metrics: dict, step: int) -> None:
            to_mlflow(metrics, step)
            info = "  ".join(f"{k.split('/')[-1]}={metrics[k]:.3g}" for k in shown if k in metrics)
            bar.update(job, completed=step, info=info)

        if stage == "rl":
            from rcgrpo.rollout.execution import ExecutionConfig, session
            from rcgrpo.training.grpo.run import rl_tags, run_rl

            tracer, hook = rl_tracer(run_id, cfg, traces_cfg)
            with session(load_section("execution", ExecutionConfig)) as backend:
                tracking.set_tags(
                    run_id, backend.tags() | rl_tags(cfg, model_cfg)
                )  # Ray job, what trains
                final = run_rl(cfg, model_cfg, rollout_cfg, log_metrics=log, backend=backend,
                               on_rollouts=hook)  # fmt: skip
            if tracer is not None:
                tracking.log_metrics(run_id, tracer.metrics(), cfg.steps)
        else:
            from rcgrpo.training.sft import run_sft

            final = run_sft(cfg, model_cfg, log_metrics=log)
    return str(final)


def rl_tracer(run_id: str, cfg, traces_cfg):
    """(EpisodeTracer, the Trainer's on_rollouts hook) for an RL run, or (None, None) when
    traces are off. traces_cfg: a TracesConfig, or its fields as a dict (a launch spec)."""
    from rcgrpo.tracking import traces

    if isinstance(traces_cfg, dict):
        traces_cfg = traces_config(traces_cfg)
    if traces_cfg is None or not traces_cfg.enabled or not traces_cfg.rl_every:
        return None, None
    tracer = traces.EpisodeTracer(run_id, traces_cfg, {"variant": traces.run_variant(run_id)})
    return tracer, traces.rl_hook(tracer, cfg.steps, cfg.group_size)


def launch(
    stage: str, cfg, model_cfg, rollout_cfg, run_id: str, procs: int, traces_cfg=None
) -> str:
    """The stage on `procs` ranks under torchrun (this file, `--launched SPEC`); the saved
    model's folder. A failed rank fails the stage in one line (the ranks' output is above)."""
    spec = Path(cfg.out_dir) / "launch.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    configs = {"cfg": cfg, "model": model_cfg, "rollout": rollout_cfg, "traces": traces_cfg}
    spec.write_text(
        json.dumps(
            {
                "stage": stage,
                "run_id": run_id,
                **{k: dataclasses.asdict(v) for k, v in configs.items() if v is not None},
            },
            indent=1,
        )
    )
    if "torch" in sys.modules:  # the driver's cached GPU memory (a data-stage policy) back
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(procs), __file__, "--launched", str(spec)]  # fmt: skip
    done = subprocess.run(cmd, cwd=project_root())
    final = Path(cfg.out_dir) / "final"
    if done.returncode != 0 or not final.is_dir():
        raise RuntimeError(f"{stage} on {procs} ranks (torchrun) failed with exit code "
                           f"{done.returncode}: see the ranks' output above")  # fmt: skip
    return str(final)


def run_launched(spec_path: str) -> None:
    """One rank of `launch`: the stage's configs from the spec, rank 0 logging to MLflow."""
    from rcgrpo.config import build
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.training import distributed

    spec = json.loads(Path(spec_path).read_text())
    stage, run_id = spec["stage"], spec["run_id"]
    if stage == "rl":
        from rcgrpo.training.grpo.config import RLConfig as cls
    else:
        from rcgrpo.training.sft import SFTConfig as cls
    cfg = build(cls, spec["cfg"], f"{spec_path}:cfg")
    model_cfg = build(ModelConfig, spec["model"], f"{spec_path}:model")
    to_mlflow = tracking.metrics_logger(run_id)

    def log(metrics: dict, step: int) -> None:  # called on rank 0 only
        to_mlflow(metrics, step)
        shown = ("sft/loss", "reward/mean", "rollout/zero_variance_frac", "perf/step_s")
        print(f"{stage} step {step}  " + "  ".join(
            f"{k}={metrics[k]:.4g}" for k in shown if k in metrics), flush=True)  # fmt: skip

    if stage == "rl":
        from rcgrpo.rollout.engine import RolloutConfig
        from rcgrpo.rollout.execution import ExecutionConfig, session
        from rcgrpo.training.grpo.run import rl_tags, run_rl

        rollout_cfg = build(RolloutConfig, spec["rollout"], f"{spec_path}:rollout")
        tracer, hook = (
            rl_tracer(run_id, cfg, spec.get("traces")) if distributed.is_main() else (None, None)
        )
        with session(load_section("execution", ExecutionConfig)) as backend:
            if distributed.is_main():
                tracking.set_tags(run_id, backend.tags() | rl_tags(cfg, model_cfg))
            run_rl(cfg, model_cfg, rollout_cfg, log_metrics=log, backend=backend, on_rollouts=hook)
        if tracer is not None:
            tracking.log_metrics(run_id, tracer.metrics(), cfg.steps)
    else:
        from rcgrpo.training.sft import run_sft

        run_sft(cfg, model_cfg, log_metrics=log)


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def log_model(run_id: str, model_path: str) -> None:
    """The model folder as the run's `model` artifact, plus the trainer's metrics files."""
    tracking.log_artifact(run_id, model_path, "model")
    for name in ("metrics.json", "metrics.jsonl", "config.json"):
        if (Path(model_path).parent / name).exists():
            tracking.log_artifact(run_id, Path(model_path).parent / name)


@flow(name="rcgrpo-train", log_prints=True)
def train_flow(
    stage: str,
    parent_run_id: str | None = None,
    overrides: dict | None = None,
    model_overrides: dict | None = None,
    rollout_overrides: dict | None = None,
    trace_overrides: dict | None = None,
) -> dict:
    """Train `stage` (rctp | sft | rl); {"run_id", "model_path", "config"}.
    trace_overrides: params.yaml `traces:` fields for this run (RL episode traces)."""
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}: expected one of {STAGES}")
    cfg = stage_config(stage, overrides)
    model_cfg = model_config(model_overrides)
    rollout_cfg = rollout_config(rollout_overrides) if stage == "rl" else None
    traces_cfg = traces_config(trace_overrides) if stage == "rl" else None
    config = {stage: dataclasses.asdict(cfg), "model": dataclasses.asdict(model_cfg)}
    if rollout_cfg is not None:
        config["rollout"] = dataclasses.asdict(rollout_cfg)
        config["traces"] = dataclasses.asdict(traces_cfg)
    with tracking.start_run(stage, config=config, parent_run_id=parent_run_id,
                            tags={"stage": stage}) as run:  # fmt: skip
        run_id = run.info.run_id
        model_path = fit(stage, cfg, model_cfg, rollout_cfg, run_id, traces_cfg)
        log_model(run_id, model_path)
    print(f"{stage}: model {model_path} (MLflow run {run_id})")
    return {"run_id": run_id, "model_path": model_path, "config": config}


if __name__ == "__main__":
    if sys.argv[1] == "--launched":  # one rank of `launch` (torchrun)
        run_launched(sys.argv[2])
    else:
        train_flow(sys.argv[1], overrides=json.loads(sys.argv[2]) if len(sys.argv) > 2 else None)

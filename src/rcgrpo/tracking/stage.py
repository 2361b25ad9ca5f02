"""One training stage (rctp | sft | rl) from a resolved RunConfig, logged to MLflow: the body of
`rcgrpo stage rctp|sft|rl`, the one way a training stage runs. dvc.yaml runs that command, the
pipeline's Prefect task starts it as a process of its own (`launch`: a plain child for one
process, torchrun for `--procs N`, each rank running the command with
`--config <out_dir>/run_config.json`).

Why the MLflow run is opened here when none is given: `dvc repro` and a bare `rcgrpo stage rl`
then leave the same run (name, params, metric names, model artifact) as the pipeline's stage, in
the project's store (mlflow/, or MLFLOW_TRACKING_URI). Under torchrun only rank 0 logs and saves.

    rcgrpo stage rl                                      # params.yaml resolved, own MLflow run
    rcgrpo stage rl --config outputs/rl/run_config.json --mlflow-run <run id>
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import sys
from pathlib import Path

from rcgrpo.run_config import RunConfig, stage_section
from rcgrpo.tracking import runs as tracking
from rcgrpo.tracking.stage_process import CONFIG_FILE, StageFailed, run_stage_process

HEADLINE = ("sft/loss", "reward/mean", "rollout/zero_variance_frac", "loss/kl", "perf/step_s")


def stage_config(rc: RunConfig, stage: str) -> dict:
    """The sections a stage runs under, as its MLflow run records them (params, config.json)."""
    names = [stage, "model", "env"] + (["rollout", "traces", "execution"] if stage == "rl" else [])
    return {name: dataclasses.asdict(getattr(rc, name)) for name in names}


def total_steps(stage: str, cfg) -> int | None:
    """Optimizer steps the stage will take (for the step counter); None if unknown."""
    if stage == "rl":
        return cfg.steps
    try:
        rows = sum(1 for line in Path(cfg.data).read_text().splitlines() if line.strip())
    except OSError:
        return None
    return cfg.epochs * -(-rows // cfg.batch_size)  # ceil: a last partial batch is a step


def headline(stage: str, total: int | None, run_id: str | None):
    """The stage's log_metrics: every step to MLflow (when `run_id`), and one line printed:
    `rl step 3/10  reward/mean=0.5  ...` (the one printer of every route)."""
    to_mlflow = tracking.metrics_logger(run_id) if run_id else None

    def log(metrics: dict, step: int) -> None:
        if to_mlflow is not None:
            to_mlflow(metrics, step)
        shown = "  ".join(f"{k}={metrics[k]:.4g}" for k in HEADLINE if k in metrics)
        print(f"{stage} step {step}/{total or '?'}  {shown}", flush=True)

    return log


def run_stage(
    stage: str,
    rc: RunConfig,
    run_id: str | None = None,
    resume: bool | str = False,
    node_rank: int = 0,
) -> Path:
    """Train `stage`; every step goes to MLflow run `run_id` (None: a run of its own named after
    the stage, which also gets the model). On `rc.plan.procs` > 1 or `rc.plan.nodes` > 1
    outside torchrun: launch (this node's agent: `node_rank`)."""
    from rcgrpo.training import distributed
    from rcgrpo.training.checkpoint import check_writable

    cfg = stage_section(rc, stage)
    check_writable(cfg.out_dir)  # before any run opens or any file is written: one line
    if rc.plan.procs * rc.plan.nodes > 1 and not distributed.launched():
        return launch(stage, rc, run_id, resume, node_rank)
    if not distributed.is_main():
        return _train(stage, rc, None, resume)
    from rcgrpo.training.checkpoint import check_writable

    rc.write(check_writable(cfg.out_dir) / CONFIG_FILE)  # an unwritable out_dir: one line, now
    if run_id is not None:
        return _train(stage, rc, run_id, resume)
    with tracking.start_run(stage, config=stage_config(rc, stage), tags={"stage": stage}) as run:
        final = _train(stage, rc, run.info.run_id, resume)
        log_outputs(run.info.run_id, final)
    print(f"{stage}: model {final} (MLflow run {run.info.run_id})")
    return final


def _train(stage: str, rc: RunConfig, run_id: str | None, resume: bool | str) -> Path:
    from rcgrpo.envs import get

    cfg = stage_section(rc, stage)
    log = headline(stage, total_steps(stage, cfg), run_id)
    env = get(rc.env)  # the run's environment; its limits before any tool worker starts
    if stage != "rl":
        from rcgrpo.training.sft import run_sft

        return Path(run_sft(cfg, rc.model, env, log_metrics=log, resume=resume))
    from rcgrpo.rollout.execution import session
    from rcgrpo.training.grpo.run import rl_tags, run_rl

    tracer, hook = rl_tracer(run_id, rc) if run_id else (None, None)
    with session(rc.execution) as backend:
        if run_id:
            # the Ray job of the rollouts; what trains (mode, learning rate, reward rows)
            tracking.set_tags(run_id, backend.tags() | rl_tags(cfg, rc.model))
        final = run_rl(
            cfg,
            rc.model,
            env,
            rc.rollout,
            log_metrics=log,
            backend=backend,
            on_rollouts=hook,
            resume=resume,
        )
    if tracer is not None:
        tracking.log_metrics(run_id, tracer.metrics(), cfg.steps)
    return Path(final)


def rl_tracer(run_id: str, rc: RunConfig):
    """(EpisodeTracer, the Trainer's on_rollouts hook) for an RL run; (None, None) when traces
    are off (params.yaml `traces:`)."""
    from rcgrpo.tracking import traces

    cfg = rc.traces
    if not cfg.enabled or not cfg.rl_every:
        return None, None
    tracer = traces.EpisodeTracer(run_id, cfg, {"variant": traces.run_variant(run_id)})
    return tracer, traces.rl_hook(tracer, rc.rl.steps, rc.rl.group_size)


def log_outputs(run_id: str, model_path: str | Path) -> None:
    """The model folder as the run's `model` artifact, plus the stage's metrics and config files."""
    tracking.log_artifact(run_id, model_path, "model")
    for name in ("metrics.json", "metrics.jsonl", "config.json", CONFIG_FILE):
        if (Path(model_path).parent / name).exists():
            tracking.log_artifact(run_id, Path(model_path).parent / name)


def launch(
    stage: str, rc: RunConfig, run_id: str | None, resume: bool | str = False, node_rank: int = 0
) -> Path:
    """`rcgrpo stage STAGE --config <out_dir>/run_config.json [--mlflow-run ID]` in a process of
    its own: a plain child for one process, torchrun ranks for rc.plan.procs x nodes > 1 (rank 0
    logs and saves); the saved model's folder. A failed process or rank fails the stage in one
    line (the output is above it).

    On rc.plan.nodes > 1 this is node `node_rank`'s torchrun agent: the agents of every node meet
    at rc.plan.rendezvous (HOST:PORT, served by node 0's agent; on one node 127.0.0.1 only). The
    out_dir must be a folder every node reads: node 0 writes the run's secret there, which every
    rank proves before training (rcgrpo.training.rendezvous, rcgrpo.training.launch). The agent
    runs under the guard of rcgrpo.procs: whatever stops this command (a signal, its death)
    stops the agent, its ranks and the rendezvous within seconds."""
    from rcgrpo.training.launch import torchrun_args
    from rcgrpo.training.rendezvous import SECRET_ENV, SECRET_FILE, write_secret

    cfg, procs = stage_section(rc, stage), rc.plan.procs
    if run_id:
        tracking.set_tags(run_id, {"train.procs": str(procs)})
    args = ["--resume-from", resume] if isinstance(resume, str) else ["--resume"] * bool(resume)
    if procs * rc.plan.nodes == 1:
        run_stage_process(stage, rc, run_id, args)
    else:
        from rcgrpo.models.serving import node_bases

        agent = [sys.executable, "-m", "rcgrpo.training.launch"]
        agent += torchrun_args(rc.plan.nodes, node_rank, rc.plan.rendezvous, procs)
        if node_rank == 0:  # before the agent: every rank reads it after the rendezvous
            write_secret(cfg.out_dir)
        # torchrun leaves a torchelastic_* folder in TMPDIR per launch: this node's own, removed
        tmp = Path(cfg.out_dir) / f".torchrun-{socket.gethostname()}-{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        env = {"TMPDIR": str(tmp), SECRET_ENV: str(Path(cfg.out_dir) / SECRET_FILE)}
        if rc.plan.nodes == 1:  # the ranks' gloo pairs on loopback too
            env["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
        try:  # the node's ranks serve one base export between them (models.serving)
            with node_bases():
                run_stage_process(stage, rc, run_id, args, agent, env)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    final = Path(cfg.out_dir) / "final"
    if not final.is_dir():
        raise StageFailed(f"stage {stage} ({procs} x {rc.plan.nodes} processes) saved no {final}")
    return final

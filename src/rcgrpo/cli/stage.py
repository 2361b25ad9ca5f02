"""`rcgrpo stage NAME`: one stage of the pipeline in this process, the one way each stage runs.

NAME is `data` (build, validate and version the dataset), `rctp` / `sft` (fine-tuning), `rl`
(RC-GRPO / GRPO), or an evaluation: `eval` (held-out tasks), `eval_rl_tasks_before` /
`eval_rl_tasks_after` (the RL tasks, fine-tuned vs RL model). dvc.yaml runs it, the pipeline's
Prefect flow starts it as a process of its own for every stage (rcgrpo.tracking.stage_process),
and with `--procs N` a training stage starts N torchrun ranks, each running it again with
`--config`. Settings: resolved once from params.yaml + `--preset`, `--variant`, `--set`
(rcgrpo.run_config.resolve, as `rcgrpo run` resolves them), or read back from `--config
run_config.json`. Every stage but `data` logs to MLflow: into `--mlflow-run`, else a run of its
own named after the stage. It writes `result.json` beside its run_config.json ({"error": one
line} when it fails). torch, transformers and prefect are imported inside, after the checks.

    rcgrpo stage data                                    # the dataset, DVC-versioned
    rcgrpo stage rctp                                    # RCTP-FT  -> outputs/rctp/final
    rcgrpo stage rl --set steps=2 --set rollout.engine=vllm
    rcgrpo stage rl --resume                             # continue from the last checkpoint
    rcgrpo stage rl --preset paper --variant sft+grpo --procs 8
    rcgrpo stage rl --procs 8 --nnodes 2 --rdzv-endpoint node0:29400     # on each of 2 nodes
    rcgrpo stage eval --model outputs/rl/final --set tokens=[high,low] --set seeds=[0,1,2]
    rcgrpo stage eval_rl_tasks_after --config outputs/eval_rl_tasks/after/run_config.json
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

SET_HELP = "override one field: key=value of the stage's own section, or section.key=value"
OWN_SECTION = {"data": "dataset", "rctp": "rctp", "sft": "sft", "rl": "rl"}  # else eval


def stage(
    name: str = typer.Argument(
        ..., help="data | rctp | sft | rl | eval | eval_rl_tasks_before|after"
    ),
    config: Path | None = typer.Option(
        None,
        help="a run_config.json (rcgrpo.run_config) instead of params.yaml + the options below",
    ),
    mlflow_run: str | None = typer.Option(
        None, help="MLflow run id to log to (default: a run of its own, named after the stage)"
    ),
    model: str = typer.Option(
        "", help="evaluations: the saved model to score (default: the run's fine-tuned / RL one)"
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    preset: str = typer.Option("", help="params.yaml presets.<name> (default: pipeline.preset)"),
    variant: str = typer.Option("", help="a recipe's RL fields (default: pipeline.variant)"),
    procs: int = typer.Option(1, help="training: processes (GPUs), torchrun; 1 = this one"),
    nnodes: int = typer.Option(1, help="training: nodes, each running this command (torchrun)"),
    node_rank: int = typer.Option(0, help="this node's rank, 0 .. nnodes - 1 (0 logs and saves)"),
    rdzv_endpoint: str = typer.Option(
        "", help="HOST:PORT of node 0 where every node's torchrun meets (--nnodes > 1)"
    ),
    resume: bool = typer.Option(
        False, help="training: continue from the last checkpoint in out_dir (same run and config)"
    ),
    resume_from: Path | None = typer.Option(
        None, help="training: continue from this checkpoint folder, whichever run wrote it"
    ),
    params: Path | None = typer.Option(None, help="params.yaml to read (default: the checkout's)"),
    allow_cpu: bool = typer.Option(False, help="run a hub profile or vLLM on the CPU"),
) -> None:
    """Run one stage in this process, logging to MLflow; its result goes to result.json."""
    from rcgrpo.training.launch import as_rank

    as_rank()  # a rank of `--procs N` / `--nnodes N`: dies with its agent (before any import)
    from rcgrpo.config import ConfigError, parse_sets
    from rcgrpo.run_config import STAGES, TRAIN_STAGES, RunConfig, resolve

    if name not in STAGES:
        raise typer.BadParameter(f"must be one of {', '.join(STAGES)}", param_hint="NAME")
    if config is not None:
        others = (set_, preset, variant, params, procs != 1, nnodes != 1, rdzv_endpoint)
        if any(others):
            raise ConfigError(f"--config {config}: settings come from the file; drop the others")
        rc = RunConfig.load(config)
    else:
        section = OWN_SECTION.get(name, "eval")
        pairs = [qualified(p, section) for p in set_]
        sets = parse_sets(pairs, sectioned=True, path=params, together=False)
        rc = resolve(
            params, preset, variant, sets, procs=procs, nodes=nnodes, rendezvous=rdzv_endpoint
        )
        from rcgrpo.cli.doctor import refuse_cpu  # a front that wrote a --config checked it

        engine = rc.rollout.engine if name != "rctp" and name != "sft" else "hf"
        ranks = rc.plan.procs * rc.plan.nodes if name in TRAIN_STAGES else 1
        refuse_cpu(f"rcgrpo stage {name}", rc.model.profile, engine, ranks, allow_cpu)
    if not 0 <= node_rank < rc.plan.nodes:
        raise ConfigError(f"--node-rank {node_rank}: must be in [0, {rc.plan.nodes})")
    try:
        resume = str(resume_from) if resume_from else resume  # run_identity.begin checks it
        result = run(name, rc, mlflow_run, model, resume, node_rank)
    except Exception as e:
        if config is not None:  # started by a flow (rcgrpo.tracking.stage_process): it reads it
            _record_failure(rc, name, e)
        raise
    if result is not None:
        from rcgrpo.tracking.stage_process import write_result

        write_result(rc, name, result)


def run(name: str, rc, run_id: str | None, model: str, resume: bool | str, node_rank: int = 0):
    """The stage's body in this process; its result (None on a torchrun rank but rank 0)."""
    from rcgrpo.run_config import TRAIN_STAGES

    if name == "data":
        built = data_stage(rc)
        keep = ("rev", "md5", "counts", "rollouts")
        return {k: built[k] for k in keep if k in built}
    if name in TRAIN_STAGES:
        from rcgrpo.tracking.stage import run_stage
        from rcgrpo.training.distributed import is_main, launched

        final = run_stage(name, rc, run_id, resume=resume, node_rank=node_rank)
        typer.echo(f"saved {final}")
        main = is_main() if launched() else node_rank == 0  # node 0's rank 0 answers
        return {"model": str(final)} if main else None
    from rcgrpo.tracking.evaluation import default_model, run_evaluation

    return run_evaluation(rc, name, model or default_model(rc, name), run_id)


def data_stage(rc) -> dict:
    """The data stage of a resolved run in this process: flows/build_dataset.py's flow,
    reporting to PREFECT_API_URL (the pipeline's server) when set, else to `rcgrpo ui`'s or a
    server of its own that stops with it."""
    from flows.build_dataset import build_dataset_flow  # prefect: a heavy import
    from rcgrpo.data.versioning import check_data_dir
    from rcgrpo.flow_server import prefect_for_flows

    cfg = rc.dataset
    check_data_dir(cfg.project, cfg.data_dir, cfg.remote)  # never another folder: before work
    with contextlib.ExitStack() as stack:
        prefect_for_flows(stack)
        return build_dataset_flow(cfg, rc=rc)


def _record_failure(rc, name: str, exc: BaseException) -> None:
    """result.json = {"error": the one line the command prints}, for the flow that started it."""
    from rcgrpo.cli.errors import user_error
    from rcgrpo.tracking.stage_process import write_result

    line = user_error(exc) or f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
    with contextlib.suppress(OSError):  # an unwritable folder: the command's own line says it
        write_result(rc, name, {"error": line})


def qualified(pair: str, section: str) -> str:
    """`steps=2` -> `rl.steps=2` (the stage's own section); `rollout.engine=hf` stays."""
    from rcgrpo.config import SECTIONS

    key = pair.partition("=")[0]
    return pair if key.partition(".")[0].strip() in SECTIONS else f"{section}.{pair}"

"""`rcgrpo run|schedule`: the whole pipeline, and the nightly schedule (`rcgrpo ui`: rcgrpo.cli.ui).

    rcgrpo run                                   # data -> RCTP-FT -> RC-GRPO -> eval -> registry
    rcgrpo run --variant sft+grpo                # one of the paper's baselines instead
    rcgrpo run --set rl.steps=2 --set eval.limit=1 --stages finetune,rl,eval
    rcgrpo run --procs 8 --preset paper --profile qwen2.5-7b-instruct   # 8 GPUs, one rank each
    rcgrpo schedule --cron "0 2 * * *"           # serve the pipeline nightly (needs `rcgrpo ui`)

`--set section.key=value` (YAML value) overrides one params.yaml field for this run only. prefect,
mlflow and torch are imported inside the commands, so `rcgrpo --help` stays fast.

The run's settings are resolved once (rcgrpo.run_config.resolve: params.yaml, --preset, --set,
--variant), checked before anything heavy starts, written as run_config.json beside the report and
passed down to every stage; nothing below reads params.yaml again. It works from any directory:
`--project DIR` (or $RCGRPO_PROJECT) names the checkout, else the one the package runs from.

Every stage runs as `rcgrpo stage NAME` in a process of its own (flows/pipeline.py); this one
keeps the Prefect flow and the MLflow bookkeeping and never loads a model or initialises CUDA.
The multi-GPU form: `--procs N` runs each training stage (fine-tuning, RL) on N processes, one
per GPU, started with torchrun (rcgrpo.tracking.stage `launch`); the data stage and the
evaluations run one process each, with vLLM servers on every GPU. Each rank binds
cuda:LOCAL_RANK, rolls out its share of the RL groups on its own engine (its own vLLM server on
its GPU with rollout.engine=vllm) and trains its share of every micro-batch list
(rcgrpo.training.distributed). `rcgrpo stage STAGE --procs N` runs one stage the same way
outside the pipeline.
"""

from __future__ import annotations

import contextlib
import os
import time

import typer

SET_HELP = "override a params.yaml field, section.key=value (repeatable), e.g. rl.steps=2"


PROJECT_HELP = "the rcgrpo checkout to run (default: $RCGRPO_PROJECT, else the package's own)"


def _overrides(pairs: list[str]) -> dict[str, dict]:
    """["rl.steps=2", "eval.tokens=[high]"] -> {"rl": {"steps": 2}, "eval": {"tokens": ["high"]}},
    every pair checked against its section (rcgrpo.config.parse_sets: raises ConfigError)."""
    from rcgrpo.config import parse_sets

    return parse_sets(pairs, sectioned=True, together=False)  # resolve: with the preset


def _enter_project(project: str = "") -> str:
    """Use the project `project` (else $RCGRPO_PROJECT, else the package's checkout): its
    params.yaml, MLflow store and data; the working dir stays where the user is."""
    from rcgrpo.runtime import PROJECT_ENV, apply_defaults, project_root

    if project:
        os.environ[PROJECT_ENV] = str(os.path.abspath(project))
    apply_defaults()
    return str(project_root())


def run(
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    stages: str = typer.Option(
        "",
        help="comma-separated subset of data,finetune,rl,eval "
        "(default: params.yaml pipeline.stages, else all)",
    ),
    variant: str = typer.Option(
        "",
        help="rctp+rc-grpo | rctp+grpo | sft+rc-grpo | sft+grpo (default: params.yaml "
        "pipeline.variant, none: the rl section as it is); see rcgrpo.evaluation.variants",
    ),
    preset: str = typer.Option(
        "", help="paper: a params.yaml preset (default: pipeline.preset, none: the sections)"
    ),
    profile: str = typer.Option("", help="model profile (shortcut for --set model.profile=...)"),
    register_name: str = typer.Option("rcgrpo", help="Model Registry name of the RL model"),
    procs: int = typer.Option(
        1, help="processes per training stage, one per GPU, started with torchrun (1 = this one)"
    ),
    nnodes: int = typer.Option(1, help="nodes; node 0 runs the pipeline, the others join training"),
    node_rank: int = typer.Option(0, help="this node's rank, 0 .. nnodes - 1"),
    rdzv_endpoint: str = typer.Option("", help="HOST:PORT of node 0 for torchrun (--nnodes > 1)"),
    project: str = typer.Option("", help=PROJECT_HELP),
    allow_cpu: bool = typer.Option(False, help="run a hub profile, --procs > 1 or vLLM on the CPU"),
    resume: bool = typer.Option(
        False,
        help="continue the interrupted run here: completed stages skipped, RL from its "
        "last checkpoint, the same MLflow runs (the same settings, else refused)",
    ),
) -> None:
    """Run the whole pipeline; prints where the results and the UIs are."""
    from rcgrpo.config import ConfigError
    from rcgrpo.run_lock import hold

    root = _enter_project(project)
    nodes = (nnodes, rdzv_endpoint)
    rc = _resolve(set_, stages, variant, preset, profile, procs, nodes)  # before anything heavy
    from rcgrpo.cli.doctor import refuse_cpu  # a GPU-sized run on the CPU: one line, now

    refuse_cpu("rcgrpo run", rc.model.profile, rc.rollout.engine, procs * nnodes, allow_cpu)
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"rcgrpo run --node-rank {node_rank}: must be in [0, {nnodes})")
    if node_rank > 0:  # a joining node: node 0 runs the pipeline and holds the run lock
        from rcgrpo.tracking.nodes import follow

        return typer.echo("\n".join(f"saved {p}" for p in follow(rc, node_rank, resume)))
    hold(root)  # one run at a time: a bad setting is said first, then before data, Prefect, MLflow
    if resume:  # nothing to resume, or other settings: one line, before any server starts
        from rcgrpo.tracking.orphans import interrupted

        interrupted(rc)
    from flows.pipeline import pipeline_flow
    from rcgrpo.flow_server import prefect_for_flows
    from rcgrpo.models.serving import node_bases

    started = time.monotonic()
    with contextlib.ExitStack() as stack:  # a Prefect server of its own stops with the command
        api = prefect_for_flows(stack)
        stack.enter_context(node_bases())  # one per run, for every stage and rank here
        try:
            out = pipeline_flow(rc, register_name, resume=resume)
        except (ConfigError, ValueError) as e:
            typer.secho(f"rcgrpo run: {e}", fg="red", err=True)
            raise typer.Exit(2) from None
    minutes = (time.monotonic() - started) / 60
    from rcgrpo.tracking import registry
    from rcgrpo.tracking import runs as tracking

    lines = [
        f"pipeline finished in {minutes:.1f} min (MLflow run {out['run_id']})",
        f"  data version     {out.get('data_version')}",
        *_skipped((out.get("data") or {}).get("rollouts_skipped")),
        f"  model version    {out.get('model_version', '-')} (MLflow Model Registry)",
        f"  RL tasks         {_before_after(out.get('rl_tasks') or {})}",
        f"  evaluation table {out.get('eval', {}).get('table', '-')}",
        f"  report           {out['report']}",
        f"  MLflow store     {tracking.tracking_uri()}",
        f"  MLflow UI        {registry.run_url(out['run_id'])}   (start it: rcgrpo ui)",
        f"  episode traces   {_traces_url(out)}",
        f"  Prefect          {api}",
    ]
    typer.echo("\n".join(lines))


def _skipped(why: str | None) -> list[str]:
    """The summary line when the data stage made no own-policy failures (vLLM not installed)."""
    return [f"  data rollouts    skipped: {why}; the low half is perturbations only"] if why else []


def _traces_url(out: dict) -> str:
    """The MLflow trace view of the RL run's sampled episodes (each evaluation run has its own)."""
    from rcgrpo.tracking import registry

    run = (out.get("rl") or {}).get("run_id")
    return registry.run_url(run, page="traces") if run else "-"


def _resolve(sets, stages: str, variant: str, preset: str, profile: str, procs: int, nodes=(1, "")):
    """The run's RunConfig: params.yaml read once, the preset, --set and variant merged and every
    section checked (rcgrpo.run_config.resolve), the data folder and --procs checked, all
    before a Prefect server or MLflow run starts; a fault raises ConfigError in one line.
    `nodes`: (--nnodes, --rdzv-endpoint)."""
    from rcgrpo.config import ConfigError
    from rcgrpo.run_config import resolve

    overrides = _overrides([*sets, *([f"model.profile={profile}"] if profile else [])])
    chosen = [s.strip() for s in stages.split(",") if s.strip()] or None  # None: pipeline's
    if procs < 1:
        raise ConfigError(f"rcgrpo run --procs {procs}: must be >= 1")
    rc = resolve(  # preset, variant, stages not given: params.yaml pipeline:'s, as every front
        None, preset, variant, overrides, chosen, procs, nodes=nodes[0], rendezvous=nodes[1]
    )
    if "data" in rc.plan.stages:  # never another folder, nor a push into src/
        from rcgrpo.data.versioning import check_data_dir

        check_data_dir(rc.dataset.project, rc.dataset.data_dir, rc.dataset.remote)
    _check_procs(procs)
    return rc


def _check_procs(procs: int) -> None:
    """--procs against the GPUs here (a CPU-only box runs the ranks over gloo: tests), counted
    without CUDA: this process never initialises it."""
    from rcgrpo.config import ConfigError

    if procs > 1:
        from rcgrpo.rollout.router import visible_gpus

        gpus = len(visible_gpus())
        if gpus and procs > gpus:
            raise ConfigError(f"rcgrpo run --procs {procs}: this machine has {gpus} GPUs")


def _before_after(reports: dict) -> str:
    """'high 3/8 -> 8/8, low 1/8 -> 2/8 (greedy, paper reward)' from the RL-task reports (the
    reports' first check: the reward; BFCL's paper R)."""
    import json
    from pathlib import Path

    from rcgrpo.evaluation.compare import checks

    loaded = {k: json.loads(Path(p).read_text()) for k, p in reports.items()}
    if not loaded:
        return "-"
    check = checks(next(iter(loaded.values())))[0]

    def count(when: str, token: str) -> str:
        runs = (loaded.get(when) or {}).get("runs", {}).get(token)
        if not runs:
            return "?"
        a = runs[min(runs)][check]["pooled"]
        return f"{a['k']:g}/{a['n']:g}"

    tokens = sorted({t for r in loaded.values() for t in r["runs"]})
    parts = [f"{t} {count('before', t)} -> {count('after', t)}" for t in tokens]
    return ", ".join(parts) + f" (success before -> after RL; greedy, {check} reward)"


def schedule(
    cron: str = typer.Option("0 2 * * *", help="cron schedule (server time); default nightly"),
    name: str = typer.Option("nightly", help="deployment name: rcgrpo-pipeline/<name>"),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    stages: str = typer.Option("", help="stages each scheduled run does (default: as rcgrpo run)"),
) -> None:
    """Serve the pipeline with a cron schedule until Ctrl-C (needs a Prefect server: rcgrpo ui).
    Each scheduled run resolves params.yaml as it is when it starts, with these --set/--stages
    on top, as `rcgrpo run` does."""
    _enter_project()
    _resolve(set_, stages, "", "", "", 1)  # a bad --set fails before serving
    chosen = [s.strip() for s in stages.split(",") if s.strip()]
    settings = {"sets": _overrides(set_), **({"stages": chosen} if chosen else {})}
    params: dict = {"settings": settings}
    from rcgrpo.flow_server import checked_api_url, prefect_api_running, use_prefect

    found = None if os.environ.get("PREFECT_API_URL") else prefect_api_running()
    if not os.environ.get("PREFECT_API_URL") and not found:
        typer.echo("no Prefect server of `rcgrpo ui` on 127.0.0.1:4200: start it first", err=True)
        raise typer.Exit(1)
    from flows.deploy import serve

    api = found[0] if found else checked_api_url(os.environ["PREFECT_API_URL"])
    typer.echo(f"serving rcgrpo-pipeline/{name} on {api} with cron {cron!r}; Ctrl-C stops")
    with use_prefect(*found) if found else contextlib.nullcontext():
        serve(name, cron, params)

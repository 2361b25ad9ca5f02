"""`rcgrpo train|eval|compare`: fine-tune, run RC-GRPO / GRPO, evaluate, compare runs.

`train` is the one way a stage runs (dvc.yaml, the pipeline's Prefect task and every torchrun
rank): the run's settings resolved once (rcgrpo.run_config) from params.yaml + `--preset`,
`--set`, `--variant`, or read back from a `--config run_config.json`, every step logged to MLflow
(rcgrpo.tracking.stage). `eval` reads its params.yaml section with `--set key=value` overrides
(YAML values: `--set epochs=1 --set tokens=[high,low]`). torch,
transformers and matplotlib are imported inside the commands, so `rcgrpo --help` stays fast.

    rcgrpo train rctp                                   # RCTP-FT  -> outputs/rctp/final
    rcgrpo train sft                                    # plain SFT -> outputs/sft/final
    rcgrpo train rl --set init=sft --set conditioning=none --set out_dir=outputs/sft_grpo
    rcgrpo train rl --resume                            # continue from the last checkpoint
    rcgrpo train rl --preset paper --variant sft+grpo --set rollout.engine=vllm --procs 8
    rcgrpo train rl --config outputs/rl/run_config.json --mlflow-run RUN_ID   # a torchrun rank
    rcgrpo train rl --procs 8 --nnodes 2 --rdzv-endpoint node0:29400     # on each of 2 nodes
    rcgrpo eval outputs/rl/final --set tokens=[high,low] --set seeds=[0,1,2]
    rcgrpo compare outputs/eval/sft_grpo outputs/eval/rctp_rcgrpo --png outputs/compare.png
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, help="Fine-tune, train with RL, evaluate, compare.")

SET_HELP = "override one field: key=value of the stage's own section, or section.key=value"


def _section(name: str, cls, sets: list[str], params: Path | None):
    """The stage's config: params.yaml `name:` + `--set key=value` pairs, each pair checked
    first (a bad one raises ConfigError naming it; rcgrpo.cli.main prints it in one line)."""
    from rcgrpo.config import load_section, parse_sets

    return load_section(name, cls, params, parse_sets(sets, False, name, params))


def _model_cfg(params: Path | None, sets: list[str]):
    from rcgrpo.models.profiles import ModelConfig

    return _section("model", ModelConfig, sets, params)


@app.command()
def train(
    stage: str = typer.Argument(..., help="rctp | sft | rl"),
    config: Path | None = typer.Option(
        None,
        help="a run_config.json (rcgrpo.run_config) instead of params.yaml + the options below",
    ),
    mlflow_run: str | None = typer.Option(
        None, help="MLflow run id to log to (default: a run of its own, named after the stage)"
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    model_set: list[str] = typer.Option([], "--model-set", help="override a model: field"),
    preset: str = typer.Option("", help="params.yaml presets.<name> on top (default: none)"),
    variant: str = typer.Option("", help="a recipe's RL fields, e.g. sft+grpo (default: none)"),
    procs: int = typer.Option(1, help="processes (GPUs), started with torchrun; 1 = this one"),
    nnodes: int = typer.Option(1, help="nodes, each running this command (torchrun rendezvous)"),
    node_rank: int = typer.Option(0, help="this node's rank, 0 .. nnodes - 1 (0 logs and saves)"),
    rdzv_endpoint: str = typer.Option(
        "", help="HOST:PORT of node 0 where every node's torchrun meets (--nnodes > 1)"
    ),
    resume: bool = typer.Option(
        False, help="continue from the last checkpoint in out_dir (of the same run and config)"
    ),
    resume_from: Path | None = typer.Option(
        None, help="continue from this checkpoint folder, whichever run wrote it"
    ),
    params: Path | None = typer.Option(None, help="params.yaml to read (default: the checkout's)"),
    allow_cpu: bool = typer.Option(False, help="train a hub profile or with vLLM on the CPU"),
) -> None:
    """Train one stage, logging every step to MLflow; the model goes to <out_dir>/final."""
    from rcgrpo.training.launch import as_rank

    as_rank()  # a rank of `--procs N` / `--nnodes N`: dies with its agent (before any import)
    from rcgrpo.config import ConfigError, parse_sets
    from rcgrpo.run_config import TRAIN_STAGES, RunConfig, resolve

    if stage not in TRAIN_STAGES:
        raise typer.BadParameter("stage must be rctp, sft or rl", param_hint="STAGE")
    if config is not None:
        others = (set_, model_set, preset, variant, params, procs != 1, nnodes != 1, rdzv_endpoint)
        if any(others):
            raise ConfigError(f"--config {config}: settings come from the file; drop the others")
        rc = RunConfig.load(config)
    else:
        pairs = [_qualified(p, stage) for p in set_] + [f"model.{p}" for p in model_set]
        sets = parse_sets(pairs, sectioned=True, path=params, together=False)
        stages = ("finetune",) if stage != "rl" else ("rl",)
        rc = resolve(
            params, preset, variant, sets, stages, procs, nodes=nnodes, rendezvous=rdzv_endpoint
        )
    from rcgrpo.cli.doctor import refuse_cpu
    from rcgrpo.training.distributed import launched

    if not launched():  # a torchrun rank of `--procs N`: the command that launched it checked
        engine = rc.rollout.engine if stage == "rl" else "hf"
        ranks = rc.plan.procs * rc.plan.nodes
        refuse_cpu(f"rcgrpo train {stage}", rc.model.profile, engine, ranks, allow_cpu)
    from rcgrpo.tracking.stage import run_stage

    resume = str(resume_from) if resume_from else resume  # run_identity.begin checks the rest
    if not 0 <= node_rank < rc.plan.nodes:
        raise ConfigError(f"--node-rank {node_rank}: must be in [0, {rc.plan.nodes})")
    final = run_stage(stage, rc, mlflow_run, resume=resume, node_rank=node_rank)
    typer.echo(f"saved {final}")


def _qualified(pair: str, stage: str) -> str:
    """`steps=2` -> `rl.steps=2` (the stage's own section); `rollout.engine=hf` stays."""
    from rcgrpo.config import SECTIONS

    key = pair.partition("=")[0]
    return pair if key.partition(".")[0].strip() in SECTIONS else f"{stage}.{pair}"


@app.command("eval")
def eval_(
    model_path: Path = typer.Argument(..., help="a folder written by save_policy (…/final)"),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    model_set: list[str] = typer.Option([], "--model-set", help="override a model: field"),
    params: Path | None = typer.Option(None, help="params.yaml to read"),
) -> None:
    """Evaluate a trained policy on the held-out tasks; prints pooled / category-mean / gap."""
    if not model_path.is_dir():  # before any model loads (main() prints it as `error: ...`)
        raise FileNotFoundError(
            f"{model_path} is not a folder: pass one written by save_policy, e.g. outputs/rl/final"
        )
    from rcgrpo.evaluation.compare import fmt
    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import run_eval
    from rcgrpo.rollout.config import RolloutConfig

    cfg = _section("eval", EvalConfig, set_, params)
    rollout_cfg = _section("rollout", RolloutConfig, [], params)
    report = run_eval(cfg, _model_cfg(params, model_set), model_path, rollout_cfg)
    for token, by_seed in report["runs"].items():
        for seed, s in by_seed.items():
            for checker, summary in s.items():
                typer.echo(
                    f"{token:5s} seed {seed} {checker:5s} pooled {fmt(summary['pooled'])}  "
                    f"category mean {fmt(summary['category_mean'])}"
                )
    for checker, gap in report["gap"].items():
        typer.echo(f"controllability gap ({checker}): {100 * gap['mean']:+.1f} points")
    typer.echo(f"report: {Path(cfg.out_dir) / 'report.json'} (protocol {report['protocol']})")


@app.command()
def compare(
    runs: list[Path] = typer.Argument(..., help="eval output folders (or report.json files)"),
    checker: str = typer.Option("bfcl", help="paper | bfcl"),
    token: str = typer.Option("high", help="high | low | none"),
    png: Path = typer.Option(Path("outputs/compare.png"), help="bar chart to write"),
) -> None:
    """A table across evaluated runs and a bar chart with Wilson 95% intervals."""
    from rich.console import Console
    from rich.table import Table

    from rcgrpo.bfcl.tasks import CATEGORIES
    from rcgrpo.evaluation.compare import fmt, load_report, rows
    from rcgrpo.evaluation.plots import bar_chart

    try:
        table_rows = rows(
            {p.name if p.is_dir() else p.parent.name: load_report(p) for p in runs}, checker, token
        )
    except (FileNotFoundError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    table = Table(title=f"{checker} checker, conditioned on {token}")
    for col in (
        "run",
        "protocol",
        "n",
        "pooled [95% CI]",
        "category mean [95% CI]",
        *CATEGORIES,
        "gap",
    ):
        table.add_column(col)
    for r in table_rows:
        table.add_row(
            r["run"],
            r["protocol"],
            str(int(r["n"])),
            fmt(r["pooled"]),
            fmt(r["category_mean"]),
            *(fmt(r[c]) for c in CATEGORIES),
            fmt(r["gap"]),
        )
    Console(width=160).print(table)  # wide: 10 columns must not be truncated
    typer.echo(f"chart: {bar_chart(table_rows, png)}")

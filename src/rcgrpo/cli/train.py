"""`rcgrpo train|eval|compare`: fine-tune, run RC-GRPO / GRPO, evaluate, compare runs.

Each command reads its params.yaml section (rctp / sft / rl / eval, plus model) and takes
`--set key=value` overrides (YAML values: `--set epochs=1 --set tokens=[high,low]`). torch,
transformers and matplotlib are imported inside the commands, so `rcgrpo --help` stays fast.

    rcgrpo train rctp                                   # RCTP-FT  -> outputs/rctp/final
    rcgrpo train sft                                    # plain SFT -> outputs/sft/final
    rcgrpo train rl --set init=sft --set conditioning=none --set out_dir=outputs/sft_grpo
    rcgrpo train rl --resume                            # continue from the last checkpoint
    rcgrpo eval outputs/rl/final --set tokens=[high,low] --set seeds=[0,1,2]
    rcgrpo compare outputs/eval/sft_grpo outputs/eval/rctp_rcgrpo --png outputs/compare.png
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, help="Fine-tune, train with RL, evaluate, compare.")

SET_HELP = "override one field of the params.yaml section, key=value (repeatable)"


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
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    model_set: list[str] = typer.Option([], "--model-set", help="override a model: field"),
    resume: bool = typer.Option(
        False, help="continue from the last checkpoint in out_dir (of the same run and config)"
    ),
    resume_from: Path | None = typer.Option(
        None, help="continue from this checkpoint folder, whichever run wrote it"
    ),
    params: Path | None = typer.Option(None, help="params.yaml to read (default: the checkout's)"),
) -> None:
    """Train one stage; metrics go to <out_dir>/metrics.jsonl (and MLflow via rcgrpo.tracking.runs)."""
    if stage not in ("rctp", "sft", "rl"):
        raise typer.BadParameter("stage must be rctp, sft or rl", param_hint="STAGE")
    model_cfg = _model_cfg(params, model_set)
    resume = str(resume_from) if resume_from else resume  # run_identity.begin checks the rest
    if stage in ("rctp", "sft"):
        from rcgrpo.training.sft import SFTConfig, run_sft

        cfg = _section(stage, SFTConfig, set_, params)
        final = run_sft(cfg, model_cfg, log_metrics=_printer(), resume=resume)
    else:
        from rcgrpo.rollout.engine import RolloutConfig
        from rcgrpo.training.grpo.config import RLConfig
        from rcgrpo.training.grpo.run import run_rl

        cfg = _section("rl", RLConfig, set_, params)
        rollout_cfg = _section("rollout", RolloutConfig, [], params)  # engine, temperature, limits
        final = run_rl(cfg, model_cfg, rollout_cfg, log_metrics=_printer(), resume=resume)
    typer.echo(f"saved {final}")


def _printer():
    """A log_metrics that prints a few headline numbers per step (MLflow is issue 6's)."""
    keys = ("sft/loss", "reward/mean", "rollout/zero_variance_frac", "loss/kl", "perf/step_s")

    def log(metrics: dict, step: int) -> None:
        shown = "  ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics)
        typer.echo(f"step {step}  {shown}")

    return log


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
    from rcgrpo.evaluation.evaluate import EvalConfig, run_eval
    from rcgrpo.rollout.engine import RolloutConfig

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

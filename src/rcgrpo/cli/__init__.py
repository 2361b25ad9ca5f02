"""The `rcgrpo` command line. Each command group lives in its own module of this package and
imports heavy libraries (torch, prefect, mlflow, dvc, great_expectations) inside its commands,
so `rcgrpo --help` stays fast (tests/test_cli_pipeline.py checks it).

    rcgrpo --help
    rcgrpo run                     # the whole pipeline (rcgrpo.cli.pipeline)
    rcgrpo ui                      # MLflow UI + Prefect UI on 127.0.0.1
    rcgrpo data build|versions|rollback REV
    rcgrpo train rctp|sft|rl ; rcgrpo eval PATH ; rcgrpo compare RUNS...
    rcgrpo schedule --cron "0 2 * * *"
    rcgrpo env show multi_turn_base_0
"""

from __future__ import annotations

import importlib.util

import typer

from rcgrpo.cli import env, pipeline, train

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="RC-GRPO for multi-turn tool-calling agents on BFCL v4.",
)
app.command("run")(pipeline.run)
if importlib.util.find_spec("rcgrpo.cli.data") is not None:  # issue 4's group
    from rcgrpo.cli import data

    app.add_typer(data.app, name="data")
app.command("train")(train.train)
app.command("eval")(train.eval_)
app.command("compare")(train.compare)
app.command("ui")(pipeline.ui)
app.command("schedule")(pipeline.schedule)
app.add_typer(env.app, name="env")


def main() -> None:
    from rcgrpo.runtime import apply_defaults

    apply_defaults()
    app()

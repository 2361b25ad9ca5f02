"""The `rcgrpo` command line. Each command group lives in its own module of this package and
imports heavy libraries (torch, prefect, mlflow, dvc, great_expectations) inside its commands,
so `rcgrpo --help` stays fast.

    rcgrpo --help
    rcgrpo env show multi_turn_base_0
"""

from __future__ import annotations

import typer

from rcgrpo.cli import env

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="RC-GRPO for multi-turn tool-calling agents on BFCL v4.")
app.add_typer(env.app, name="env")


def main() -> None:
    from rcgrpo.runtime import apply_defaults

    apply_defaults()
    app()

"""The `rcgrpo` command line. Each command group lives in its own module of this package and
imports heavy libraries (torch, prefect, mlflow, dvc, great_expectations) inside its commands,
so `rcgrpo --help` stays fast (tests/test_cli_pipeline.py checks it).

    rcgrpo --help
    rcgrpo run                     # the whole pipeline (rcgrpo.cli.pipeline)
    rcgrpo ui                      # MLflow UI + Prefect UI on 127.0.0.1
    rcgrpo data build|versions|rollback REV
    rcgrpo stage data|rctp|sft|rl|eval|eval_rl_tasks_before|eval_rl_tasks_after
    rcgrpo compare RUNS...
    rcgrpo schedule --cron "0 2 * * *"
    rcgrpo env show multi_turn_base_0
    rcgrpo plan --profile qwen2.5-7b-instruct --preset paper --gpus 8 --gpu-memory 80
    rcgrpo config show rl          # every setting: value, default, range or choices, help

Errors of the project's own types (a bad `--set`, a corrupt JSONL row, a failed rollback, a
refused checkpoint, ...) end every command the same way, in `main`: `error: <message>` on stderr
and exit code 2, no traceback. Anything else is a bug and keeps its traceback.
The top layer. Imports: bfcl, config, data, evaluation, fields, flow_server, flows, mlflow_ui, models, rollout, run_config, run_lock, runtime, servers, tracking, training.
"""

from __future__ import annotations

import importlib.util
import sys

import typer

from rcgrpo.cli import compare, config, doctor, env, pipeline, plan, prune, stage, ui
from rcgrpo.cli.errors import user_error

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="RC-GRPO for multi-turn tool-calling agents on BFCL v4.",
)
app.command("run")(pipeline.run)
if importlib.util.find_spec("rcgrpo.cli.data") is not None:  # the data commands
    from rcgrpo.cli import data

    app.add_typer(data.app, name="data")
app.command("stage")(stage.stage)
app.command("compare")(compare.compare)
app.command("ui")(ui.ui)
app.command("schedule")(pipeline.schedule)
app.command("plan")(plan.plan)
app.command("doctor")(doctor.doctor)
app.command("prune")(prune.prune)
app.add_typer(env.app, name="env")
app.add_typer(config.app, name="config")


def _recover_publish() -> None:
    """A dataset publish killed mid-way leaves its journal: finish or undo it before any command
    reads data/ (rcgrpo.data.journal.recover; a stat when there is none)."""
    from pathlib import Path

    from rcgrpo.runtime import project_root

    if (Path(project_root()) / ".dvc" / "tmp" / "rcgrpo-publish.json").exists():
        import warnings

        from rcgrpo.data.journal import build_lock
        from rcgrpo.data.versioning import BuildLocked

        try:  # recovers when it takes the lock; held = that publish is still running
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                with build_lock(project_root(), timeout=0):
                    pass
        except BuildLocked:
            said = []
        for w in said:  # what the recovery did, one line each
            typer.secho(f"note: {w.message}", fg="yellow", err=True)


def main() -> None:
    from rcgrpo.runtime import apply_defaults

    apply_defaults()
    try:  # a recovery that cannot finish (the remote unreachable) must not stop every command
        _recover_publish()
    except Exception as e:
        message = user_error(e)
        if message is None:
            raise
        typer.secho(
            f"warning: a dataset publish killed earlier is not finished, retried at the next "
            f"command: {message}",
            fg="yellow",
            err=True,
        )
    try:
        app(standalone_mode=True)
    except Exception as e:
        message = user_error(e)
        if message is None:
            raise
        typer.secho(f"error: {message}", fg="red", err=True)
        sys.exit(2)

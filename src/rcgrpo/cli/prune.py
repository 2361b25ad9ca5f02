"""`rcgrpo prune`: apply params.yaml `retention:` now: old training checkpoints, MLflow runs
with their artifacts and traces, DVC data versions (rcgrpo.tracking.retention). Every pipeline
run does the same after it finished; this is for a project that no longer runs, or to look
first. It takes the project's run lock, so it never prunes under a running pipeline.

    rcgrpo prune --dry-run
    rcgrpo prune --set retention.mlflow_keep_runs=20 --set retention.dvc_keep_commits=10
"""

from __future__ import annotations

import json

import typer

from rcgrpo.cli.pipeline import PROJECT_HELP, SET_HELP, _enter_project


def prune(
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="print what would go; remove nothing"),
    project: str = typer.Option("", help=PROJECT_HELP),
) -> None:
    """Remove what params.yaml `retention:` does not keep; prints what went."""
    from pathlib import Path

    from rcgrpo.config import parse_sets, read_params
    from rcgrpo.run_config import resolve
    from rcgrpo.run_lock import hold

    root = Path(_enter_project(project))
    hold(root)  # never under a running pipeline (it prunes itself when it ends)
    rc = resolve(read_params(root / "params.yaml"), sets=parse_sets(set_, True), root=root)
    from rcgrpo.tracking.retention import prune as prune_project
    from rcgrpo.tracking.runs import configure

    configure(root)  # the project's MLflow store (or MLFLOW_TRACKING_URI's)
    out = prune_project(
        root, rc.retention, [rc.rctp.out_dir, rc.sft.out_dir, rc.rl.out_dir], dry_run
    )
    typer.echo(json.dumps({"dry_run": dry_run, **out}, indent=1))

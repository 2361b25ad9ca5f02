"""`rcgrpo data ...`: build, list and roll back the DVC-versioned trajectory dataset.

`build` is the data stage (`rcgrpo stage data`, rcgrpo.cli.stage) with the settings resolved
from params.yaml as `rcgrpo run` resolves them and `--set` on the `dataset:` section (or any
`section.key=value`), its errors said in a line or two.

rcgrpo data build                                  # params.yaml, resolved
rcgrpo data build --set train_tasks=8 --set test_tasks=4 --set rollouts=off
rcgrpo data versions
rcgrpo data rollback <rev>                         # byte for byte; says what changed
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, help="Build, list and roll back the dataset (DVC).")


def _root(root: Path | None) -> Path:
    from rcgrpo.runtime import project_root

    return (root or project_root()).resolve()


@app.command()
def build(
    set_: list[str] = typer.Option([], "--set", help="override a dataset: key, e.g. seed=1"),
    params: Path | None = typer.Option(None, help="params.yaml to read (default: checkout's)"),
) -> None:
    """Generate, label, validate (GX) and version (DVC) the dataset; one build at a time."""
    from rcgrpo.cli.stage import data_stage, qualified
    from rcgrpo.config import parse_sets
    from rcgrpo.data.validation import ValidationFailed
    from rcgrpo.data.versioning import VersioningError, check_data_dir
    from rcgrpo.run_config import resolve

    pairs = [qualified(p, "dataset") for p in set_]  # a bad --set: ConfigError, one line
    rc = resolve(params, sets=parse_sets(pairs, sectioned=True, path=params, together=False))
    cfg = rc.dataset  # never another folder, nor a push into src/: one line, before anything
    check_data_dir(cfg.project, cfg.data_dir, cfg.remote)
    try:
        result = data_stage(rc)  # its own Prefect server (if needed) stops with the command
    except ValidationFailed as e:
        typer.secho(str(e), fg="red", err=True)
        typer.echo("nothing was versioned; data/ still holds the previous version", err=True)
        raise typer.Exit(1) from None
    except VersioningError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(result, indent=1, default=str))


@app.command()
def versions(root: Path | None = typer.Option(None, help="project root (default: checkout)")):
    """Every committed dataset version: git rev, date, md5, rows per file and label."""
    from rich.console import Console
    from rich.table import Table

    from rcgrpo.data.versioning import versions as list_versions

    rows = list_versions(_root(root))
    if not rows:
        typer.echo("no dataset version committed yet: run `rcgrpo data build`")
        return
    table = Table("rev", "date", "md5", "rows (high/low per file)", "")
    for v in rows:
        counts = "\n".join(f"{f}: {c['high']}/{c['low']}" for f, c in sorted(v["rows"].items()))
        table.add_row(
            v["rev"][:10], v["date"], v["md5"][:12], counts or "?", "*" if v["checked_out"] else ""
        )
    Console().print(table)


@app.command()
def rollback(
    rev: str = typer.Argument(..., help="git revision of a data.dvc commit (see `data versions`)"),
    root: Path | None = typer.Option(None, help="project root (default: checkout)"),
) -> None:
    """Restore data/ to the version committed at REV, byte for byte, and say what changed."""
    from rcgrpo.data.rollback import rollback as do_rollback
    from rcgrpo.data.versioning import VersioningError

    try:
        change = do_rollback(rev, _root(root))
    except VersioningError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        f"data/ is now {change['md5']} (rev {change['rev'][:10]}), was {change['previous_md5']}"
    )
    for what in ("added", "removed", "modified"):
        if change[what]:
            typer.echo(f"  {what}: {', '.join(change[what])}")
    for name, after in sorted(change["rows_after"].items()):
        before = change["rows_before"].get(name, {"high": 0, "low": 0})
        typer.echo(
            f"  {name}: high {before['high']} -> {after['high']}, low {before['low']} -> {after['low']}"
        )
    typer.echo("data.dvc now differs from HEAD: commit it to keep this version, or roll forward.")

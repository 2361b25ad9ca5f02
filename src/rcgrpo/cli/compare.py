"""`rcgrpo compare`: a table across evaluated runs and a bar chart with Wilson 95% intervals.

rcgrpo compare outputs/eval/sft_grpo outputs/eval/rctp_rcgrpo --png outputs/compare.png
"""

from __future__ import annotations

from pathlib import Path

import typer


def compare(
    runs: list[Path] = typer.Argument(..., help="eval output folders (or report.json files)"),
    checker: str = typer.Option("bfcl", help="a check of the reports (BFCL: paper | bfcl)"),
    token: str = typer.Option("high", help="high | low | none"),
    png: Path = typer.Option(Path("outputs/compare.png"), help="bar chart to write"),
) -> None:
    """A table across evaluated runs and a bar chart with Wilson 95% intervals."""
    from rich.console import Console
    from rich.table import Table

    from rcgrpo.evaluation.compare import categories, fmt, load_report, rows
    from rcgrpo.evaluation.plots import bar_chart

    try:
        reports = {p.name if p.is_dir() else p.parent.name: load_report(p) for p in runs}
        table_rows = rows(reports, checker, token)
    except (FileNotFoundError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    names = categories(next(iter(reports.values())))
    table = Table(title=f"{checker} checker, conditioned on {token}")
    for col in (
        "run",
        "protocol",
        "n",
        "pooled [95% CI]",
        "category mean [95% CI]",
        *names,
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
            *(fmt(r[c]) for c in names),
            fmt(r["gap"]),
        )
    Console(width=160).print(table)  # wide: 10 columns must not be truncated
    typer.echo(f"chart: {bar_chart(table_rows, png)}")

"""Evaluation charts as PNG files: accuracy per category with Wilson 95% intervals (one run) and
pooled / category-mean accuracy across runs (`rcgrpo compare`). matplotlib is imported inside
`pyplot()` with the Agg backend (files only: no display on servers).

    .venv/bin/python -c "from rcgrpo.evaluation.plots import accuracy_plot; help(accuracy_plot)"
"""

from __future__ import annotations

from pathlib import Path

from rcgrpo.evaluation.compare import categories, checks


def pyplot():
    """matplotlib.pyplot with the Agg backend (files only: no display on servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, axes, path: Path, legend: int = 8) -> Path:
    """A figure of line charts written out: each of `axes` gridded with a legend, laid out, saved
    as PNG at `path` and closed (pyplot keeps every open figure otherwise)."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def accuracy_plot(report: dict, path: Path, checker: str = ""):
    """Bars per category (+ pooled, category mean) per reward token, Wilson 95% error bars, of
    `checker` ("" = the report's last check: BFCL's official one)."""
    runs = report.get("runs") or {}
    if not runs:
        return None
    plt = pyplot()
    checker = checker or checks(report)[-1]
    names = categories(report)
    labels = [*names, "pooled", "category_mean"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(runs)
    for i, (token, by_seed) in enumerate(sorted(runs.items())):
        s = by_seed[min(by_seed, key=str)][checker]
        cells = [s["per_category"].get(c) for c in names] + [s["pooled"], s["category_mean"]]
        vals = [100 * c["value"] if c else 0.0 for c in cells]
        lo = [100 * (c["value"] - c["low"]) if c else 0.0 for c in cells]
        hi = [100 * (c["high"] - c["value"]) if c else 0.0 for c in cells]
        xs = [j + i * width for j in range(len(labels))]
        ax.bar(xs, vals, width, yerr=[lo, hi], capsize=3, label=f"<|{token}_reward|>")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, fontsize=8)
    ax.set(
        ylim=(0, 100),
        ylabel="accuracy (%)",
        title=f"held-out accuracy, {checker} checker (Wilson 95%)",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bar_chart(table: list[dict], path: str | Path, title: str = "") -> Path:
    """Pooled and category-mean accuracy per run, error bars = Wilson 95% interval."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(table)), 3.6))
    width = 0.38
    for j, key in enumerate(("pooled", "category_mean")):
        xs = [i + (j - 0.5) * width for i in range(len(table))]
        vals = [100 * r[key]["value"] for r in table]
        err = [
            [100 * (r[key]["value"] - r[key]["low"]) for r in table],
            [100 * (r[key]["high"] - r[key]["value"]) for r in table],
        ]
        ax.bar(xs, vals, width, yerr=err, capsize=3, label=key.replace("_", " "))
    ax.set_xticks(range(len(table)), [r["run"] for r in table], rotation=20, ha="right")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    ax.set_title(title or f"{table[0]['checker']} checker, {table[0]['protocol']} protocol")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

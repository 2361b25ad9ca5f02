"""Compare evaluated runs: one table row per run and a bar chart with Wilson 95% intervals.

Reads the report.json that `rcgrpo eval` writes (a folder or the file itself; an MLflow
artifact folder works too). Rows say which protocol and checker each number was measured with,
since numbers under different protocols are not comparable.

    rcgrpo compare outputs/eval/sft_grpo outputs/eval/rctp_rcgrpo --checker bfcl --png cmp.png
"""

from __future__ import annotations

import json
from pathlib import Path

from rcgrpo.bfcl.tasks import CATEGORIES


def load_report(path: str | Path) -> dict:
    path = Path(path)
    file = path / "report.json" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"{file} not found: pass a folder written by `rcgrpo eval`")
    return json.loads(file.read_text())


def rows(reports: dict[str, dict], checker: str = "bfcl", token: str = "high") -> list[dict]:
    """One flat row per run: pooled and category mean with intervals, categories, gap."""
    out = []
    for name, report in reports.items():
        by_seed = report["runs"].get(token)
        if not by_seed:
            raise ValueError(f"run {name!r} was not evaluated with token {token!r}")
        s = by_seed[min(by_seed, key=int)][checker]
        out.append(
            {
                "run": name,
                "protocol": report["protocol"],
                "checker": checker,
                "n": s["pooled"]["n"],
                "pooled": s["pooled"],
                "category_mean": s["category_mean"],
                **{c: s["per_category"].get(c, {}).get("value") for c in CATEGORIES},
                "seed_mean": report["seed_mean"][token][checker]["pooled_mean"],
                "n_seeds": report["seed_mean"][token][checker]["n_seeds"],
                "gap": report["gap"].get(checker, {}).get("mean"),
            }
        )
    return out


def fmt(acc: dict | float | None) -> str:
    if acc is None:
        return "-"
    if isinstance(acc, dict):
        return f"{100 * acc['value']:.1f} [{100 * acc['low']:.1f}, {100 * acc['high']:.1f}]"
    return f"{100 * acc:.1f}"


def bar_chart(table: list[dict], path: str | Path, title: str = "") -> Path:
    """Pooled and category-mean accuracy per run, error bars = Wilson 95% interval."""
    from rcgrpo.report import pyplot

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

"""Compare evaluated runs: one table row per run and a bar chart with Wilson 95% intervals.

Reads the report.json that `rcgrpo stage eval` writes (a folder or the file itself; an MLflow
artifact folder works too). Rows say which protocol and checker each number was measured with,
since numbers under different protocols are not comparable.

    rcgrpo compare outputs/eval/sft_grpo outputs/eval/rctp_rcgrpo --checker bfcl --png cmp.png
"""

from __future__ import annotations

import json
from pathlib import Path


def categories(report: dict) -> list[str]:
    """The report's task categories in the environment's order (a report written before it
    recorded them: those its runs hold, in their order)."""
    if report.get("categories"):
        return list(report["categories"])
    seen: dict[str, None] = {}
    for by_seed in (report.get("runs") or {}).values():
        for checks in by_seed.values():
            for summary in checks.values():
                seen.update(dict.fromkeys(summary["per_category"]))
    return list(seen)


def checks(report: dict) -> list[str]:
    """The report's check names, in the order the environment reports them (BFCL: paper, bfcl)."""
    for by_seed in (report.get("runs") or {}).values():
        for checks_of_seed in by_seed.values():
            return list(checks_of_seed)
    return []


def load_report(path: str | Path) -> dict:
    path = Path(path)
    file = path / "report.json" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"{file} not found: pass a folder written by `rcgrpo stage eval`")
    return json.loads(file.read_text())


def rows(reports: dict[str, dict], checker: str = "bfcl", token: str = "high") -> list[dict]:
    """One flat row per run: pooled and category mean with intervals, every category of the
    first report (`categories`), gap."""
    names = categories(next(iter(reports.values()))) if reports else []
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
                **{c: s["per_category"].get(c, {}).get("value") for c in names},
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

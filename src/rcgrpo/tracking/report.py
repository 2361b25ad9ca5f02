"""The pipeline's report folder: PNG plots and a short markdown summary, from plain data.

`write_report` takes metric histories ({name: [(step, value)]}, e.g. from
`rcgrpo.tracking.runs.metric_histories`), the evaluation report (rcgrpo.evaluation.evaluate's report.json) and
the run's ids/versions, and writes into `reports/<run>/`:

    reward.png          reward/mean (and mean_high / mean_low under RC) per RL step, with a
                        moving average (one step's 20-40 rollouts are a noisy estimate)
    zero_variance.png   rollout/zero_variance_frac and effective_group_frac per RL step
    sft_loss.png        sft/loss per optimizer step of the fine-tuning stage
    accuracy.png        per-category and pooled accuracy with Wilson 95% intervals, per token
    summary.md          versions; success on the RL tasks before and after RL (what RL changed)
                        with the controllability gap; per RL task, the MLflow traces of one
                        successful and one failed episode before and after RL; the RL curves
                        in numbers; held-out accuracy (BFCL: beside the paper's Table 1); the
                        plots

No mlflow or prefect here (flows/pipeline.py logs the folder to MLflow). matplotlib is imported
inside the plotting function with the Agg backend (no display on servers).

    .venv/bin/python -c "from rcgrpo.tracking.report import write_report; help(write_report)"
"""

from __future__ import annotations

import json
from pathlib import Path

from rcgrpo.evaluation.compare import checks
from rcgrpo.evaluation.plots import accuracy_plot, pyplot, save

PAPER_TABLE1 = {  # pooled accuracy (%) on the 80 test tasks, Qwen2.5-7B / Llama-3.1-8B
    "base model": (11.25, 0.00),
    "SFT + GRPO": (48.75, 35.00),
    "SFT + RC-GRPO": (46.25, 35.00),
    "RCTP-FT + GRPO": (73.75, 46.25),
    "RCTP-FT + RC-GRPO": (85.00, 48.75),
}


def line_plot(series: dict[str, list[tuple[int, float]]], title: str, ylabel: str, path: Path):
    """One line per named series; skipped (None) when every series is empty."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, points in series.items():
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=name)
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    return save(fig, [ax], path)


def _pct(a: dict | None) -> str:
    if not a:
        return "-"
    return f"{100 * a['value']:.1f} [{100 * a['low']:.1f}, {100 * a['high']:.1f}]"


def moving_average(points: list[tuple[int, float]], window: int = 5) -> list[tuple[int, float]]:
    """Trailing mean over the last `window` points: [(step, mean of values up to step)]."""
    out = []
    for i, (step, _) in enumerate(points):
        chunk = [v for _, v in points[max(0, i - window + 1) : i + 1]]
        out.append((step, sum(chunk) / len(chunk)))
    return out


def _pooled(report: dict, token: str) -> dict | None:
    """The pooled accuracy of the report's first check (its reward: BFCL's paper R)."""
    by_seed = (report.get("runs") or {}).get(token) or {}
    return by_seed[min(by_seed, key=str)][checks(report)[0]]["pooled"] if by_seed else None


def _count(a: dict | None) -> str:
    if not a:
        return "-"
    return f"{a['k']:g}/{a['n']:g} = {_pct(a)}"


def rl_tasks_markdown(rl_tasks: dict, rl: dict) -> list[str]:
    """Success on the RL tasks before/after RL per goal, the gap, and the RL curves in numbers."""
    lines = []
    if rl_tasks:
        tokens = sorted({t for r in rl_tasks.values() for t in (r.get("runs") or {})})
        first = next(iter(rl_tasks.values()))
        check = (checks(first) or ["-"])[0]
        lines += [
            "## On the tasks RL trained on: before and after RL",
            "",
            f"{first.get('n_tasks')} tasks, `{check}` check (the reward), "
            f"protocol `{first.get('protocol')}`, greedy; % [Wilson 95%]",
            "",
            "| reward goal | before RL | after RL |",
            "|---|---|---|",
        ]
        for token in tokens:
            cells = [_count(_pooled(rl_tasks.get(w, {}), token)) for w in ("before", "after")]
            lines.append(f"| {token} | {cells[0]} | {cells[1]} |")
        gaps = [(rl_tasks.get(w, {}).get("gap") or {}).get(check) for w in ("before", "after")]
        if any(gaps):
            cells = [f"{100 * g['mean']:+.1f} points" if g else "-" for g in gaps]
            lines.append(f"| gap (high - low) | {cells[0]} | {cells[1]} |")
        lines.append("")
    curve = rl.get("reward/mean") or []
    if curve:
        k = max(1, len(curve) // 4)
        head, tail = (sum(v for _, v in part) / len(part) for part in (curve[:k], curve[-k:]))
        zv = [v for _, v in rl.get("rollout/zero_variance_frac") or []]
        eff = [v for _, v in rl.get("rollout/effective_group_frac") or []]
        lines += [
            "## RL curves",
            "",
            f"- `reward/mean`: {head:.3f} over the first {k} steps -> {tail:.3f} over the "
            f"last {k} ({len(curve)} steps)",
            f"- `rollout/zero_variance_frac` (groups with no GRPO signal): mean "
            f"{sum(zv) / max(1, len(zv)):.3f}, max {max(zv, default=0):.3f}",
            f"- `rollout/effective_group_frac` (trained groups with a signal, of tasks_per_step): "
            f"mean {sum(eff) / max(1, len(eff)):.3f}, min {min(eff, default=0):.3f}",
            "",
        ]
    return lines


def example_traces(traces: list[dict], headline: str) -> dict[str, dict[str, dict]]:
    """{task_id: {"success" | "failure": trace}}: per task the first successful and the first
    failed episode (traces: {"trace_id", "task_id", "goal", "outcome", ...} in written order),
    preferring episodes under the `headline` reward goal."""
    ranked = sorted(traces, key=lambda t: t.get("goal") != headline)  # stable: headline first
    out: dict[str, dict[str, dict]] = {}
    for t in ranked:
        out.setdefault(t["task_id"], {}).setdefault(t["outcome"], t)
    return out


def traces_markdown(rl_traces: dict, headline: str) -> list[str]:
    """The table of example traces per RL task, before and after RL (rl_traces: {"before" |
    "after": traces with a "url"})."""
    if not any(rl_traces.values()):
        return []
    picks = {w: example_traces(rl_traces.get(w) or [], headline) for w in ("before", "after")}
    tasks = sorted({task for p in picks.values() for task in p})

    def cell(when: str, task: str, outcome: str) -> str:
        t = picks[when].get(task, {}).get(outcome)
        if not t:
            return "-"
        goal = "" if t.get("goal") == headline else f" ({t.get('goal')})"
        return f"[{t['trace_id'][:11]}]({t.get('url', '')}){goal}"

    lines = [
        "## Episodes of the RL tasks as MLflow traces",
        "",
        "One successful and one failed episode per task, before and after RL (greedy, "
        f"reward goal `{headline}` unless named; `-`: none). Open them with `rcgrpo ui`; "
        "search them with `mlflow.search_traces(filter_string=\"tags.task_id = '<task>' "
        "AND tags.outcome = 'failure'\")`.",
        "",
        "| task | before RL: success | before RL: failure | after RL: success | "
        "after RL: failure |",
        "|---|---|---|---|---|",
    ]
    for task in tasks:
        cells = [cell(w, task, o) for w in ("before", "after") for o in ("success", "failure")]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def summary_markdown(
    info: dict,
    report: dict,
    plots: list[Path],
    table: str = "",
    rl_tasks: dict | None = None,
    rl: dict | None = None,
    rl_traces: dict | None = None,
) -> str:
    lines = [f"# rcgrpo pipeline run {info.get('run_id', '')}", ""]
    for key in (
        "variant",
        "profile",
        "data_version",
        "git_commit",
        "model_version",
        "mlflow_ui",
        "started",
    ):
        if info.get(key):
            lines.append(f"- **{key.replace('_', ' ')}**: {info[key]}")
    if info.get("rollouts_skipped"):  # the data stage's own-policy failures were not made
        lines.append(
            f"- **data**: own-policy failures skipped ({info['rollouts_skipped']}): "
            "the low half is perturbations only"
        )
    lines.append("")
    lines += rl_tasks_markdown(rl_tasks or {}, rl or {})
    lines += traces_markdown(rl_traces or {}, info.get("headline_goal") or "high")
    runs = report.get("runs") or {}
    if runs:
        lines += [
            "## Held-out accuracy (first seed, %, Wilson 95%)",
            "",
            f"protocol `{report.get('protocol')}`, {report.get('n_tasks')} tasks",
            "",
            "| token | checker | pooled | category mean |",
            "|---|---|---|---|",
        ]
        for token, by_seed in sorted(runs.items()):
            first = by_seed[min(by_seed, key=str)]
            for checker, s in first.items():
                lines.append(
                    f"| {token} | {checker} | {_pct(s['pooled'])} | {_pct(s['category_mean'])} |"
                )
        for checker, gap in (report.get("gap") or {}).items():
            lines.append(f"\ncontrollability gap ({checker}): {100 * gap['mean']:+.1f} points")
        if info.get("profile") == "tiny" and info.get("env", "bfcl") == "bfcl":
            lines.append(
                "\nRead this honestly: the `tiny` profile is a 1M-parameter model fine-tuned for "
                "minutes on a handful of short tasks. It is not expected to solve held-out BFCL "
                "(about 0 % is the expected result); the method shows on the RL tasks above. "
                "A 7B profile on a GPU is what compares with the paper."
            )
        lines.append("")
    if info.get("env", "bfcl") == "bfcl":  # the paper's numbers are BFCL's
        lines += paper_table()
    if table:
        lines += ["", "## Evaluation table", "", table]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines) + "\n"


def paper_table() -> list[str]:
    """The paper's Table 1 beside which BFCL's held-out accuracy reads."""
    lines = [
        "## The paper's Table 1 (pooled %, n = 80; one s.e. is about 4-5 points)",
        "",
        "| method | Qwen2.5-7B | Llama-3.1-8B |",
        "|---|---|---|",
    ]
    lines += [f"| {m} | {q:.2f} | {ll:.2f} |" for m, (q, ll) in PAPER_TABLE1.items()]
    lines.append("\nCompare like with like: the paper's rows are 7B/8B models. The pooled")
    lines.append("`paper` checker row under the headline goal and protocol is the paper's metric.")
    return lines


def write_report(
    out_dir: Path,
    info: dict,
    rl_history: dict[str, list[tuple[int, float]]] | None = None,
    sft_history: dict[str, list[tuple[int, float]]] | None = None,
    eval_report: dict | None = None,
    table: str = "",
    rl_tasks: dict | None = None,
    rl_traces: dict | None = None,
) -> Path:
    """Write plots and summary.md into `out_dir`; returns summary.md's path. rl_tasks: the
    evaluation reports on the RL tasks, {"before": report, "after": report}; rl_traces: their
    episode traces, {"before" | "after": [{"trace_id", "url", "task_id", "goal", "outcome"}]}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rl, sft, report = rl_history or {}, sft_history or {}, eval_report or {}
    rewards = {k: rl.get(k, []) for k in ("reward/mean", "reward/mean_high", "reward/mean_low")}
    rewards["reward/mean (moving average, 5 steps)"] = moving_average(rl.get("reward/mean", []))
    plots = [
        line_plot(rewards, "RL training reward", "reward", out / "reward.png"),
        line_plot(
            {
                k: rl.get(k, [])
                for k in ("rollout/zero_variance_frac", "rollout/effective_group_frac")
            },
            "groups with zero reward variance (no GRPO signal); groups trained with one",
            "fraction",
            out / "zero_variance.png",
        ),
        line_plot(
            {"sft/loss": sft.get("sft/loss", [])},
            "fine-tuning loss",
            "CE / token",
            out / "sft_loss.png",
        ),
        accuracy_plot(report, out / "accuracy.png"),
    ]
    plots = [p for p in plots if p is not None]
    summary = out / "summary.md"
    summary.write_text(summary_markdown(info, report, plots, table, rl_tasks, rl, rl_traces))
    (out / "info.json").write_text(json.dumps(info, indent=1, default=str))
    return summary

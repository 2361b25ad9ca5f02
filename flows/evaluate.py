"""Prefect flow: held-out BFCL evaluation of a saved model (`rcgrpo.evaluation.evaluate`) as one MLflow
run nested under the pipeline's run.

Writes, beside the evaluation's own report.json / outcomes.jsonl / bfcl_results/, a markdown
table `table.md` (pooled, category mean and per category with Wilson 95% intervals, both
checkers, every reward token) and logs all of it to MLflow with the flat `eval/...` metrics.
Every evaluation episode (params.yaml `traces:`) is also written as an MLflow trace of the run,
tagged with its task, goal and reward (rcgrpo.tracking.traces); the flow returns their ids.

    .venv/bin/python flows/evaluate.py outputs/rl/final '{"limit": 2}'
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rcgrpo.config import load_section
from rcgrpo.runtime import apply_defaults, project_root
from rcgrpo.tracking import runs as tracking

apply_defaults()

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")


def eval_config(overrides: dict | None = None, root: Path | None = None):
    from rcgrpo.evaluation.config import EvalConfig

    cfg = load_section("eval", EvalConfig, overrides=dict(overrides or {}))
    out = Path(cfg.out_dir)
    out = out if out.is_absolute() else Path(root or project_root()) / out
    return dataclasses.replace(cfg, out_dir=str(out))


def _fmt(a: dict | None) -> str:
    if not a:
        return "-"
    return f"{100 * a['value']:.1f} [{100 * a['low']:.1f}, {100 * a['high']:.1f}]"


def table_markdown(report: dict) -> str:
    """The evaluation table: one row per (protocol, checker, token, seed), % with Wilson 95%
    intervals; the headline protocol first, then the other one (reported beside it)."""
    head = "| protocol | checker | token | seed | n | pooled | category mean | "
    lines = [head + " | ".join(CATEGORIES) + " |", "|" + "---|" * (7 + len(CATEGORIES))]
    parts = [report, *(report.get("other_protocols") or {}).values()]
    for part in parts:
        for token, by_seed in part["runs"].items():
            for seed, s in by_seed.items():
                for checker, summary in s.items():
                    cats = summary["per_category"]
                    n = summary["pooled"].get("n", part.get("n_tasks", ""))
                    cells = [part["protocol"], checker, token, str(seed), str(n),
                             _fmt(summary["pooled"]), _fmt(summary["category_mean"]),
                             *(_fmt(cats.get(c)) for c in CATEGORIES)]  # fmt: skip
                    lines.append("| " + " | ".join(cells) + " |")
    for checker, gap in report.get("gap", {}).items():
        lines.append(f"\ncontrollability gap ({checker}): {100 * gap['mean']:+.1f} points")
    temperature = (report.get("config") or {}).get("temperature", 0.0)
    decoding = "greedy" if not temperature else f"temperature {temperature}"
    lines.append(f"\nheadline protocol: {report['protocol']} (the model's training protocol by "
                 f"default), tasks: {report['n_tasks']}, {decoding} decoding")  # fmt: skip
    return "\n".join(lines) + "\n"


@task(cache_policy=NO_CACHE)
def score(
    cfg, model_cfg, rollout_cfg, model_path: str, run_id: str, prefix: str, execution=None,
    traces_cfg=None, name: str = "eval",
) -> tuple[dict, list[dict]]:  # fmt: skip
    """The evaluation report, and the episode traces written ({"trace_id", **tags} each)."""
    from rcgrpo.evaluation.evaluate import run_eval

    to_mlflow = tracking.metrics_logger(run_id)

    def log(metrics: dict, step: int) -> None:  # eval/x -> <prefix>/x
        to_mlflow({prefix + k.removeprefix("eval"): v for k, v in metrics.items()}, step)

    from rcgrpo.rollout.execution import ExecutionConfig, session

    tracer = hook = None
    if traces_cfg is not None and traces_cfg.enabled and traces_cfg.eval_every:
        from rcgrpo.tracking import traces

        tracer = traces.EpisodeTracer(run_id, traces_cfg, {"variant": traces.run_variant(run_id)})
        hook = traces.eval_hook(tracer, name)
    with session(load_section("execution", ExecutionConfig, overrides=execution)) as backend:
        tracking.set_tags(run_id, backend.tags())  # the Ray job this stage's rollouts ran as
        report = run_eval(cfg, model_cfg, model_path, rollout_cfg, log_metrics=log,
                          backend=backend, on_rollouts=hook)  # fmt: skip
    if tracer is None:
        return report, []
    tracking.log_metrics(run_id, tracer.metrics(), 0)
    return report, tracer.written


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def log_outputs(run_id: str, out_dir: str) -> None:
    tracking.log_artifact(run_id, out_dir, "eval")


@flow(name="rcgrpo-evaluate", log_prints=True)
def evaluate_flow(
    model_path: str,
    parent_run_id: str | None = None,
    overrides: dict | None = None,
    model_overrides: dict | None = None,
    rollout_overrides: dict | None = None,
    name: str = "eval",
    prefix: str = "eval",
    trace_overrides: dict | None = None,
) -> dict:
    """Evaluate `model_path`; {"run_id", "report" (path), "table" (path), "metrics", "traces"
    (the episode traces: {"trace_id", **tags} each)}. Metric names start with `prefix`
    (eval/..., or rl_tasks/before/... for the RL-task evaluations)."""
    from flows.train import model_config, rollout_config, traces_config
    from rcgrpo.evaluation.evaluate import flat_metrics, resolve_protocol

    cfg = resolve_protocol(eval_config(overrides), model_path)
    model_cfg = model_config(model_overrides)
    rollout_cfg = rollout_config(rollout_overrides)
    traces_cfg = traces_config(trace_overrides)
    config = {"eval": dataclasses.asdict(cfg), "model": dataclasses.asdict(model_cfg),
              "rollout": dataclasses.asdict(rollout_cfg), "model_path": model_path,
              "traces": dataclasses.asdict(traces_cfg)}  # fmt: skip
    with tracking.start_run(name, config=config, parent_run_id=parent_run_id,
                            tags={"stage": "eval"}) as run:  # fmt: skip
        run_id = run.info.run_id
        report, traces = score(cfg, model_cfg, rollout_cfg, model_path, run_id, prefix,
                               traces_cfg=traces_cfg, name=name)  # fmt: skip
        out = Path(cfg.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        report_path = out / "report.json"
        if not report_path.exists():  # run_eval writes it; keep a copy if it did not
            report_path.write_text(json.dumps(report, indent=1))
        table = out / "table.md"
        table.write_text(table_markdown(report))
        metrics = flat_metrics(report, prefix)  # run_eval wrote eval/... to metrics.json too
        log_outputs(run_id, str(out))
    print(table.read_text())
    return {"run_id": run_id, "report": str(report_path), "table": str(table), "metrics": metrics,
            "traces": traces}  # fmt: skip


if __name__ == "__main__":
    evaluate_flow(sys.argv[1], overrides=json.loads(sys.argv[2]) if len(sys.argv) > 2 else None)

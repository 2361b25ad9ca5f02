"""Prefect flow: held-out evaluation of a saved model on the run's environment (`rcgrpo.evaluation.evaluate`) as one MLflow
run nested under the pipeline's run.

Writes, beside the evaluation's own report.json / outcomes.jsonl / bfcl_results/, a markdown
table `table.md` (pooled, category mean and per category with Wilson 95% intervals, both
checkers, every reward token) and logs all of it to MLflow with the flat `eval/...` metrics.
Every evaluation episode (params.yaml `traces:`) is also written as an MLflow trace of the run,
tagged with its task, goal and reward (rcgrpo.tracking.traces); the flow returns their ids.

It takes the run's resolved settings (rcgrpo.run_config.RunConfig); `eval_cfg` replaces its
`eval:` section for one evaluation (the pipeline's RL-task evaluation before and after RL).

    rcgrpo run --stages eval                       # through the pipeline
    rcgrpo eval outputs/rl/final --set limit=2     # the same evaluation without Prefect/MLflow
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rcgrpo.evaluation.compare import categories
from rcgrpo.run_config import RunConfig
from rcgrpo.runtime import apply_defaults
from rcgrpo.tracking import runs as tracking

apply_defaults()


def _fmt(a: dict | None) -> str:
    if not a:
        return "-"
    return f"{100 * a['value']:.1f} [{100 * a['low']:.1f}, {100 * a['high']:.1f}]"


def table_markdown(report: dict) -> str:
    """The evaluation table: one row per (protocol, checker, token, seed), % with Wilson 95%
    intervals; the headline protocol first, then the other one (reported beside it)."""
    head = "| protocol | checker | token | seed | n | pooled | category mean | "
    names = categories(report)
    lines = [head + " | ".join(names) + " |", "|" + "---|" * (7 + len(names))]
    parts = [report, *(report.get("other_protocols") or {}).values()]
    for part in parts:
        for token, by_seed in part["runs"].items():
            for seed, s in by_seed.items():
                for checker, summary in s.items():
                    cats = summary["per_category"]
                    n = summary["pooled"].get("n", part.get("n_tasks", ""))
                    cells = [
                        part["protocol"],
                        checker,
                        token,
                        str(seed),
                        str(n),
                        _fmt(summary["pooled"]),
                        _fmt(summary["category_mean"]),
                        *(_fmt(cats.get(c)) for c in names),
                    ]
                    lines.append("| " + " | ".join(cells) + " |")
    for checker, gap in report.get("gap", {}).items():
        lines.append(f"\ncontrollability gap ({checker}): {100 * gap['mean']:+.1f} points")
    temperature = (report.get("config") or {}).get("temperature", 0.0)
    decoding = "greedy" if not temperature else f"temperature {temperature}"
    lines.append(
        f"\nheadline protocol: {report['protocol']} (the model's training protocol by "
        f"default), tasks: {report['n_tasks']}, {decoding} decoding"
    )
    return "\n".join(lines) + "\n"


@task(cache_policy=NO_CACHE)
def score(
    cfg, rc: RunConfig, model_path: str, run_id: str, prefix: str, name: str = "eval"
) -> tuple[dict, list[dict]]:
    """The evaluation report, and the episode traces written ({"trace_id", **tags} each)."""
    from rcgrpo.envs import get
    from rcgrpo.evaluation.evaluate import run_eval

    to_mlflow = tracking.metrics_logger(run_id)

    def log(metrics: dict, step: int) -> None:  # eval/x -> <prefix>/x
        to_mlflow({prefix + k.removeprefix("eval"): v for k, v in metrics.items()}, step)

    from rcgrpo.rollout.execution import session

    tracer = hook = None
    if rc.traces.enabled and rc.traces.eval_every:
        from rcgrpo.tracking import traces

        tracer = traces.EpisodeTracer(run_id, rc.traces, {"variant": traces.run_variant(run_id)})
        hook = traces.eval_hook(tracer, name)
    env = get(rc.env)  # the run's environment (its limits for this process's tool workers)
    with session(rc.execution) as backend:
        tracking.set_tags(run_id, backend.tags())  # the Ray job this stage's rollouts ran as
        report = run_eval(
            cfg,
            rc.model,
            model_path,
            env,
            rc.rollout,
            log_metrics=log,
            backend=backend,
            on_rollouts=hook,
        )
    if tracer is None:
        return report, []
    tracking.log_metrics(run_id, tracer.metrics(), 0)
    return report, tracer.written


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def log_outputs(run_id: str, out_dir: str) -> None:
    tracking.log_artifact(run_id, out_dir, "eval")


@flow(name="rcgrpo-evaluate", log_prints=True, validate_parameters=False)
def evaluate_flow(
    model_path: str,
    rc: RunConfig,
    parent_run_id: str | None = None,
    name: str = "eval",
    prefix: str = "eval",
    eval_cfg=None,
) -> dict:
    """Evaluate `model_path` under `rc` (its `eval:` section, or `eval_cfg`); {"run_id",
    "report" (path), "table" (path), "metrics", "traces" (the episode traces: {"trace_id",
    **tags} each)}. Metric names start with `prefix` (eval/..., or rl_tasks/before/... for the
    RL-task evaluations)."""
    from rcgrpo.envs import get
    from rcgrpo.evaluation.evaluate import flat_metrics, resolve_protocol

    cfg = resolve_protocol(eval_cfg or rc.eval, get(rc.env), model_path)
    config = {"eval": dataclasses.asdict(cfg), "model_path": model_path}
    config |= {k: dataclasses.asdict(getattr(rc, k)) for k in ("model", "rollout", "traces", "env")}
    with tracking.start_run(
        name, config=config, parent_run_id=parent_run_id, tags={"stage": "eval"}
    ) as run:
        run_id = run.info.run_id
        report, traces = score(cfg, rc, model_path, run_id, prefix, name=name)
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
    paths = {"report": str(report_path), "table": str(table)}
    return {"run_id": run_id, **paths, "metrics": metrics, "traces": traces}

"""One evaluation as a stage, logged to MLflow: the body of `rcgrpo stage eval`,
`eval_rl_tasks_before` and `eval_rl_tasks_after`, the one way an evaluation runs (dvc.yaml, the
pipeline's Prefect flow, a user at the command line).

`eval` scores a saved model on the held-out tasks (params.yaml `eval:`); the two RL-task stages
score the fine-tuned model (before) and the RL model (after) on the tasks RL trained on, with the
held-out evaluation's goals, temperature and seeds: what RL itself changed. Each writes, beside
rcgrpo.evaluation.evaluate's report.json / outcomes.jsonl / bfcl_results/, a markdown table
`table.md` (pooled, category mean and per category with Wilson 95% intervals, both checkers,
every reward goal), logs its settings, the flat `<prefix>/...` metrics, the episode traces
(params.yaml `traces:`) and the output folder to its MLflow run (the one given, else one of its
own named after the stage, in the project's store or MLFLOW_TRACKING_URI's).

    rcgrpo stage eval --model outputs/rl/final --set eval.tokens=[high,low]
    rcgrpo stage eval_rl_tasks_after --config outputs/eval_rl_tasks/after/run_config.json
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rcgrpo.evaluation.compare import categories
from rcgrpo.run_config import RunConfig, stage_dir
from rcgrpo.tracking import runs as tracking

PREFIXES = {
    "eval": "eval",
    "eval_rl_tasks_before": "rl_tasks/before",
    "eval_rl_tasks_after": "rl_tasks/after",
}


def default_model(rc: RunConfig, stage: str) -> str:
    """The model a stage scores unless told: the fine-tuned one RL starts from (before RL, or
    the held-out evaluation of a run without RL), else the RL stage's final model."""
    rl_final = str(Path(rc.rl.out_dir) / "final")
    if stage == "eval_rl_tasks_before" or (stage == "eval" and "rl" not in rc.plan.stages):
        return rc.rl.start_path
    return rl_final


def eval_section(rc: RunConfig, stage: str):
    """The `eval:` section the stage runs with: the held-out one, or the same goals,
    temperature and seeds on the RL tasks (split train, rl.tasks_from) into the stage's folder."""
    if stage == "eval":
        return rc.eval
    return dataclasses.replace(
        rc.eval,
        split="train",
        task_file=rc.rl.tasks_from,
        other_protocol=False,
        out_dir=str(stage_dir(rc, stage)),
    )


def run_evaluation(rc: RunConfig, stage: str, model_path: str, run_id: str | None = None) -> dict:
    """Evaluate `model_path` as `stage` says; {"run_id", "report" (path), "table" (path),
    "metrics", "traces" ({"trace_id", **tags} each)}. Logs into MLflow run `run_id`, else into
    a run of its own named after the stage."""
    from rcgrpo.envs import get
    from rcgrpo.evaluation.evaluate import resolve_protocol

    if not Path(model_path).is_dir():  # before any model loads: one line
        raise FileNotFoundError(
            f"{model_path} is not a folder: pass one written by save_policy, e.g. outputs/rl/final"
        )
    cfg = resolve_protocol(eval_section(rc, stage), get(rc.env), model_path)
    config = {"eval": dataclasses.asdict(cfg), "model_path": str(model_path)}
    config |= {k: dataclasses.asdict(getattr(rc, k)) for k in ("model", "rollout", "traces", "env")}
    if run_id is not None:
        tracking.log_params(run_id, config)
        tracking.log_dict(run_id, config, "config.json")
        return _evaluate(rc, stage, cfg, model_path, run_id)
    with tracking.start_run(stage, config=config, tags={"stage": "eval"}) as run:
        return _evaluate(rc, stage, cfg, model_path, run.info.run_id)


def _evaluate(rc: RunConfig, stage: str, cfg, model_path: str, run_id: str) -> dict:
    from rcgrpo.envs import get
    from rcgrpo.evaluation.evaluate import flat_metrics, run_eval
    from rcgrpo.rollout.execution import session

    prefix = PREFIXES[stage]
    to_mlflow = tracking.metrics_logger(run_id)

    def log(metrics: dict, step: int) -> None:  # eval/x -> <prefix>/x
        to_mlflow({prefix + k.removeprefix("eval"): v for k, v in metrics.items()}, step)

    tracer = hook = None
    if rc.traces.enabled and rc.traces.eval_every:
        from rcgrpo.tracking import traces

        tracer = traces.EpisodeTracer(run_id, rc.traces, {"variant": traces.run_variant(run_id)})
        hook = traces.eval_hook(tracer, stage)
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
    if tracer is not None:
        tracking.log_metrics(run_id, tracer.metrics(), 0)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "report.json"
    if not report_path.exists():  # run_eval writes it; keep a copy if it did not
        report_path.write_text(json.dumps(report, indent=1))
    table = out / "table.md"
    table.write_text(table_markdown(report))
    tracking.log_artifact(run_id, out, "eval")
    print(table.read_text(), flush=True)
    return {
        "run_id": run_id,
        "report": str(report_path),
        "table": str(table),
        "metrics": flat_metrics(report, prefix),  # run_eval wrote eval/... to metrics.json too
        "traces": tracer.written if tracer is not None else [],
    }


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

"""The whole rcgrpo pipeline as one Prefect flow and one MLflow run with a nested run per stage:

    build_dataset (experts + failures, GX validation, DVC version)
      -> fine-tune (RCTP-FT, or plain SFT: the variant's `init`, rcgrpo.evaluation.variants)
      -> RL (RC-GRPO / GRPO from the fine-tuned model, on the fine-tuning tasks)
      -> evaluate (greedy: the RL tasks before and after RL, then the held-out BFCL tasks;
                   both checkers, Wilson intervals, under the variant's reward goals)
      -> register the RL model in the MLflow Model Registry (data version, config, eval metrics)
      -> reports/<pipeline run id>/ (PNG plots + summary.md with links to the episode traces of
         one success and one failure per RL task, before and after RL), also logged to MLflow

Every stage runs as `rcgrpo stage NAME` in a process of its own (rcgrpo.tracking.stage_process:
a plain child, torchrun ranks for a training stage on `--procs N`), the command dvc.yaml runs:
this process opens the MLflow runs, relays the stages' output and passes paths and run ids, and
never loads a model or initialises CUDA; a stage's GPU memory goes back when its process exits.
Every stage takes the run's settings as resolved once by `rcgrpo run` (rcgrpo.run_config.
RunConfig: params.yaml, the preset, the `--set`s and the variant); nothing here reads
params.yaml. The RunConfig is logged on the pipeline run as run_config.json (and written beside
the report).

    rcgrpo run --set rl.steps=2 --set eval.limit=1          # the CLI front (rcgrpo.cli.pipeline)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.evaluate import evaluate_flow
from rcgrpo.run_config import RunConfig
from rcgrpo.run_lock import hold as hold_run_lock
from rcgrpo.runtime import apply_defaults, project_root
from rcgrpo.tracking import orphans, registry
from rcgrpo.tracking import runs as tracking
from rcgrpo.tracking.retention import prune_after_run
from rcgrpo.tracking.stage_process import run_stage_process

apply_defaults()


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def register(rl_run_id: str, name: str, config: dict, metrics: dict) -> str:
    mv = registry.register_model(
        rl_run_id, "model", name, config, metrics, description="RL model of an rcgrpo pipeline run"
    )
    return f"{name}/{mv.version}"


@task(cache_policy=NO_CACHE)
def build_data(rc: RunConfig) -> dict:
    """The data stage's process (`rcgrpo stage data`: compute, so no retries): rev, md5, counts,
    rollouts summary."""
    return run_stage_process("data", rc)


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def write_and_log_report(
    run_id: str,
    out_dir: str,
    info: dict,
    rl_run: str | None,
    ft_run: str | None,
    eval_report: str | None,
    table: str | None,
    rl_tasks: dict,
    rl_traces: dict | None = None,
) -> str:
    from rcgrpo.tracking.report import write_report

    rl = registry.metric_histories(rl_run) if rl_run else {}
    sft = registry.metric_histories(ft_run) if ft_run else {}
    report = json.loads(Path(eval_report).read_text()) if eval_report else {}
    text = Path(table).read_text() if table else ""
    before_after = {k: json.loads(Path(p).read_text()) for k, p in rl_tasks.items()}
    summary = write_report(Path(out_dir), info, rl, sft, report, text, before_after, rl_traces)
    tracking.log_artifact(run_id, out_dir, "report")
    return str(summary)


@flow(name="rcgrpo-pipeline", log_prints=True, validate_parameters=False)
def pipeline_flow(
    rc: RunConfig | dict | None = None,
    register_name: str = "rcgrpo",
    report_root: str = "reports",
    resume: bool = False,
    settings: dict | None = None,
) -> dict:
    """Run rc.plan.stages in order, each in its own process; returns paths, run ids, the model
    version. The recipe is the RL section's (one of the paper's four, rcgrpo.evaluation.
    variants, when it matches one). `rc` may be its JSON form (RunConfig.to_dict); None: a
    scheduled run, resolved now from params.yaml as it is and `settings` ({"sets", "stages",
    "preset", "variant"}, each optional: rcgrpo.run_config.resolve). `resume`: continue the run
    last started in this project (rcgrpo.tracking.orphans): its MLflow runs, its completed
    stages skipped, RL from its last checkpoint."""
    from flows.train import train_flow
    from rcgrpo.evaluation.variants import recipe
    from rcgrpo.run_config import resolve

    if rc is None:  # a scheduled run: the params.yaml of now, as `rcgrpo run` would resolve it
        rc = resolve(None, **(settings or {}))
    rc = rc if isinstance(rc, RunConfig) else RunConfig.from_dict(rc, "pipeline_flow(rc=...)")
    stages, v, preset = rc.plan.stages, recipe(rc.rl), rc.plan.preset
    out: dict = {"stages": list(stages), "variant": v.name, "preset": preset}
    config = rc.to_dict()
    hold_run_lock(project_root())  # one run at a time (a scheduled one too), before the store
    orphans.fail_killed_pipelines()  # under the lock: a RUNNING pipeline run is a killed one's
    state = orphans.interrupted(rc) if resume else None  # one line if it cannot
    with tracking.start_run(
        "pipeline",
        config=config,
        tags={"stage": "pipeline", "variant": v.name},
        run_id=state and state["run_id"],
    ) as run:
        pid = run.info.run_id
        out["run_id"] = pid
        state = state or orphans.start(pid, config)
        report_dir = Path(report_root)
        report_dir = report_dir if report_dir.is_absolute() else project_root() / report_dir
        log_run_config(pid, rc, str(report_dir / pid))
        if "data" in stages and orphans.data_complete(state):
            print("data: complete in the interrupted run (data/ at its version): skipped")
        elif "data" in stages:
            if "data" in state["done"]:
                print("data: data/ is not the version the interrupted run built: built again")
            built = build_data(rc)
            out["data"] = {k: built.get(k) for k in ("rev", "md5", "counts") if k in built}
            if skipped := (built.get("rollouts") or {}).get("skipped"):
                out["data"]["rollouts_skipped"] = skipped  # the report and the summary say so
            tracking.log_metrics(pid, _counts(built.get("counts") or {}), 0)
            orphans.record(state, "data", out["data"])
        # the data version as it is now (after the build), on the pipeline run itself
        dv = tracking.data_version()
        version = f"{dv['rev'][:12]}:{dv['md5']}"
        tracking.set_tags(
            pid, {f"data.{k}": val for k, val in dv.items()} | {"data.version": version}
        )
        out["data_version"] = version
        ft = rl = ev = None
        rl_traces: dict = {}
        if "finetune" in stages and (ft := orphans.model_complete(state, v.init)):
            print(f"{v.init}: complete in the interrupted run ({ft['model_path']}): skipped")
        elif "finetune" in stages:
            if v.init in state["done"]:
                print(f"{v.init}: the interrupted run's model is gone: trained again, RL anew")
            ft = train_flow(v.init, rc, pid)
            orphans.record(state, v.init, ft)
        if ft:
            out["finetune"] = {"run_id": ft["run_id"], "model_path": ft["model_path"]}
        if "rl" in stages:
            rl_rc = rc
            if ft:  # RL starts from the model this run fine-tuned
                rl_cfg = dataclasses.replace(rc.rl, init_path=ft["model_path"])
                rl_rc = dataclasses.replace(rc, rl=rl_cfg)
            rl = train_flow("rl", rl_rc, pid, state=state)  # records its run; resumes it
            out["rl"] = {"run_id": rl["run_id"], "model_path": rl["model_path"]}
        last = rl or ft
        if "eval" in stages and last:
            out["rl_tasks"], rl_traces = evaluate_rl_tasks(pid, rc, ft, rl)
            ev = evaluate_flow(last["model_path"], rc, pid, "eval")
            out["eval"] = {k: ev[k] for k in ("run_id", "report", "table")}
            tracking.log_metrics(pid, ev["metrics"], 0)
        if last:
            metrics = ev["metrics"] if ev else {}
            out["model_version"] = register(last["run_id"], register_name, last["config"], metrics)
            tracking.set_tags(pid, {"model_version": out["model_version"]})
        info = {
            "run_id": pid,
            "variant": v.name,
            "preset": preset,
            "profile": rc.model.profile,
            "env": rc.env.name,
            "data_version": out["data_version"],
            "git_commit": run.data.tags.get("git.commit"),
            "model_version": out.get("model_version"),
            "mlflow_ui": "rcgrpo ui, then " + registry.run_url(pid),
            "headline_goal": rc.eval.tokens[0],
            "rollouts_skipped": (out.get("data") or {}).get("rollouts_skipped"),
        }
        out["report"] = write_and_log_report(
            pid,
            str(report_dir / pid),
            info,
            rl and rl["run_id"],
            ft and ft["run_id"],
            ev and ev["report"],
            ev and ev["table"],
            out.get("rl_tasks") or {},
            rl_traces,
        )
        orphans.finished(state)
    out["pruned"] = prune_after_run(project_root(), rc)  # retention:, still under the lock
    print(json.dumps(out, indent=1, default=str))
    return out


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def log_run_config(run_id: str, rc: RunConfig, folder: str) -> None:
    """run_config.json in the run's report folder and on its MLflow run (I/O: retried)."""
    tracking.log_artifact(run_id, rc.write(Path(folder) / "run_config.json"))


def evaluate_rl_tasks(
    pid: str, rc: RunConfig, ft: dict | None, rl: dict | None
) -> tuple[dict, dict]:
    """Greedy success on the tasks RL trained on, before RL (the fine-tuned model) and after:
    what RL itself changed. Logged on the pipeline run as rl_tasks/{before,after}/...; returns
    ({"before" | "after": report.json path}, {"before" | "after": the episode traces, each
    {"trace_id", "url", **tags}})."""
    before = ft["model_path"] if ft else (rc.rl.init_path if rl else None)
    out, traces = {}, {}
    for when, model in (("before", before), ("after", rl and rl["model_path"])):
        if not model:
            continue
        # the held-out evaluation's settings (goals, temperature, seeds), on the RL tasks instead
        ev = evaluate_flow(model, rc, pid, f"eval_rl_tasks_{when}")
        tracking.log_metrics(pid, ev["metrics"], 0)
        out[when] = ev["report"]
        traces[when] = [{**t, "url": registry.trace_url(pid, t["trace_id"])} for t in ev["traces"]]
    return out, traces


def _counts(counts: dict, prefix: str = "data") -> dict:
    """{"train": {"high": 8}} -> {"data/train/high": 8} (numbers only)."""
    flat: dict = {}
    for key, value in counts.items():
        if isinstance(value, dict):
            flat.update(_counts(value, f"{prefix}/{key}"))
        elif isinstance(value, int | float):
            flat[f"{prefix}/{key}"] = value
    return flat

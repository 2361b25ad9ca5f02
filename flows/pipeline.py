"""The whole rcgrpo pipeline as one Prefect flow and one MLflow run with a nested run per stage:

    build_dataset (issue 4's flow: experts + failures, GX validation, DVC version)
      -> fine-tune (RCTP-FT, or plain SFT: the variant's `init`, rcgrpo.evaluation.variants)
      -> RL (RC-GRPO / GRPO from the fine-tuned model, on the fine-tuning tasks)
      -> evaluate (greedy: the RL tasks before and after RL, then the held-out BFCL tasks;
                   both checkers, Wilson intervals, under the variant's reward goals)
      -> register the RL model in the MLflow Model Registry (data version, config, eval metrics)
      -> reports/<pipeline run id>/ (PNG plots + summary.md with links to the episode traces of
         one success and one failure per RL task, before and after RL), also logged to MLflow

Stages pass paths and run ids, never tensors. `overrides` holds one dict per params.yaml
section ({"rl": {"steps": 2}, "eval": {"limit": 1}, "model": {"profile": "tiny"}, ...}).

    rcgrpo run --set rl.steps=2 --set eval.limit=1          # the CLI front (rcgrpo.cli.pipeline)
    .venv/bin/python flows/pipeline.py '{"rl": {"steps": 2}}'
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.evaluate import eval_config, evaluate_flow
from rcgrpo.run_lock import hold as hold_run_lock
from rcgrpo.runtime import apply_defaults, project_root
from rcgrpo.tracking import registry
from rcgrpo.tracking import runs as tracking
from rcgrpo.tracking.orphans import fail_killed_pipelines

apply_defaults()

STAGES = ("data", "finetune", "rl", "eval")


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def register(rl_run_id: str, name: str, config: dict, metrics: dict) -> str:
    mv = registry.register_model(rl_run_id, "model", name, config, metrics,
                                 description="RL model of an rcgrpo pipeline run")  # fmt: skip
    return f"{name}/{mv.version}"


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def write_and_log_report(run_id: str, out_dir: str, info: dict, rl_run: str | None,
                         ft_run: str | None, eval_report: str | None, table: str | None,
                         rl_tasks: dict, rl_traces: dict | None = None) -> str:  # fmt: skip
    from rcgrpo.tracking.report import write_report

    rl = registry.metric_histories(rl_run) if rl_run else {}
    sft = registry.metric_histories(ft_run) if ft_run else {}
    report = json.loads(Path(eval_report).read_text()) if eval_report else {}
    text = Path(table).read_text() if table else ""
    before_after = {k: json.loads(Path(p).read_text()) for k, p in rl_tasks.items()}
    summary = write_report(Path(out_dir), info, rl, sft, report, text, before_after, rl_traces)
    tracking.log_artifact(run_id, out_dir, "report")
    return str(summary)


@flow(name="rcgrpo-pipeline", log_prints=True)
def pipeline_flow(
    overrides: dict[str, dict] | None = None,
    stages: list[str] | None = None,
    variant: str | None = None,
    register_name: str = "rcgrpo",
    report_root: str = "reports",
    preset: str | None = None,
) -> dict:
    """Run `stages` (default: params.yaml pipeline.stages, else all of STAGES) in order, for one
    of the paper's four recipes (`variant`, rcgrpo.evaluation.variants), with one of params.yaml's
    `presets` on top of the stage sections (default pipeline.variant / pipeline.preset);
    returns paths, run ids, the model version."""
    from flows.build_dataset import build_dataset_flow
    from flows.train import train_flow

    plan = plan_run(overrides, stages, variant, preset)
    ov, stages, v, preset, config = (plan[k] for k in ("ov", "stages", "variant", "preset",
                                                      "config"))  # fmt: skip
    out: dict = {"stages": stages, "variant": v.name, "preset": preset}
    hold_run_lock(project_root())  # one run at a time (a scheduled one too), before the store
    fail_killed_pipelines()  # under the lock: a RUNNING pipeline run is a killed one's
    with tracking.start_run("pipeline", config=config,
                            tags={"stage": "pipeline", "variant": v.name}) as run:  # fmt: skip
        pid = run.info.run_id
        out["run_id"] = pid
        if "data" in stages:
            built = build_dataset_flow(overrides=ov.get("dataset", {}),  # a subflow
                                       model_overrides=ov.get("model"),
                                       rollout_overrides=ov.get("rollout"))  # fmt: skip
            out["data"] = {k: built.get(k) for k in ("rev", "md5", "counts") if k in built}
            tracking.log_metrics(pid, _counts(built.get("counts") or {}), 0)
        # the data version as it is now (after the build), on the pipeline run itself
        dv = tracking.data_version()
        tracking.set_tags(pid, {f"data.{k}": val for k, val in dv.items()}
                          | {"data.version": f"{dv['rev'][:12]}:{dv['md5']}"})  # fmt: skip
        out["data_version"] = f"{dv['rev'][:12]}:{dv['md5']}"
        model_ov, rollout_ov = ov.get("model"), ov.get("rollout")
        ft = rl = ev = None
        rl_traces: dict = {}
        if "finetune" in stages:
            ft = train_flow(v.init, pid, ov.get(v.init), model_ov)
            out["finetune"] = {"run_id": ft["run_id"], "model_path": ft["model_path"]}
        if "rl" in stages:
            rl_ov = dict(ov["rl"])
            if ft:
                rl_ov["init_path"] = ft["model_path"]
            rl = train_flow("rl", pid, rl_ov, model_ov, rollout_ov, ov.get("traces"))
            out["rl"] = {"run_id": rl["run_id"], "model_path": rl["model_path"]}
        last = rl or ft
        if "eval" in stages and last:
            out["rl_tasks"], rl_traces = evaluate_rl_tasks(pid, ov, ft, rl)
            ev = evaluate_flow(last["model_path"], pid, ov.get("eval"), model_ov, rollout_ov,
                               trace_overrides=ov.get("traces"))  # fmt: skip
            out["eval"] = {k: ev[k] for k in ("run_id", "report", "table")}
            tracking.log_metrics(pid, ev["metrics"], 0)
        if last:
            metrics = ev["metrics"] if ev else {}
            out["model_version"] = register(last["run_id"], register_name, last["config"], metrics)
            tracking.set_tags(pid, {"model_version": out["model_version"]})
        report_dir = Path(report_root)
        report_dir = report_dir if report_dir.is_absolute() else project_root() / report_dir
        info = {"run_id": pid, "variant": v.name, "preset": preset,
                "profile": (config.get("model") or {}).get("profile"),
                "data_version": out["data_version"], "git_commit": run.data.tags.get("git.commit"),
                "model_version": out.get("model_version"),
                "mlflow_ui": "rcgrpo ui, then " + registry.run_url(pid),
                "headline_goal": ov["eval"]["tokens"][0]}  # fmt: skip
        out["report"] = write_and_log_report(
            pid, str(report_dir / pid), info, rl and rl["run_id"], ft and ft["run_id"],
            ev and ev["report"], ev and ev["table"], out.get("rl_tasks") or {}, rl_traces,
        )  # fmt: skip
    print(json.dumps(out, indent=1, default=str))
    return out


def evaluate_rl_tasks(pid: str, ov: dict, ft: dict | None, rl: dict | None) -> tuple[dict, dict]:
    """Greedy success on the tasks RL trained on, before RL (the fine-tuned model) and after:
    what RL itself changed. Logged on the pipeline run as rl_tasks/{before,after}/...; returns
    ({"before" | "after": report.json path}, {"before" | "after": the episode traces, each
    {"trace_id", "url", **tags}})."""
    from flows.train import stage_config

    rl_cfg = stage_config("rl", ov.get("rl"))
    before = ft["model_path"] if ft else (rl_cfg.start_path if rl else None)
    # the held-out evaluation's settings (goals, temperature, seeds), on the RL tasks instead
    eval_ov = {**ov["eval"], "split": "train", "task_file": rl_cfg.tasks_from,
               "other_protocol": False}  # fmt: skip
    out, traces = {}, {}
    for when, model in (("before", before), ("after", rl and rl["model_path"])):
        if not model:
            continue
        ev = evaluate_flow(model, pid, {**eval_ov, "out_dir": f"outputs/eval_rl_tasks/{when}"},
                           ov.get("model"), ov.get("rollout"), name=f"eval_rl_tasks_{when}",
                           prefix=f"rl_tasks/{when}", trace_overrides=ov.get("traces"))  # fmt: skip
        tracking.log_metrics(pid, ev["metrics"], 0)
        out[when] = ev["report"]
        traces[when] = [{**t, "url": registry.trace_url(pid, t["trace_id"])} for t in ev["traces"]]
    return out, traces


def plan_run(overrides=None, stages=None, variant=None, preset=None) -> dict:
    """What a pipeline run will do, checked before any run is opened: {"ov": the overrides per
    section (preset, then `overrides`, then the variant's RL fields and eval goals), "stages",
    "variant" (rcgrpo.evaluation.variants.Variant), "preset", "config" (every section as it will run)}."""
    from rcgrpo.config import check_params, read_params
    from rcgrpo.evaluation.variants import get_variant

    params = read_params()
    # params.yaml `pipeline:` holds what the main command runs by default (the stages, the
    # variant, the preset); `overrides` given here win over the preset, section by section.
    pp = params.get("pipeline") or {}
    preset = preset or pp.get("preset", "cpu")
    presets = params.get("presets") or {}
    if preset not in presets:
        raise ValueError(f"preset {preset!r} is not in params.yaml presets: {sorted(presets)}")
    check_params(preset=preset)  # every section of params.yaml, then with the preset on top
    base, given = presets[preset] or {}, overrides or {}
    ov = {k: {**(base.get(k) or {}), **(given.get(k) or {})} for k in {*base, *given}}
    stages = list(pp.get("stages", STAGES) if stages is None else stages)
    v = get_variant(variant or pp.get("variant", "rctp+rc-grpo"))
    if unknown := sorted(set(stages) - set(STAGES)):
        raise ValueError(f"unknown stages {unknown}: expected a subset of {STAGES}")
    ov["rl"] = {**ov.get("rl", {}), **v.rl_overrides()}
    ov["eval"] = {"tokens": list(v.eval_tokens), **ov.get("eval", {})}
    check_configs(ov, stages, v.init)  # a typo fails here, before any run is opened
    config = {k: {**(params.get(k) or {}), **ov.get(k, {})} if isinstance(params.get(k), dict)
              else params.get(k) for k in params if k not in ("pipeline", "presets")}  # fmt: skip
    config["pipeline"] = {"stages": stages, "variant": v.name, "preset": preset, "overrides": ov}
    return {"ov": ov, "stages": stages, "variant": v, "preset": preset, "config": config}


def check_configs(ov: dict, stages: list[str], init: str) -> None:
    """Build every stage's config from params.yaml + overrides (raises ConfigError on a typo),
    and refuse a data_dir that is not the tracked data folder (VersioningError), in a second."""
    from flows.train import model_config, rollout_config, stage_config, traces_config
    from rcgrpo.config import load_section, section_class
    from rcgrpo.data.dataset import load_config
    from rcgrpo.data.versioning import check_data_dir

    model_config(ov.get("model"))
    rollout_config(ov.get("rollout"))
    traces_config(ov.get("traces"))
    for name in ("env", "execution"):  # read deep inside (tool workers, Ray actors): check now
        load_section(name, section_class(name), overrides=ov.get(name))
    if "data" in stages:
        dataset = load_config(ov.get("dataset"))
        check_data_dir(dataset.project, dataset.data_dir, dataset.remote)
    if "finetune" in stages:
        stage_config(init, ov.get(init))
    if "rl" in stages:
        stage_config("rl", ov.get("rl"))
    if "eval" in stages:
        eval_config(ov.get("eval"))


def _counts(counts: dict, prefix: str = "data") -> dict:
    """{"train": {"high": 8}} -> {"data/train/high": 8} (numbers only)."""
    flat: dict = {}
    for key, value in counts.items():
        if isinstance(value, dict):
            flat.update(_counts(value, f"{prefix}/{key}"))
        elif isinstance(value, int | float):
            flat[f"{prefix}/{key}"] = value
    return flat


if __name__ == "__main__":
    pipeline_flow(json.loads(sys.argv[1]) if len(sys.argv) > 1 else None)

"""Prefect flow: build the quality-labelled trajectory dataset and version it with DVC.

experts -> failures (made by the run's environment, `env.name`: BFCL's perturbations; rollouts
of the base policy, by default params.yaml
`model:`, through the `rollout:` section's engine at the profile's budgets, when enabled; only
failures of tool calling are kept, see failures.refusal) -> label ->
write (into a staging folder) -> validate (Great Expectations) -> version (swap into data/,
dvc add, git commit data.dvc, dvc push: one task under the build lock, recoverable after a
kill, see rcgrpo.data.publishing). A failing suite raises before versioning, so data/ and
data.dvc keep the previous version, checked out. Retries only on the I/O task write.
It runs in the data stage's own process (`rcgrpo stage data`, which the pipeline and dvc.yaml
run, and `rcgrpo data build`: rcgrpo.cli.stage.data_stage), against PREFECT_API_URL when set (the
pipeline's server), else `rcgrpo ui`'s server or one of its own that stops with it.

    rcgrpo data build                                   # params.yaml, resolved as `rcgrpo run` does
    rcgrpo data build --set train_tasks=8 --set test_tasks=4 --set rollouts=off
    rcgrpo stage data --config outputs/data/run_config.json    # the pipeline's data stage
"""

from __future__ import annotations

import math
import random
import shutil
from dataclasses import replace
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from rcgrpo.data.dataset import DatasetConfig, load_config, select_tasks
from rcgrpo.envs import get as get_env


def _progress(label: str, every: int = 10):
    """A callback logging `label: i/n` at about every 10 % (Prefect UI and console)."""
    logger = get_run_logger()

    def report(i: int, n: int) -> None:
        if i == n or i % max(1, n // every) == 0:
            logger.info("%s: %d/%d", label, i, n)

    return report


# Pure compute tasks: a retry would compute the same thing again, so none. cache_policy=NONE:
# the inputs (lists of records) are too big to hash for Prefect's cache key.
@task(cache_policy=NONE)
def generate_experts(cfg: DatasetConfig, split: str, env):
    from rcgrpo.data.generate import generate_experts as run

    tasks = select_tasks(cfg, split, env)
    report = run(env, tasks, split, cfg.protocol, progress=_progress(f"experts {split}"))
    if report.failed:
        get_run_logger().warning(
            "%d %s experts do not score 1 (kept out of the high set): %s",
            len(report.failed),
            split,
            [f["task_id"] for f in report.failed],
        )
    return tasks, report


@task(cache_policy=NONE)
def generate_perturbations(cfg: DatasetConfig, split: str, tasks, env):
    from rcgrpo.data.generate import generate_failures as run

    return run(
        env,
        tasks,
        split,
        cfg.protocol,
        cfg.seed,
        cfg.kinds,
        cfg.attempts,
        progress=_progress(f"perturbations {split}"),
    )


@task(cache_policy=NONE)
def generate_rollouts(
    cfg: DatasetConfig,
    tasks_by_split: dict,
    model_overrides: dict | None = None,
    rollout_overrides: dict | None = None,
    rc=None,
    env=None,
) -> tuple[dict, dict | None]:
    """Failure source (a): base-policy rollouts of every split's tasks (one model load), screened
    by failures.refusal. Returns (split -> usable records, the manifest's rollouts summary or
    None when none were tried). The policy is dataset.rollout_model (params.yaml `model:` by
    default); engine, scheduler and budgets are the `rollout:` section with rollout_overrides
    (0 budgets = the profile's), its vLLM servers on every GPU (dataset.vllm_servers), the
    policy on the CPU. rollouts=auto skips, with a warning and a `skipped` reason in the
    summary, only when the engine (vLLM) is not installed; a model that does not load, a vLLM
    server that does not start or a first prompt over the budget fails the build, in one line."""
    from rcgrpo.config import load_section
    from rcgrpo.data.dataset import rollout_model
    from rcgrpo.data.failures import EngineUnavailable, RolloutReport, rollout_failures
    from rcgrpo.rollout.config import RolloutConfig, for_inference
    from rcgrpo.rollout.execution import ExecutionConfig, session
    from rcgrpo.rollout.router import visible_gpus

    logger = get_run_logger()
    if cfg.rollouts == "off":
        return {}, None
    # Only as many tasks as the low half can take from rollouts (a seeded subset): a CPU
    # rollout costs seconds, and the rest of the low half comes from perturbations anyway.
    tasks = []
    for split, split_tasks in tasks_by_split.items():
        k = min(
            len(split_tasks), math.ceil(len(split_tasks) * cfg.low_per_high * cfg.rollout_share)
        )
        tasks += random.Random(f"{cfg.seed}:rollouts:{split}").sample(list(split_tasks), k)
    if rc is not None:  # a resolved run's sections (rcgrpo run)
        model = rollout_model(cfg, model=rc.model)
        rollout, execution = rc.rollout, rc.execution
    else:  # a params.yaml typo fails, even under auto
        model = rollout_model(cfg, model_overrides)
        rollout = load_section("rollout", RolloutConfig, overrides=rollout_overrides)
        execution = load_section("execution", ExecutionConfig)
    util = cfg.vllm_gpu_memory_utilization  # every GPU: no trainer runs during the data stage
    rollout = for_inference(rollout, cfg.vllm_servers, util, visible_gpus())
    try:
        with session(execution) as backend:
            logger.info("rollouts on %s with rollout.engine=%s", backend.tags(), rollout.engine)
            report = rollout_failures(env, tasks, cfg.protocol, cfg.seed, model, rollout, backend)
    except EngineUnavailable as e:
        if cfg.rollouts == "on":
            raise
        logger.warning("rollouts=auto: %s; the low half is perturbations only", e)
        who = {"profile": model.profile, "path": model.path, "seed": model.seed}
        skipped = RolloutReport(model=who)
        return {}, {**skipped.summary(), "skipped": str(e)}
    refused = {k: v for k, v in report.refused.items() if v}
    logger.info(
        "rollouts of %s (%s): %d tried, %d kept as failures, %d refused (%s)",
        model.path or model.profile,
        report.settings,
        report.tried,
        len(report.records),
        sum(refused.values()),
        ", ".join(f"{k}: {v}" for k, v in refused.items()) or "none",
    )
    if not report.records:
        logger.warning("the base policy produced no usable failure: the low half is perturbations")
    by_split = {split: [r for r in report.records if r.split == split] for split in tasks_by_split}
    return by_split, report.summary()


@task(cache_policy=NONE)
def label(cfg: DatasetConfig, experts, rollouts, perturbed):
    from rcgrpo.data.failures import is_usable_failure
    from rcgrpo.data.labels import low_half, mixed_set, sft_set

    n_low = round(len(experts) * cfg.low_per_high)
    usable = [r for r in rollouts if is_usable_failure(r)]  # the rule, wherever lows are chosen
    lows = low_half(usable, perturbed, n_low, cfg.rollout_share, cfg.seed)
    if len(lows) < n_low:
        get_run_logger().warning("only %d failures for %d wanted: unbalanced", len(lows), n_low)
    return mixed_set(experts, lows, cfg.seed), sft_set(experts)


@task(cache_policy=NONE, retries=2, retry_delay_seconds=2)
def write(cfg: DatasetConfig, rctp, sft, expert_failures, rollouts: dict | None = None) -> Path:
    from rcgrpo.data.dataset import write_dataset
    from rcgrpo.data.versioning import staging_dir

    folder = staging_dir(cfg.project)
    try:
        manifest = write_dataset(folder, rctp, sft, cfg, expert_failures, rollouts)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # a retry starts from a fresh folder
        raise
    get_run_logger().info("wrote %s: %s", folder, manifest["files"])
    return folder


@task(cache_policy=NONE, retries=2, retry_delay_seconds=2)
def stage_copy(cfg: DatasetConfig, folder: Path) -> Path:
    from rcgrpo.data.versioning import staging_dir

    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a dataset folder (rctp/, sft/, manifest.json)")
    staged = staging_dir(cfg.project)
    shutil.copytree(folder, staged, dirs_exist_ok=True)
    return staged


@task(cache_policy=NONE)
def validate(cfg: DatasetConfig, folder: Path, env):
    from rcgrpo.data.validation import ValidationFailed, validate_dir

    docs = cfg.project / cfg.docs_dir
    report = validate_dir(folder, env, cfg.high_share, cfg.balance_tolerance, docs_dir=docs)
    if not report.success:
        shutil.rmtree(folder, ignore_errors=True)  # never versioned; data/ is untouched
        raise ValidationFailed(report)
    get_run_logger().info("%s; Data Docs in %s", report.message(), report.docs_dir)
    return report


@task(cache_policy=NONE)
def version(cfg: DatasetConfig, folder: Path) -> dict:
    """Swap the validated folder into data/, dvc add, git commit data.dvc (not retried: the
    swap is not idempotent; publish restores the previous data/ itself on failure)."""
    from rcgrpo.data.publishing import publish

    result = publish(
        folder,
        cfg.project,
        cfg.data_dir,
        message="data: build dataset",
        commit=cfg.commit,
        push=cfg.push,
        lock_timeout=cfg.lock_timeout_s,
        remote=cfg.remote,
    )  # the push inside the build lock: no other build can move data/ meanwhile
    get_run_logger().info("versioned %s: rev %s md5 %s", cfg.data_dir, result["rev"], result["md5"])
    return result


@task(cache_policy=NONE)
def prepare(cfg: DatasetConfig) -> None:
    """Fail fast when the project is no git work tree or data_dir is not the tracked data folder
    (or a new one); dvc init + offline config if needed."""
    from rcgrpo.data.versioning import check_data_dir, init_project

    check_data_dir(cfg.project, cfg.data_dir, cfg.remote)  # a planned --set remote=src too
    init_project(cfg.project, cfg.remote)  # the remote of a new project only


def _config(cfg: DatasetConfig | None, overrides: dict | None) -> DatasetConfig:
    if cfg is None:
        return load_config(overrides)
    return replace(cfg, **(overrides or {}))


@flow(name="validate-and-version", log_prints=True)
def publish_dataset_flow(
    folder: str, cfg: DatasetConfig | None = None, overrides: dict | None = None
) -> dict:
    """Validate an already built dataset folder and version it (the last two stages alone).
    The folder is copied first: it is never moved or deleted, whatever the outcome."""
    cfg = _config(cfg, overrides)
    prepare(cfg)
    staged = stage_copy(cfg, Path(folder))
    validate(cfg, staged, get_env())
    result = version(cfg, staged)
    return result


@flow(name="build-dataset", log_prints=True)
def build_dataset_flow(
    cfg: DatasetConfig | None = None,
    overrides: dict | None = None,
    model_overrides: dict | None = None,
    rollout_overrides: dict | None = None,
    rc=None,
) -> dict:
    """Build, validate and version the dataset; returns rev, md5, the files' counts and the
    rollouts summary.

    rc: a resolved run (rcgrpo.run_config.RunConfig, from `rcgrpo run`): its model, rollout,
    execution and env sections instead of params.yaml + the two override dicts.
    cfg: the `dataset:` config (default: params.yaml); overrides: fields replaced on top;
    model_overrides: on top of params.yaml `model:`, the policy rolled out by default;
    rollout_overrides: on top of params.yaml `rollout:` (engine, scheduler, budgets).
    """
    cfg, env = _config(cfg, overrides), get_env(rc.env if rc is not None else None)
    prepare(cfg)
    rctp, sft, expert_failures, made = {}, {}, [], {}
    for split in ("train", "test"):
        made[split] = generate_experts(cfg, split, env)
    tasks_by_split = {split: tasks for split, (tasks, _) in made.items()}
    rollouts, rollout_summary = generate_rollouts(
        cfg, tasks_by_split, model_overrides, rollout_overrides, rc, env
    )
    for split, (tasks, report) in made.items():
        perturbed = generate_perturbations(cfg, split, tasks, env)
        rctp[split], sft[split] = label(cfg, report.experts, rollouts.get(split, []), perturbed)
        expert_failures += report.failed
    folder = write(cfg, rctp, sft, expert_failures, rollout_summary)
    validate(cfg, folder, env)
    result = version(cfg, folder)
    counts = {
        f"{name}/{split}": {"high": sum(r.reward for r in rows), "rows": len(rows)}
        for name, sets in (("rctp", rctp), ("sft", sft))
        for split, rows in sets.items()
    }
    return {
        **result,
        "counts": counts,
        "expert_failures": expert_failures,
        "rollouts": rollout_summary,
    }

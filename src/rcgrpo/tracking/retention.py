"""What a project keeps, so that a nightly schedule does not grow without bound.

`prune(root, cfg)` applies the params.yaml `retention:` section: training checkpoints per stage
out_dir (rcgrpo.training.checkpoint.prune), MLflow runs with their artifacts and traces (here),
and DVC data versions (rcgrpo.data.retention). `rcgrpo prune` runs it; every pipeline run
(`rcgrpo run`, the scheduled ones) runs it last, under the run lock.

MLflow: a top-level run (a pipeline run, or a standalone `rcgrpo stage`) and the runs below it
are one family, kept or removed together.
Families beyond the newest `mlflow_keep_runs`, or started more than `mlflow_max_age_days` ago,
are removed: their traces (`delete_traces`), then the runs (`delete_run`), then for good with
their artifacts (`mlflow gc`). Never removed: a family holding the run of a registered model
version (the registry's artifacts live in that run), and one still RUNNING.

    .venv/bin/python -m rcgrpo.cli prune --dry-run
    .venv/bin/pytest tests/test_retention.py -q
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rcgrpo.fields import config_class, ranged, setting

STAGE_DIRS = ("rctp", "sft", "rl")  # sections whose out_dir holds checkpoints/


@config_class
class RetentionConfig:
    """params.yaml `retention:` section: what `rcgrpo prune` and each pipeline run remove."""

    keep_last_checkpoints: int = ranged(
        3, "[0, inf)", "step_* checkpoints kept per stage out_dir, earlier runs' removed (0 = all)"
    )
    mlflow_keep_runs: int = ranged(
        0,
        "[0, inf)",
        "top-level MLflow runs (each with its stage runs) kept per experiment (0 = all)",
    )
    mlflow_max_age_days: float = ranged(
        0.0, "[0, inf)", "MLflow runs older than this are removed (0 = no age limit)"
    )
    dvc_keep_commits: int = ranged(
        0, "[0, inf)", "data versions of the last N commits per branch kept in the cache (0 = all)"
    )
    dvc_cloud: bool = setting(False, "dvc gc the project's remote too (older versions are gone)")


def families(runs: list[dict]) -> list[list[dict]]:
    """Runs ({"id", "parent", "start", "status"}) grouped under their top run, newest top first;
    each family lists its top run first."""
    by_id = {r["id"]: r for r in runs}

    def top(r: dict) -> dict:
        while r["parent"] in by_id:
            r = by_id[r["parent"]]
        return r

    groups: dict[str, list[dict]] = {}
    for r in sorted(runs, key=lambda r: r["parent"] is not None):
        groups.setdefault(top(r)["id"], []).append(r)
    return sorted(groups.values(), key=lambda g: -g[0]["start"])


def doomed_families(
    groups: list[list[dict]], keep: int, cutoff_ms: int, protected: set[str]
) -> list[list[dict]]:
    """The families to remove: beyond the newest `keep` (0 = no count limit) or whose top run
    started before cutoff_ms (0 = no age limit); never one with a protected or RUNNING run."""
    out = []
    for i, group in enumerate(groups):
        old = (keep and i >= keep) or (cutoff_ms and group[0]["start"] < cutoff_ms)
        safe = any(r["id"] in protected or r["status"] == "RUNNING" for r in group)
        if old and not safe:
            out.append(group)
    return out


def prune_mlflow(cfg: RetentionConfig, dry_run: bool = False, now_ms: int | None = None) -> list:
    """Remove the doomed families of every experiment of the store; their run ids."""
    if not cfg.mlflow_keep_runs and not cfg.mlflow_max_age_days:
        return []
    from mlflow.tracking import MlflowClient

    from rcgrpo.tracking.runs import tracking_uri

    client = MlflowClient()
    protected = {mv.run_id for mv in client.search_model_versions()}
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    cutoff = int(now_ms - cfg.mlflow_max_age_days * 86_400_000) if cfg.mlflow_max_age_days else 0
    removed: list[str] = []
    for exp in client.search_experiments():
        found = client.search_runs([exp.experiment_id], max_results=50_000)
        runs = [
            {
                "id": r.info.run_id,
                "parent": r.data.tags.get("mlflow.parentRunId"),
                "start": r.info.start_time or 0,
                "status": r.info.status,
            }
            for r in found
        ]
        doomed = doomed_families(families(runs), cfg.mlflow_keep_runs, cutoff, protected)
        ids = [r["id"] for group in doomed for r in group]
        if dry_run or not ids:
            removed += ids
            continue
        for run_id in ids:
            _delete_traces(client, exp.experiment_id, run_id)
            client.delete_run(run_id)
        removed += ids
    if removed and not dry_run:  # for good: the rows and the artifact folders
        gc = [sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", tracking_uri()]
        subprocess.run([*gc, "--run-ids", ",".join(removed)], check=True, capture_output=True)
    return removed


def _delete_traces(client, experiment_id: str, run_id: str) -> None:
    """Every trace linked to the run, a page (100) at a time."""
    while True:
        page = client.search_traces(
            locations=[experiment_id], run_id=run_id, max_results=100, include_spans=False
        )
        if not page:
            return
        client.delete_traces(experiment_id, trace_ids=[t.info.trace_id for t in page])


def prune(root: Path, cfg: RetentionConfig, out_dirs: list[str], dry_run: bool = False) -> dict:
    """Apply `cfg` to the project at `root`, whose stages write checkpoints under `out_dirs`
    (relative to root): {"checkpoints", "mlflow_runs", "dvc"}, what was (would be) removed."""
    from rcgrpo.config import ConfigError
    from rcgrpo.training import checkpoint

    out: dict = {"checkpoints": [], "mlflow_runs": [], "dvc": None}
    for folder in dict.fromkeys(out_dirs):
        path = Path(folder) if Path(folder).is_absolute() else root / folder
        gone = checkpoint.prune(path, cfg.keep_last_checkpoints, dry_run)
        out["checkpoints"] += [str(p) for p in gone]
    out["mlflow_runs"] = prune_mlflow(cfg, dry_run)
    if cfg.dvc_keep_commits:
        from rcgrpo.data.retention import collect_garbage

        if not (root / ".dvc").is_dir():
            raise ConfigError(f"retention.dvc_keep_commits is set but {root} has no .dvc/")
        out["dvc"] = {"keep_commits": cfg.dvc_keep_commits, "cloud": cfg.dvc_cloud}
        if not dry_run:
            out["dvc"]["said"] = collect_garbage(root, cfg.dvc_keep_commits, cfg.dvc_cloud)
    return out


def stage_out_dirs(rc) -> list[str]:
    """The checkpoint-writing stages' out_dir of a RunConfig (or of params.yaml's sections)."""
    return [getattr(rc, stage).out_dir for stage in STAGE_DIRS]


def prune_after_run(root: Path, rc) -> dict:
    """`prune` as the last step of a pipeline run (rc: its RunConfig). A failure is a warning
    with its reason in the result: the run itself succeeded and is kept."""
    import warnings

    try:
        return prune(root, rc.retention, stage_out_dirs(rc))
    except Exception as e:  # noqa: BLE001 - housekeeping never fails a finished run
        warnings.warn(f"retention: pruning failed, nothing more removed: {e}", stacklevel=2)
        return {"error": f"{type(e).__name__}: {e}"}

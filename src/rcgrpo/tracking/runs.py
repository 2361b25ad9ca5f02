"""MLflow runs: the store, runs that record code, data and config versions, metrics, artifacts.

The store is an explicit SQLite database, `<project>/mlflow/mlflow.db`, with artifacts in
`<project>/mlflow/artifacts` (the file store is deprecated; the `mlflow/` folder never holds a
Python file, it would shadow the package). The folder is the user's alone (0700, the database
0600), and it is created under a lock in it. Telemetry is off (`rcgrpo.runtime.apply_defaults`).

Every run records, as tags, the git commit of the code (`git.commit`, `git.dirty`), the DVC data
version (`data.rev` = git revision of the last data.dvc commit, `data.md5` = md5 of the data/
folder in data.dvc, `data.dirty`; read by rcgrpo.data.versioning) and its config (flattened into
params, plus `config.json`). MLFLOW_TRACKING_URI=sqlite:///<dir>/mlflow.db, when set, moves the
store (tests, scheduled runs in a sandbox).
Runs nest by explicit parent run id, so stages running in Prefect worker threads or other
processes still land under their pipeline's run. Metrics go through `MlflowClient` bound to a
run id (thread-safe, no reliance on mlflow's thread-local "active run").

    from rcgrpo.tracking import runs as tracking
    with tracking.start_run("pipeline", config=cfg) as run:
        with tracking.start_run("rctp", config=rctp_cfg, parent_run_id=run.info.run_id) as st:
            run_sft(..., log_metrics=tracking.metrics_logger(st.info.run_id))
            tracking.log_artifact(st.info.run_id, "outputs/rctp/final", "model")
    registry.register_model(st.info.run_id, "model", "rcgrpo-rctp", metrics=...)  # tracking/registry.py

    .venv/bin/pytest tests/test_tracking.py -q
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from rcgrpo.owned import open_lock, private_files
from rcgrpo.runtime import apply_defaults, project_root

EXPERIMENT = "rcgrpo"
# MLflow 3's experiment kind: a model-training experiment, not a GenAI app (see registry.py
# for what the 3.17 UI makes of it)
KIND = {"mlflow.experimentKind": "custom_model_development"}
LogMetrics = Callable[[dict, int], None]


def store_dir(root: Path | None = None) -> Path:
    """The folder holding mlflow.db and artifacts/: <root>/mlflow for an explicit `root`; else
    the folder of the SQLite file named by MLFLOW_TRACKING_URI when that is set (tests and
    scheduled runs use a temp store; note mlflow.set_tracking_uri also sets it, for subprocesses);
    else <project>/mlflow."""
    if root is not None:
        return Path(root).resolve() / "mlflow"
    env = os.environ.get("MLFLOW_TRACKING_URI", "")
    if env.startswith("sqlite:///"):
        return Path(env.removeprefix("sqlite:///")).parent
    if env:
        raise ValueError(
            f"MLFLOW_TRACKING_URI={env!r}: rcgrpo expects sqlite:///<folder>/mlflow.db"
        )
    return project_root().resolve() / "mlflow"


def tracking_uri(root: Path | None = None) -> str:
    """sqlite:///<abs store dir>/mlflow.db (four slashes for an absolute path)."""
    return f"sqlite:///{store_dir(root) / 'mlflow.db'}"


def artifact_root(root: Path | None = None) -> Path:
    return store_dir(root) / "artifacts"


def configure(root: Path | None = None, experiment: str = EXPERIMENT) -> str:
    """Point mlflow at the project's store, create the experiment if missing; its id."""
    apply_defaults()
    # a new store's "Creating initial MLflow database tables..." INFO lines are not the user's
    # business: an error of the command that created it must stay one line
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    store = store_dir(root)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)  # the Model Registry lives in the same database
    # Under a lock in the store's folder (0700: the runs are the user's alone): two processes
    # on a fresh checkout (two `rcgrpo stage`) both created the tables, and one died in alembic.
    fd, _ = open_lock(store, ".store.lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.close(os.open(store / "mlflow.db", os.O_RDONLY | os.O_CREAT, 0o600))
        private_files(store, "mlflow.db*")  # a store made before: 0600 too
        client = MlflowClient()
        exp = client.get_experiment_by_name(experiment)
        if exp is not None:
            exp_id = exp.experiment_id
            for key, value in KIND.items():  # a store made before the tag existed
                if exp.tags.get(key) is None:
                    client.set_experiment_tag(exp_id, key, value)
        else:
            location = artifact_root(root) / experiment
            exp_id = client.create_experiment(
                experiment, artifact_location=location.as_uri(), tags=KIND
            )
    finally:
        os.close(fd)  # and the lock with it
    mlflow.set_experiment(experiment_id=exp_id)
    return exp_id


# -- versions of code and data ----------------------------------------------------------------


def _git(root: Path, *args: str) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def code_version(root: Path | None = None) -> dict:
    """{"commit": HEAD sha or "", "dirty": "true"|"false"} of the checkout."""
    root = Path(root or project_root())
    commit = _git(root, "rev-parse", "HEAD")
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit or "unknown", "dirty": str(dirty).lower()}


def data_version(root: Path | None = None) -> dict:
    """{"rev", "md5", "dirty"} of data/ as strings, from `rcgrpo.data.versioning` (the one
    DVC touchpoint); "none" where data/ was never versioned, "unreadable" (and a warning) where
    data.dvc is empty or truncated: the run is still recorded, its data version says why not."""
    import warnings

    from rcgrpo.data.versioning import VersioningError
    from rcgrpo.data.versioning import data_version as dv

    try:
        v = dv(Path(root or project_root()))
    except VersioningError as e:
        warnings.warn(f"data version not recorded: {e}", stacklevel=2)
        return {"rev": "unreadable", "md5": "unreadable", "dirty": "true"}
    return {
        "rev": v.get("rev") or "none",
        "md5": v.get("md5") or "none",
        "dirty": str(bool(v.get("dirty"))).lower(),
    }


# -- runs -------------------------------------------------------------------------------------


def _as_dict(config) -> dict:
    if config is None:
        return {}
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config)


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"rl": {"lr": 1e-6}} -> {"rl.lr": "1e-06"}; lists/tuples as JSON, MLflow's 6000-char cap."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            text = json.dumps(list(value)) if isinstance(value, list | tuple) else str(value)
            out[name] = text[:6000]
    return out


def start_run(
    name: str,
    config=None,
    parent_run_id: str | None = None,
    root: Path | None = None,
    tags: dict | None = None,
    experiment: str = EXPERIMENT,
    run_id: str | None = None,
) -> contextlib.AbstractContextManager[mlflow.ActiveRun]:
    """A run named `name` (nested under `parent_run_id` if given) with code/data versions and
    config recorded; ends FINISHED, or FAILED if the block raises. `run_id`: reopen that run
    instead (a resumed pipeline's: its params stay, its metrics continue)."""
    exp_id = configure(root, experiment)  # root None: MLFLOW_TRACKING_URI or the project's
    if run_id:
        return _reopened(run_id)
    project = Path(root or project_root()).resolve()
    config = _as_dict(config)
    code, data = code_version(project), data_version(project)
    all_tags = {
        "git.commit": code["commit"],
        "git.dirty": code["dirty"],
        "data.rev": data["rev"],
        "data.md5": data["md5"],
        "data.dirty": data["dirty"],
        "data.version": f"{data['rev'][:12]}:{data['md5']}",
        **{k: str(v) for k, v in (tags or {}).items()},
    }
    client = MlflowClient()
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    all_tags["mlflow.runName"] = name
    run = client.create_run(exp_id, tags=all_tags, run_name=name)
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in flatten(config).items()]
    for i in range(0, len(params), 100):  # log_batch takes at most 100 params per call
        client.log_batch(run_id, params=params[i : i + 100])
    if config:
        log_dict(run_id, config, "config.json")
    # mlflow.start_run(run_id=...) makes it the active run of this thread, so plain mlflow.*
    # calls inside the block also land here; nesting is by the explicit parent tag above.
    return _reopened(run_id)


@contextlib.contextmanager
def _reopened(run_id: str) -> Iterator[mlflow.ActiveRun]:
    """`run_id` as the active run of this thread for the block; FINISHED, or FAILED if it raises."""
    active = mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None)
    status = "FAILED"
    try:
        yield active
        status = "FINISHED"
    finally:
        mlflow.end_run(status)


def log_metrics(run_id: str, metrics: dict, step: int = 0) -> None:
    """Numeric entries of `metrics` at `step`; NaN/inf and non-numbers are skipped."""
    now = int(time.time() * 1000)
    batch = [
        Metric(k, float(v), now, int(step))
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]
    for i in range(0, len(batch), 1000):
        MlflowClient().log_batch(run_id, metrics=batch[i : i + 1000])


def metrics_logger(run_id: str) -> LogMetrics:
    """A `log_metrics(metrics: dict, step: int)` callable for the trainers, bound to `run_id`."""

    def log(metrics: dict, step: int) -> None:
        log_metrics(run_id, metrics, step)

    return log


def log_params(run_id: str, params: dict) -> None:
    batch = [Param(k, v) for k, v in flatten(params).items()]
    for i in range(0, len(batch), 100):
        MlflowClient().log_batch(run_id, params=batch[i : i + 100])


def log_artifact(run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
    """A file, or a folder's contents, under `artifact_path` of the run."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"log_artifact: {path} does not exist (run {run_id})")
    client = MlflowClient()
    if path.is_dir():
        client.log_artifacts(run_id, str(path), artifact_path)
    else:
        client.log_artifact(run_id, str(path), artifact_path)


def artifact_logger(run_id: str, artifact_path: str | None = None) -> Callable[[str | Path], None]:
    """A `log_artifact(path)` callable for the trainers, bound to `run_id`."""
    return lambda path: log_artifact(run_id, path, artifact_path)


def log_dict(run_id: str, data: dict, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / name
        file.write_text(json.dumps(data, indent=1, default=str))
        MlflowClient().log_artifact(run_id, str(file))


def set_tags(run_id: str, tags: dict) -> None:
    client = MlflowClient()
    for key, value in tags.items():
        client.set_tag(run_id, key, str(value))

"""Schedules: serve the pipeline flow as a Prefect deployment with a cron schedule.

`flow.serve` registers the deployment `rcgrpo-pipeline/<name>` with the Prefect server named by
PREFECT_API_URL and then polls it, starting each scheduled (or manually triggered) run as a
subprocess, until stopped (Ctrl-C / SIGTERM). Default: a nightly rebuild of the dataset and a
retrain at 02:00 server time. Each run resolves params.yaml as it is when it starts, with the
deployment's `settings` (--set, stages, preset, variant) on top, through
rcgrpo.run_config.resolve, as `rcgrpo run` does: an edit of params.yaml reaches the next run.

    rcgrpo ui                                   # terminal 1: Prefect server (+ MLflow UI)
    rcgrpo schedule --cron "0 2 * * *"          # terminal 2: serve the nightly deployment
    prefect deployment run rcgrpo-pipeline/nightly     # or trigger one now (or from the UI)

The alternative with a process work pool (the deployment outlives this process; any number of
workers can pick up runs):

    prefect work-pool create rcgrpo --type process
    prefect deploy flows/pipeline.py:pipeline_flow -n nightly -p rcgrpo --cron "0 2 * * *"
    prefect worker start --pool rcgrpo

Stop a serve process (or worker) before the server: one whose server vanished ignores SIGTERM.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from rcgrpo.owned import private_dir
from rcgrpo.runtime import apply_defaults, project_root

apply_defaults()

NIGHTLY = "0 2 * * *"


def serve(
    name: str = "nightly",
    cron: str = NIGHTLY,
    parameters: dict | None = None,
    limit: int | None = 1,
) -> None:
    """Create/update the deployment and serve it until interrupted (blocks).

    `limit=1`: one pipeline run at a time (2 cores; a late run waits instead of competing)."""
    if not os.environ.get("PREFECT_API_URL"):
        raise RuntimeError(
            "PREFECT_API_URL is not set: a schedule needs a running Prefect server. Start "
            "`rcgrpo ui`, then serve with `rcgrpo schedule`, which finds its server and checks "
            "that it runs as you before sending it the auth string."
        )
    root = str(project_root())
    # runs start as subprocesses that import `flows.*`: the project root must be importable
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if root not in sys.path:
        sys.path.insert(0, root)
    os.chdir(root)  # entrypoint paths are relative to the working dir

    # Prefect's Runner keeps its storage in the temp dir and leaves `runner_storage` there on
    # exit: this serving process's temp files go to the project's cache/, not the shared /tmp
    tempfile.tempdir = str(private_dir(Path(root) / "cache" / "tmp"))
    from flows.pipeline import pipeline_flow

    pipeline_flow.serve(
        name=name,
        cron=cron,
        parameters=parameters or {},
        description="rcgrpo: rebuild the dataset, fine-tune, RL, evaluate, register",
        tags=["rcgrpo"],
        limit=limit,
    )


def flow_parameters(given: dict) -> dict:
    """{"stages", "sets", "variant", "preset", "register_name", "report_root"} (all optional) ->
    pipeline_flow's parameters: the settings, checked now (rcgrpo.run_config.resolve raises
    ConfigError in one line), resolved again by each run from params.yaml as it is then."""
    from rcgrpo.run_config import resolve

    given = dict(given)
    keys = ("stages", "sets", "preset", "variant")
    settings = {k: given.pop(k) for k in keys if given.get(k) is not None}
    resolve(None, **settings)  # a bad --set or preset fails before serving
    return {"settings": settings, **given}


if __name__ == "__main__":
    # python flows/deploy.py [name] [cron] [parameters-json (see flow_parameters)]
    args = sys.argv[1:]
    serve(
        args[0] if args else "nightly",
        args[1] if len(args) > 1 else NIGHTLY,
        flow_parameters(json.loads(args[2]) if len(args) > 2 else {}),
    )

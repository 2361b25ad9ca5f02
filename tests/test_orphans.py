"""A pipeline killed with SIGKILL leaves its MLflow runs RUNNING; the next pipeline run (holding
the run lock) marks them and their children FAILED, and leaves a standalone run alone
(rcgrpo.tracking.orphans). A real killed process on a temp SQLite store. ~15 s.

    .venv/bin/pytest tests/test_orphans.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from mlflow.tracking import MlflowClient

from rcgrpo.tracking.orphans import fail_killed_pipelines

KILLED = """
import json, time
from rcgrpo.tracking import runs
with runs.start_run("pipeline", tags={"stage": "pipeline"}) as p:
    with runs.start_run("rl", parent_run_id=p.info.run_id, tags={"stage": "rl"}) as c:
        with runs.start_run("alone", tags={"stage": "rl"}) as a:  # a standalone train run
            print(json.dumps([p.info.run_id, c.info.run_id, a.info.run_id]), flush=True)
            time.sleep(600)
"""


def test_killed_pipeline_runs_are_marked_failed(mlflow_store):
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        pipeline, child, alone = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])  # not a URI an earlier test set
    assert {client.get_run(r).info.status for r in (pipeline, child, alone)} == {"RUNNING"}
    assert sorted(fail_killed_pipelines()) == sorted([pipeline, child])
    assert client.get_run(pipeline).info.status == "FAILED"
    assert client.get_run(child).info.status == "FAILED"
    assert "rcgrpo.killed" in client.get_run(child).data.tags
    assert client.get_run(alone).info.status == "RUNNING"  # not a pipeline's: left alone
    assert fail_killed_pipelines() == []  # nothing left to mark

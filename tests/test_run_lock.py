"""One pipeline run at a time per project (rcgrpo.run_lock): two real `rcgrpo run` started
together in a project copy, as an overlapping cron schedule starts them: one runs, the other
fails at once in one line naming the holder's pid; a killed holder (kill -9) leaves no stale
lock. ~30-60 s on 2 cores (the winner is stopped once the loser has exited).

    .venv/bin/pytest tests/test_run_lock.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from test_pipeline_e2e import copy_project

from rcgrpo.run_lock import RunLocked, hold
from rcgrpo.runtime import project_root

HOLD = "import sys, time; from rcgrpo.run_lock import hold; hold(sys.argv[1]); print('held', flush=True); time.sleep(600)"  # noqa: E501


def _holder(root) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_holder_refused_and_kill_9_frees_it(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(RunLocked, match=rf"pid {proc.pid} since .*: .*-c"):
            hold(tmp_path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    child = subprocess.run(
        [sys.executable, "-c", HOLD.replace("time.sleep(600)", "0"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0 and "held" in child.stdout, child.stderr
    assert hold(tmp_path) == hold(tmp_path)  # again in the holding process: a no-op


@pytest.mark.slow
def test_two_rcgrpo_runs_started_together(tmp_path):
    proj = copy_project(project_root(), tmp_path / "proj")
    env = {**os.environ, "PYTHONPATH": str(proj / "src")}
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(key, None)
    cmd = [
        sys.executable,
        "-m",
        "rcgrpo.cli",
        "run",
        "--profile",
        "tiny",
        "--set",
        "dataset.train_tasks=2",
        "--set",
        "dataset.test_tasks=2",
    ]
    runs = [
        subprocess.Popen(
            cmd,
            cwd=proj,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        while all(r.poll() is None for r in runs) and time.monotonic() < deadline:
            time.sleep(0.2)
        loser = next((r for r in runs if r.poll() is not None), None)
        assert loser is not None, "neither run was refused within 120 s"
        winner = runs[1 - runs.index(loser)]
        text = loser.stdout.read()
        assert loser.returncode != 0, text
        lines = [ln for ln in text.splitlines() if "another pipeline run" in ln]
        assert len(lines) == 1 and f"pid {winner.pid} since " in lines[0], text
        assert "Traceback" not in text, text
        assert winner.poll() is None  # the holder runs on
    finally:
        for r in runs:
            if r.poll() is None:
                r.send_signal(signal.SIGTERM)
        for r in runs:
            try:
                r.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(r.pid, signal.SIGKILL)
                r.wait()


def test_a_bad_setting_is_said_even_while_another_run_holds_the_lock(tmp_path):
    """A typo in `--set` is this command's own fault: it is reported as such (one line, exit 2),
    not hidden behind the lock of a run that may take hours."""
    proj = copy_project(project_root(), tmp_path / "proj")
    proc = _holder(proj)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "rcgrpo.cli", "run", "--project", str(proj)]
            + ["--set", "rl.p_high=7"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == "error: rl.p_high=7: must be in [0, 1]"

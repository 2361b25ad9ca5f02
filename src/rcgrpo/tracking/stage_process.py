"""A stage in a process of its own: `rcgrpo stage NAME --config <dir>/run_config.json`, started
by the Prefect flow (and by `rcgrpo stage` itself under torchrun), its output relayed line by line.

Why a process per stage: the process that runs the flow never loads a model or initialises CUDA,
and a stage's GPU memory (its model, PyTorch's allocator cache, its vLLM servers) goes back when
its process exits, before the next stage starts its own. The stage reads its settings from the
run_config.json written here (rcgrpo.run_config: the run resolved once), logs to the MLflow run
the flow opened for it (`--mlflow-run`), and writes what the flow needs back as `result.json`
beside it ({"error": one line} when it failed). The child runs under rcgrpo.procs' guard: it dies
with this process on any signal, kill -9 included.

    result = run_stage_process("eval", rc, run_id, ["--model", "outputs/rl/final"])
    .venv/bin/pytest tests/test_stage_process.py -q
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from rcgrpo.procs import child_env, guarded, stop_group
from rcgrpo.run_config import RunConfig, stage_dir
from rcgrpo.runtime import project_root

CONFIG_FILE = "run_config.json"
RESULT_FILE = "result.json"
GRACE_S = 30.0  # SIGTERM -> SIGKILL of a stage's group: time to stop its own vLLM servers


class StageFailed(RuntimeError):
    """A stage's process failed; the message is its one line (its output is above it)."""


def write_result(rc: RunConfig, stage: str, result: dict) -> Path:
    """The stage's result.json (written atomically: a reader never sees half of it)."""
    path = stage_dir(rc, stage) / RESULT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{RESULT_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def stage_env(extra: dict | None = None) -> dict:
    """The child's environment: rcgrpo (and the project's `flows`) importable from where this
    process loaded them, whatever the working dir (rcgrpo.procs.child_env)."""
    env = child_env()
    spec = importlib.util.find_spec("flows")
    if spec is not None and spec.origin:
        flows_root = str(Path(spec.origin).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env["PYTHONPATH"], flows_root]))
    return {**env, **(extra or {})}


def run_stage_process(
    stage: str,
    rc: RunConfig,
    run_id: str | None = None,
    args: list[str] | tuple[str, ...] = (),
    launcher: list[str] | None = None,
    env: dict | None = None,
) -> dict:
    """Run `rcgrpo stage STAGE` on `rc` in a process of its own (`launcher`: the command before
    `-m rcgrpo.cli ...`, default this Python; torchrun for ranks) and return its result.json.
    Raises StageFailed with the stage's one-line error when it exits non-zero."""
    folder = stage_dir(rc, stage)
    spec = rc.write(folder / CONFIG_FILE)
    result = folder / RESULT_FILE
    result.unlink(missing_ok=True)  # a stale one must not pass for this run's
    cmd = [*(launcher or [sys.executable]), "-m", "rcgrpo.cli", "stage", stage]
    cmd += ["--config", str(spec), *(["--mlflow-run", run_id] if run_id else []), *args]
    code = _run(cmd, stage_env(env))
    found = _read(result)
    if code != 0 or "error" in found:
        why = found.get("error") or "see its output above"
        raise StageFailed(f"stage {stage} failed (exit code {code}): {why}")
    return found


def _read(path: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    return {}


def _run(cmd: list[str], env: dict) -> int:
    """The guarded child's exit code; its output printed line by line (inside a Prefect task,
    `log_prints` sends each line to the run's logs too). Ctrl-C here stops its whole group."""
    proc = subprocess.Popen(
        guarded(cmd, GRACE_S),
        cwd=project_root(),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
        errors="replace",
        bufsize=1,
    )
    try:
        for line in proc.stdout:
            print(line.rstrip("\n"), flush=True)
        return proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the guard stops the stage's group
        stop_group(proc.pid, GRACE_S + 5, proc)
        proc.wait()
        raise
    finally:
        proc.stdout.close()

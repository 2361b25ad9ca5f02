"""Benchmark (not a test): how much of the main command's wall time the orchestration layer
(Prefect, MLflow, DVC) takes. Target: at most 10 %.

What: the main command (`rcgrpo run`: data -> RCTP-FT -> RL -> eval -> registry -> report) with
its default sizes (params.yaml `pipeline:`), or with `--tiny` the end-to-end test's sizes (a quick
check; there the fixed costs weigh more), in a temporary copy of the project (its own git, DVC and
MLflow stores; this checkout is never written to).

How: the pipeline runs in-process under a category profiler that keeps *exclusive* wall time per
category on each thread (entering a category pauses the enclosing one):
  mlflow  every MlflowClient method and mlflow.* fluent call, plus rcgrpo.tracking.runs's git reads
  dvc     rcgrpo.data.versioning's public functions and rcgrpo.data.publishing.publish (dvc add/
          commit/push, git commit of data.dvc)
  work    the computation the pipeline exists for: each stage's process (`rcgrpo stage NAME`, its
          whole wall: data, fine-tuning, RL, evaluations; its own imports, MLflow logging and DVC
          publish inside it, so this is a lower bound of the orchestration) and the report plots
  prefect the residual of the flow call (engine, task/flow run bookkeeping, API round-trips,
          ephemeral server start-up) plus `import prefect` -- an upper bound, it also holds
          the few lines of glue in flows/
`import mlflow` counts for mlflow. Python start-up and `import rcgrpo` count in the total only.

    .venv/bin/python bench/overhead.py                       # the main command as `make run`
    .venv/bin/python bench/overhead.py --tiny                # e2e sizes (~1-2 min)
    .venv/bin/python bench/overhead.py --set rl.steps=16     # any override, as `rcgrpo run`
    PREFECT_API_URL=http://127.0.0.1:4200/api .venv/bin/python bench/overhead.py  # `rcgrpo ui`'s
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "dataset.train_tasks=8", "dataset.test_tasks=4", 'dataset.rollouts="off"',
    "rctp.epochs=1", "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=2",
    "rl.mini_batch_size=2", "rl.micro_batch_size=2", "eval.limit=1",
    "rollout.max_new_tokens=24", "rollout.max_total_tokens=1024", "rollout.max_steps=2",
]  # fmt: skip
WORK = {
    "rcgrpo.tracking.stage_process": ["run_stage_process"],
    "rcgrpo.tracking.report": ["write_report"],
}
DVC = {  # the flows import these inside their tasks, so wrapping the module attribute counts them
    "rcgrpo.data.versioning": ["init_project", "push", "data_version", "versions", "staging_dir"],
    "rcgrpo.data.publishing": ["publish"],
}
MLFLOW_FLUENT = ["start_run", "end_run", "set_tracking_uri", "set_registry_uri", "set_experiment"]


class Profiler:
    """Exclusive wall time per category, per thread (a stack of (category, started))."""

    def __init__(self):
        self.totals: dict[str, float] = {}
        self.local = threading.local()
        self.lock = threading.Lock()

    def wrap(self, category: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            stack = self.local.__dict__.setdefault("stack", [])
            now = time.perf_counter()
            if stack:
                self._add(stack[-1][0], now - stack[-1][1])
            stack.append([category, now])
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                cat, start = stack.pop()
                self._add(cat, end - start)
                if stack:
                    stack[-1][1] = end

        return timed

    def _add(self, category: str, seconds: float) -> None:
        with self.lock:
            self.totals[category] = self.totals.get(category, 0.0) + seconds


def instrument(prof: Profiler) -> None:
    import importlib

    import mlflow
    from mlflow.tracking import MlflowClient

    for name in dir(MlflowClient):
        attr = getattr(MlflowClient, name)
        if not name.startswith("_") and callable(attr):
            setattr(MlflowClient, name, prof.wrap("mlflow", attr))
    for name in MLFLOW_FLUENT:
        setattr(mlflow, name, prof.wrap("mlflow", getattr(mlflow, name)))
    from rcgrpo.tracking import runs as tracking

    tracking.code_version = prof.wrap("mlflow", tracking.code_version)
    for category, table in (("dvc", DVC), ("work", WORK)):
        for module, names in table.items():
            mod = importlib.import_module(module)
            for name in names:
                setattr(mod, name, prof.wrap(category, getattr(mod, name)))


def worker(sets: list[str]) -> dict:
    """Inside the project copy: run the pipeline in-process, return the seconds per category."""
    start = time.perf_counter()
    import contextlib

    from rcgrpo.cli.pipeline import _enter_project, _resolve
    from rcgrpo.flow_server import prefect_for_flows

    _enter_project()
    stack = contextlib.ExitStack()  # `rcgrpo ui`'s server, else the command's own (as `rcgrpo run`)
    t = time.perf_counter()
    prefect_api = prefect_for_flows(stack)
    server_start = time.perf_counter() - t
    rc = _resolve(sets, "", "", "", "", 1)  # as `rcgrpo run` resolves it
    t = time.perf_counter()
    import prefect  # noqa: F401

    prefect_import = time.perf_counter() - t
    t = time.perf_counter()
    import mlflow  # noqa: F401

    mlflow_import = time.perf_counter() - t
    prof = Profiler()
    instrument(prof)
    from flows.pipeline import pipeline_flow

    t = time.perf_counter()
    out = pipeline_flow(rc)
    flow_s = time.perf_counter() - t
    total = time.perf_counter() - start
    cats = dict(prof.totals)
    cats["mlflow"] = cats.get("mlflow", 0.0) + mlflow_import
    inside = sum(v for k, v in prof.totals.items())
    cats["prefect"] = max(0.0, flow_s - inside) + prefect_import + server_start
    stack.close()
    return {"total_s": total, "flow_s": flow_s, "seconds": cats, "run_id": out["run_id"],
            "prefect_api": prefect_api}  # fmt: skip


def copy_project(dest: Path) -> None:
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split("\n")  # fmt: skip
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())
    models = ROOT / "cache" / "models"
    if models.is_dir():
        subprocess.run(["cp", "-r", str(models), str(dest / "cache")], check=True)
    git = ["git", "-C", str(dest), "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "bench copy"]):
        subprocess.run(git + args, check=True)


def copy_env(proj: Path) -> dict[str, str]:
    """A command's environment in the copy: its src/, its own MLflow store, a git identity."""
    env = {**os.environ, "PYTHONPATH": str(proj / "src"), "GIT_AUTHOR_NAME": "bench",
           "GIT_AUTHOR_EMAIL": "bench@localhost", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@localhost"}  # fmt: skip
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # mlflow.set_*_uri export them
        env.pop(key, None)
    return env


def main(argv: list[str]) -> None:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return
    sets = list(TINY) if "--tiny" in argv else []
    for i, arg in enumerate(argv):
        if arg == "--set":
            sets.append(argv[i + 1])
    if "--worker" in argv:  # the sets were passed explicitly (TINY included when --tiny)
        print("RESULT " + json.dumps(worker(sets)))
        return
    with tempfile.TemporaryDirectory(prefix="rcgrpo-bench-") as tmp:
        proj = Path(tmp) / "proj"
        (proj / "cache").mkdir(parents=True)
        copy_project(proj)
        env = copy_env(proj)
        cmd = [sys.executable, str(proj / "bench" / "overhead.py"), "--worker"]
        for s in sets:
            cmd += ["--set", s]
        wall = time.perf_counter()
        out = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - wall
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if out.returncode or line is None:
        sys.exit(f"pipeline failed ({out.returncode}):\n{(out.stdout + out.stderr)[-4000:]}")
    r = json.loads(line.removeprefix("RESULT "))
    secs = r["seconds"]
    print(f"main command: {wall:.1f} s wall (process), {r['total_s']:.1f} s after start-up; "
          f"Prefect API: {r['prefect_api']}")  # fmt: skip
    print(f"{'layer':10s} {'seconds':>8s} {'share':>7s}")
    for cat in ("prefect", "mlflow", "dvc", "work"):
        print(f"{cat:10s} {secs.get(cat, 0.0):8.1f} {100 * secs.get(cat, 0.0) / wall:6.1f}%")
    orch = sum(secs.get(c, 0.0) for c in ("prefect", "mlflow", "dvc"))
    verdict = "OK" if orch / wall <= 0.10 else "ABOVE TARGET"
    print(f"orchestration (prefect + mlflow + dvc): {orch:.1f} s = {100 * orch / wall:.1f}% "
          f"of the main command (target <= 10%): {verdict}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])

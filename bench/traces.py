"""Benchmark (not a test): what writing episode traces costs the main command. Target: < 5 %.

What: `rcgrpo run` as `make run` runs it (params.yaml's CPU default), once with
`--set traces.enabled=false` and once with the default `traces:` section, each in a fresh
temporary copy of the project (own git, DVC and MLflow stores; this checkout is never written
to), one after the other in the same session. Printed: the wall time of both and their ratio;
the time the trace writer itself spent (the `perf/trace_s` metric of every stage run: it writes
synchronously, so this is its whole cost) as a share of the run; the number of traces; and a
check that `mlflow.search_traces` finds the RL run's episodes of one task by its id. The box
drifts by ~30 % between runs (README), so the wall-time ratio is noisy where the writer's own
time is not: both are printed with the threads and the load.

    .venv/bin/python bench/traces.py                  # the main command, both ways (~15 min)
    .venv/bin/python bench/traces.py --tiny           # e2e sizes (~4 min)
    .venv/bin/python bench/traces.py --set rl.steps=4 # any override, as rcgrpo run
    .venv/bin/python bench/traces.py --keep /tmp/run  # keep the traced run's project copy
                                                      # (then: scripts/ui_check.py --store /tmp/run/mlflow)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from overhead import TINY, copy_env, copy_project  # noqa: E402


def measure(proj: Path) -> dict:
    """The stage runs of the last pipeline run in proj's store: trace counts and writer time."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{proj}/mlflow/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rcgrpo")
    runs = client.search_runs([exp.experiment_id])
    pipeline = next(r for r in runs if r.info.run_name == "pipeline")
    stages = {r.info.run_name: r for r in runs
              if r.data.tags.get("mlflow.parentRunId") == pipeline.info.run_id}  # fmt: skip
    out = {"traces": {}, "trace_s": {}}
    for name, run in stages.items():
        out["traces"][name] = int(run.data.metrics.get("traces/episodes", 0))
        out["trace_s"][name] = run.data.metrics.get("perf/trace_s", 0.0)
    if "rl" in stages and out["traces"].get("rl"):
        os.environ["MLFLOW_TRACKING_URI"] = uri
        from rcgrpo.tracking.traces import find_traces

        rl_id = stages["rl"].info.run_id
        first = find_traces(rl_id)[0].info.tags["task_id"]
        hits = find_traces(rl_id, task_id=first)
        out["search"] = {"task_id": first, "found": len(hits),
                         "all_that_task": all(t.info.tags["task_id"] == first for t in hits)}  # fmt: skip
        del os.environ["MLFLOW_TRACKING_URI"]
    return out


def run_once(sets: list[str], keep: str = "") -> dict:
    with tempfile.TemporaryDirectory(prefix="rcgrpo-bench-traces-") as tmp:
        proj = Path(tmp) / "proj"
        (proj / "cache").mkdir(parents=True)
        copy_project(proj)
        env = copy_env(proj)
        cmd = [sys.executable, "-m", "rcgrpo.cli", "run"]
        for s in sets:
            cmd += ["--set", s]
        load0, wall = os.getloadavg()[0], time.perf_counter()
        out = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True)
        wall, load1 = time.perf_counter() - wall, os.getloadavg()[0]
        if out.returncode:
            sys.exit(f"rcgrpo run failed ({out.returncode}):\n{(out.stdout + out.stderr)[-4000:]}")
        result = {"wall_s": wall, "load": (load0, load1), **measure(proj)}
        if keep:
            (proj / "rcgrpo-run.log").write_text(out.stdout + out.stderr)
            subprocess.run(["cp", "-a", str(proj), keep], check=True)
        return result


def main(argv: list[str]) -> None:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return
    sets = list(TINY) if "--tiny" in argv else []
    sets += [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    keep = next((argv[i + 1] for i, a in enumerate(argv) if a == "--keep"), "")
    from rcgrpo.runtime import torch_thread_count

    print(f"torch threads {torch_thread_count()}, cores {os.cpu_count()}, "
          f"sets {sets or '(make run defaults)'}")  # fmt: skip
    off = run_once([*sets, "traces.enabled=false"])
    on = run_once(sets, keep)
    for name, r in (("traces off", off), ("traces on", on)):
        print(
            f"{name:10s} {r['wall_s']:7.1f} s wall, load {r['load'][0]:.1f} -> {r['load'][1]:.1f}"
        )
    writer = sum(on["trace_s"].values())
    n = sum(on["traces"].values())
    print(f"traces on/off: {on['wall_s'] / off['wall_s']:.3f}x wall")
    print(f"trace writer: {writer:.1f} s for {n} traces ({1000 * writer / max(n, 1):.1f} ms each) "
          f"= {100 * writer / on['wall_s']:.2f} % of the run (target < 5 %)")  # fmt: skip
    print("traces per stage run: " + json.dumps(on["traces"]))
    print("writer seconds per stage run: " + json.dumps({k: round(v, 2) for k, v in
                                                         on["trace_s"].items()}))  # fmt: skip
    if "search" in on:
        s = on["search"]
        print(f"search_traces(rl run, task_id={s['task_id']!r}): {s['found']} traces, "
              f"all of that task: {s['all_that_task']}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])

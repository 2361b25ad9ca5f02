"""Every bench/ and scripts/ entry point still starts: `--help` exits 0 and prints its usage, each
helper module of bench/ imports, and bench/overhead.py's profiler finds every function it wraps.

Why: these scripts are run by hand, rarely, so nothing else notices when a refactor moves a
function they call (a bench once crashed with AttributeError on a renamed module). Each runs in
its own process, from the checkout, as a reader would run it; the GPU scripts in their --help mode.

    .venv/bin/pytest tests/test_entry_points.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*(ROOT / "bench").glob("*.py"), *(ROOT / "scripts").glob("*.py")])
MAINS = [p for p in SCRIPTS if '__name__ == "__main__"' in p.read_text()]
HELPERS = [p for p in SCRIPTS if p not in MAINS]  # imported by a main (e.g. bench/peer_trl_env.py)


def python(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    folders = [ROOT / "src", ROOT / "bench", ROOT / "scripts"]  # a helper sits beside its main
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, folders))}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_entry_points_are_found():
    names = {rel(p) for p in MAINS}
    assert {"bench/overhead.py", "scripts/conformance.py", "scripts/gpu_vllm_check.py"} <= names


@pytest.mark.parametrize("script", MAINS, ids=rel)
def test_entry_point_help(script):
    run = python(str(script), "--help")
    assert run.returncode == 0, f"{rel(script)} --help: exit {run.returncode}\n{run.stderr[-2000:]}"
    assert len(run.stdout.strip().splitlines()) >= 3, f"{rel(script)} --help printed no usage"


@pytest.mark.parametrize("module", HELPERS, ids=rel)
def test_helper_module_imports(module):
    run = python("-c", f"import {module.stem}")
    assert run.returncode == 0, f"import {rel(module)}: {run.stderr[-2000:]}"


def test_overhead_profiler_wraps_functions_that_exist():
    """What `bench/overhead.py` does before it runs the pipeline: wrap every function it times."""
    code = "import overhead; p = overhead.Profiler(); overhead.instrument(p); print('wrapped')"
    run = python("-c", code)
    assert run.returncode == 0 and "wrapped" in run.stdout, run.stderr[-2000:]


@pytest.mark.slow
def test_overhead_bench_runs_the_tiny_pipeline():
    """The one bench with a real run near a minute: the main command at the end-to-end sizes in
    a project copy (~80 s on 2 busy cores). Its sizes are bench/traces.py's too."""
    run = python("bench/overhead.py", "--tiny", timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "orchestration (prefect + mlflow + dvc):" in run.stdout, run.stdout[-2000:]

"""`rcgrpo doctor` and the CPU refusal (this box has no GPU): a GPU-sized `rcgrpo run` stops in
one line before anything starts, `--allow-cpu` lets it through to the next check.

    .venv/bin/pytest tests/test_doctor.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **env}
    full.pop("RCGRPO_ALLOW_CPU", None)
    return subprocess.run(
        [sys.executable, "-m", "rcgrpo.cli", *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--procs", "2", "--profile", "qwen2.5-7b-instruct"], "(a hub model), --procs 2 would"),
        (["--procs", "2"], "--procs 2 would run on the CPU"),
        (["--set", "rollout.engine=vllm"], "rollout.engine=vllm would run on the CPU"),
    ],
)
def test_a_gpu_sized_run_on_the_cpu_is_refused_in_one_line(args, reason):
    out = cli("run", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0] and "--allow-cpu" in lines[0], out.stderr


def test_allow_cpu_passes_the_refusal_and_reaches_the_stages(monkeypatch):
    from rcgrpo.cli.doctor import refuse_cpu
    from rcgrpo.config import ConfigError
    from rcgrpo.rollout.host import ALLOW_CPU_ENV

    monkeypatch.delenv(ALLOW_CPU_ENV, raising=False)
    with pytest.raises(ConfigError, match="rcgrpo stage rl: rollout.engine=vllm would run"):
        refuse_cpu("rcgrpo stage rl", "tiny", "vllm", 1, False)
    refuse_cpu("rcgrpo stage rl", "tiny", "hf", 1, False)  # the CPU default: no refusal
    refuse_cpu("rcgrpo run", "qwen2.5-7b-instruct", "vllm", 8, True)
    assert os.environ[ALLOW_CPU_ENV] == "1"  # inherited by the stages' processes
    refuse_cpu("rcgrpo stage rl", "qwen2.5-7b-instruct", "vllm", 1, False)


def test_doctor_prints_what_this_machine_gives():
    out = cli("doctor", "--skip-vllm")
    assert out.returncode == 0, out.stderr
    import torch

    assert f"torch                {torch.__version__}" in out.stdout
    assert f"GPUs                 {torch.cuda.device_count()}" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith("qwen2.5-7b-instruct"))
    want = ["hub", "cuda:0", "bfloat16"] if torch.cuda.is_available() else ["hub", "cpu", "float32"]
    assert row.split()[1:4] == want

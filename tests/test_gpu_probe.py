"""The device probe's CPU smoke run (scripts/gpu_update_probe.py --smoke), as a reader runs it:
its three cases run, the chunked LM head gives the plain full-logits path's log-probs and
gradients, and without a GPU it measures nothing and says so.

Why in `make test`: the probe runs rarely, on a lent GPU with minutes of budget, so a broken
probe must show here first, not there.

    .venv/bin/pytest tests/test_gpu_probe.py -q
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke() -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_update_probe.py"), "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_chunked_head_matches_the_plain_full_logits_path(smoke):
    line = next(s for s in smoke.splitlines() if s.startswith("reference forward"))
    dlogp, dgrad, scale = (
        float(x)
        for x in re.search(
            r"max \|d log-prob\| (\S+), max \|d grad\| / max \|grad\| (\S+) \(max \|grad\| (\S+)\)",
            line,
        ).groups()
    )
    assert scale > 0, line  # a real update: the gradients compared are not all zero
    assert dlogp <= 1e-5 and dgrad <= 1e-5, line


def test_typical_rows_come_from_the_replayed_episodes(smoke):
    line = next(s for s in smoke.splitlines() if s.startswith("typical rows"))
    rows, width, tokens, sampled = re.search(
        r"(\d+) rows x ([\d,]+) = ([\d,]+) computed tokens, ([\d,]+) sampled", line
    ).groups()
    # a replayed ground truth is thousands of tokens (the first prompt alone) with some sampled
    assert int(rows) >= 1 and int(width.replace(",", "")) > 1000, line
    assert 0 < int(sampled.replace(",", "")) < int(tokens.replace(",", "")), line


def test_without_a_gpu_nothing_is_measured_and_it_says_so(smoke):
    assert smoke.startswith("no CUDA device")
    constants = [s for s in smoke.splitlines() if "assumed" in s and "GB" in s]
    assert len(constants) == 4, smoke
    assert all("not measured" in s for s in constants), constants
    assert "peak allocated" not in smoke  # no memory figure without a device

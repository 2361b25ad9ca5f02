"""`accelerate launch` over the SFT and RL loops: 2 CPU processes (gloo, DDP) make the
1-process update on the same global batch (losses, gradients and weights to 1e-6)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from distributed_worker import run
from toy_models import tiny_llama

WORKER = Path(__file__).parent / "distributed_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_process_starts_no_accelerator(tmp_path, monkeypatch):
    """Without `accelerate launch` the loop is the plain one: no accelerate state is created
    (transformers imports the accelerate package itself, so only its state can tell)."""
    from accelerate.state import PartialState

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert len(run(str(tmp_path))["history"]) == 4
    assert PartialState._shared_state == {}


def launch_two(stage: str, out: Path) -> dict:
    """The worker under `accelerate launch` with 2 processes; rank 0's result."""
    src = Path(__file__).parents[1] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    # --multi_gpu starts the ranks with torch.distributed.run; on a box without a GPU the
    # Accelerator runs them on the CPU over gloo (`--cpu` alone would start 1 process, or
    # go through mpirun)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
        "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        str(WORKER), stage, str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return torch.load(out)


@pytest.mark.parametrize("stage", ["sft", "rl"])
def test_two_gloo_processes_equal_one_process(tmp_path, stage):
    one = run(str(tmp_path / "one"), stage)
    two = launch_two(stage, tmp_path / "two.pt")
    # really 2 ranks over gloo with accelerate's multi-CPU set-up (DDP), not 2 lone copies
    assert (two["world"], two["backend"]) == (2, ("DistributedType.MULTI_CPU", "gloo"))
    assert len(two["history"]) == len(one["history"]) == (4 if stage == "sft" else 2)
    for a, b in zip(one["history"], two["history"], strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if not k.startswith("perf/") and not k.endswith("tokens_per_s") and "time" not in k:
                assert abs(a[k] - b[k]) < 1e-6, (k, a[k], b[k])
    for name, g in one["grads"].items():  # the last step's gradient, all-reduced over ranks
        assert torch.allclose(g, two["grads"][name], atol=1e-6, rtol=0), name
    init = tiny_llama(32 if stage == "sft" else 16, 0).state_dict()
    moved = 0.0
    for name, p in one["state"].items():
        assert torch.allclose(p, two["state"][name], atol=1e-6, rtol=0), name
        moved = max(moved, float((p - init[name]).abs().max()))
    assert moved > 1e-3  # the weights did train: equality is not two untouched copies

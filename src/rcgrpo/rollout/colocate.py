"""Colocated rollouts and updates take turns on one GPU: the vLLM server sleeps during the update
and wakes for the rollouts, and the trainer process gives its memory back before each wake-up.

Why the order matters: PyTorch's caching allocator keeps what the update freed reserved in the
trainer process; vLLM's wake-up then finds that memory taken and its KV cache cannot come back.
So, before a wake-up: empty the trainer's cache and lower its memory fraction to leave vLLM's
share (1 - rollout.vllm_gpu_memory_utilization); after the sleep: raise it to what the update
may use (all but what the sleeping server keeps, VLLM_ASLEEP_SHARE). The trainer alone runs with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation over the update's varying
micro-batches), set by `trainer_allocator` before its process initialises CUDA; vLLM's
sleep-mode allocator does not work with it, so the server's environment drops it
(rcgrpo.rollout.vllm_server).

Sleep mode by default (`rollout.vllm_sleep_mode: null`): on for the pretrained (hub, GGUF)
profiles on CUDA with one server per rank (the colocated layout of `rcgrpo plan`); off on the
CPU, where /sleep frees nothing, and for the built-here CPU models.

    .venv/bin/pytest tests/test_rl_memory.py -q -k colocat
"""

from __future__ import annotations

import os

ALLOC_CONF = "expandable_segments:True"
# the variables PyTorch reads its allocator settings from, in its order of precedence
ALLOC_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
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


def trainer_allocator(environ=os.environ) -> str:
    """Set the trainer's allocator settings and return the ones in force. Call it first in a
    trainer process, before anything touches CUDA: PyTorch reads PYTORCH_CUDA_ALLOC_CONF once,
    when CUDA initialises (torch.cuda.set_device does that), and never again. A value the user
    set (either variable) is kept. If CUDA is already up in this process (a stage run in the
    pipeline's own process after another one), the settings are applied through PyTorch's
    runtime setter instead, for the segments allocated from then on. Child processes inherit
    the variable; a vLLM server's environment drops it (`server_env`)."""
    import torch

    conf = next((environ[n] for n in ALLOC_ENV if environ.get(n)), ALLOC_CONF)
    environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", conf)
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if torch.cuda.is_initialized():
        setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
        (setter or torch.cuda.memory._set_allocator_settings)(conf)
    return getter() if getter is not None else conf


def server_env(env: dict[str, str]) -> dict[str, str]:
    """A vLLM server's environment without the trainer's allocator settings."""
    return {k: v for k, v in env.items() if k not in ALLOC_ENV}


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

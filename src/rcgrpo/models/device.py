"""What `auto` means on this machine for a model: its device, dtype and training attention.

Why bfloat16 only for pretrained weights on CUDA: bf16 matmuls are slow on the CPU and every CPU
test compares float32 numbers; the built-here test models (tiny, qwen-shape) stay float32.

    .venv/bin/python -c "from rcgrpo.models.device import resolve; from rcgrpo.models.profiles import ModelConfig; print(resolve(ModelConfig()))"
"""

from __future__ import annotations

import dataclasses

from rcgrpo.models.profiles import PROFILES, ModelConfig


def resolve(cfg: ModelConfig) -> ModelConfig:
    """cfg with a concrete device and dtype, what `auto` means:
    device auto -> "cuda" when torch sees a GPU, else "cpu"; a bare "cuda" -> "cuda:<current
    device>" (under a launcher, rcgrpo.training.distributed.local_device set it from LOCAL_RANK
    before loading). dtype auto -> bfloat16 on CUDA for the pretrained profiles (hub, GGUF: a 7B
    model's weights are 15 GB instead of 30, matmuls run on the bf16 tensor cores, vLLM serves
    bf16; LoRA adapters stay float32, peft's autocast_adapter_dtype), float32 otherwise: on the
    CPU (bf16 matmuls there are slow, and every CPU test compares float32 numbers) and for the
    built-here test models (tiny, qwen-shape)."""
    import torch

    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    dtype = cfg.dtype
    if dtype == "auto":
        hub = PROFILES[cfg.profile].source in ("hub", "gguf")
        dtype = "bfloat16" if device.startswith("cuda") and hub else "float32"
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(
            f"model.dtype {cfg.dtype!r} is not a torch dtype (auto, float32, bfloat16)"
        )
    return dataclasses.replace(cfg, device=device, dtype=dtype)


def for_engine(cfg: ModelConfig, engine: str) -> ModelConfig:
    """The policy's config for a stage that only rolls out (data, evaluation): with the vLLM
    engine the policy is loaded on the CPU, since only its export for the servers (and the
    reward-token rows) need it, in the dtype it would have on the GPU (what vLLM serves); the
    GPUs stay whole for the servers. The transformers engine samples from the policy itself:
    `cfg` as it is."""
    if engine != "vllm":
        return cfg
    import torch

    dtype = cfg.dtype
    if dtype == "auto":  # as `resolve` picks on a GPU, without creating a CUDA context here
        hub = PROFILES[cfg.profile].source in ("hub", "gguf")
        dtype = "bfloat16" if hub and torch.cuda.is_available() else "float32"
    return dataclasses.replace(cfg, device="cpu", dtype=dtype)


def attention_implementation(cfg: ModelConfig) -> str:
    """The attention of the training forwards: model.attention, or for "auto" the device's.

    flash_attention_2 on CUDA with 16-bit weights when the flash-attn package is installed:
    training forwards then pack each micro-batch into one padding-free row (varlen kernels,
    rcgrpo.training.forward). Else sdpa: training rows are right-padded and run with no mask
    (causal kernels, no dense (B, 1, T, T) mask); this is also the CPU's choice. The model is
    loaded with sdpa either way (the transformers engine decodes with 4D masks, which
    flash-attention cannot take); the trainers switch to flash for their updates only
    (rcgrpo.training.forward.training_attention)."""
    import importlib.util

    import torch

    if cfg.attention != "auto":
        return cfg.attention
    cuda = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    hub = PROFILES[cfg.profile].source in ("hub", "gguf")
    dtype = ("bfloat16" if cuda and hub else "float32") if cfg.dtype == "auto" else cfg.dtype
    half = dtype != "float32"  # flash-attention has no fp32 kernels (auto: as `resolve` picks)
    if cuda and half and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"

"""The vLLM server's arguments for a rollout config and the policy it serves.

Why `--max-loras 2`: a new adapter version loads before the old one unloads, so weights never
pause between RL steps. `--max-lora-rank` is the served rank vLLM allows (RolloutConfig.
served_lora_rank: vLLM takes only some ranks). GPU memory utilisation is a CUDA-only flag: the
share the GPU can give at start (rcgrpo.rollout.gpu_memory), at most the configured one.

    .venv/bin/pytest tests/test_lora_rank.py -q
"""

from __future__ import annotations

from pathlib import Path


def server_args(
    cfg, model, base: Path, name: str, lora: bool, on_cuda: bool, share: float | None = None
) -> list[str]:
    """vLLM api_server arguments: cfg a RolloutConfig, model the policy's ModelConfig, base the
    served folder, name its --served-model-name, lora whether adapters are served, share the
    GPU memory share to ask for (None = cfg.vllm_gpu_memory_utilization)."""
    args = ["--served-model-name", name, "--dtype", model.dtype, "--seed", "0"]
    args += ["--max-model-len", str(cfg.max_total_tokens + cfg.max_new_tokens)]
    args += ["--max-num-seqs", str(cfg.vllm_max_num_seqs), "--tokenizer", str(base)]
    args += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    args += ["--enable-prefix-caching" if cfg.vllm_prefix_caching else "--no-enable-prefix-caching"]
    if lora:
        rank = cfg.served_lora_rank(model.lora_r)  # LoRA buffers: that rank
        args += ["--enable-lora", "--max-lora-rank", str(rank)]
        args += ["--max-loras", "2"]  # the new version loads before the old one unloads
    if on_cuda:
        utilization = cfg.vllm_gpu_memory_utilization if share is None else share
        args += ["--gpu-memory-utilization", str(utilization)]
    return args


def each_server_args(cfg, policy, base: Path, name: str, devices: list, on_cuda: bool):
    """(arguments of each server, the GPU memory Share of each: [] on the CPU) for servers on
    `devices`, each asking for the share its GPU can give now (rcgrpo.rollout.gpu_memory,
    printed); ServerStartFailed at once when a GPU has nothing left to give."""
    from rcgrpo.rollout import gpu_memory

    memory = gpu_memory.shares(cfg.vllm_gpu_memory_utilization, devices) if on_cuda else []
    if empty := [m for m in memory if m.share <= 0]:
        raise gpu_memory.ServerStartFailed(f"vLLM server not started: {empty[0].line()}")
    args = [
        server_args(cfg, policy.config, base, name, policy.is_lora, on_cuda, m.share)
        for m in memory
    ]
    plain = server_args(cfg, policy.config, base, name, policy.is_lora, on_cuda)
    return args or [plain] * len(devices), memory

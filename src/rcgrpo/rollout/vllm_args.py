"""The vLLM server's arguments for a rollout config and the policy it serves.

Why `--max-loras 2`: a new adapter version loads before the old one unloads, so weights never
pause between RL steps. `--max-lora-rank` is the served rank vLLM allows (RolloutConfig.
served_lora_rank: vLLM takes only some ranks). GPU memory utilisation is a CUDA-only flag.

    .venv/bin/pytest tests/test_lora_rank.py -q
"""

from __future__ import annotations

from pathlib import Path


def server_args(cfg, model, base: Path, name: str, lora: bool, on_cuda: bool) -> list[str]:
    """vLLM api_server arguments: cfg a RolloutConfig, model the policy's ModelConfig, base the
    served folder, name its --served-model-name, lora whether adapters are served."""
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
        args += ["--gpu-memory-utilization", str(cfg.vllm_gpu_memory_utilization)]
    return args

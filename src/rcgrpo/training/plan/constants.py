"""Every number `rcgrpo plan` uses that is not read from the config, each with its source.

Three kinds: hardware (vendor datasheets, and what this workplace measured on its H200),
architectures (each model's config.json; the CPU stand-ins from their builders here), and the
constants of the memory and time models (measured in this project where they could be,
stated as assumptions where they could not: those are the `--mfu` / `--bandwidth-eff` knobs).

    .venv/bin/python -c "from rcgrpo.training.plan.constants import GPUS; print(GPUS['h100'])"
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gb: float  # device memory
    bf16_flops: float  # dense bf16 tensor-core peak, FLOP/s
    bandwidth: float  # memory bandwidth, bytes/s
    source: str


GPUS = {
    "h100": GPU(
        "H100 SXM 80 GB",
        80,
        989e12,
        3.35e12,
        "NVIDIA H100 datasheet: BF16 1,979 TFLOP/s with sparsity (989 dense), HBM3 3.35 TB/s",
    ),
    "h200": GPU(
        "H200 141 GB",
        141,
        989e12,
        4.8e12,
        "NVIDIA H200 datasheet (989 TFLOP/s dense BF16, 4.8 TB/s); this workplace's H200 "
        "measured 788 TFLOP/s on an 8k bf16 matmul and 4.3 TB/s copying (2026-10-28)",
    ),
    "a100": GPU(
        "A100 SXM 80 GB",
        80,
        312e12,
        2.039e12,
        "NVIDIA A100 datasheet: BF16 312 TFLOP/s dense, HBM2e 2,039 GB/s",
    ),
    "l4": GPU(
        "L4 24 GB",
        24,
        121e12,
        0.3e12,
        "NVIDIA L4 datasheet: BF16 242 TFLOP/s with sparsity (121 dense), GDDR6 300 GB/s",
    ),
}


@dataclass(frozen=True)
class Arch:
    """The shapes the memory and FLOP counts need (transformers config.json keys in comments)."""

    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    intermediate: int  # intermediate_size (SwiGLU: gate, up, down)
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int  # hidden_size / num_attention_heads unless set
    vocab: int  # vocab_size (embedding rows, padded)
    tied: bool  # tie_word_embeddings
    source: str
    qkv_bias: bool = True  # Qwen2 has q/k/v biases (attention_bias), Llama none

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def params(self) -> int:
        """Weights: embedding, head (untied), per layer q/k/v (+ biases), o, SwiGLU, 2 norms."""
        d, per_layer = self.hidden, 0
        bias = self.qkv_bias
        per_layer += d * self.q_dim + 2 * d * self.kv_dim + bias * (self.q_dim + 2 * self.kv_dim)
        per_layer += self.q_dim * d + 3 * d * self.intermediate + 2 * d  # o, MLP, norms
        return self.layers * per_layer + self.vocab * d * (1 if self.tied else 2) + d

    def lora_params(self, r: int, targets: tuple[str, ...]) -> int:
        """LoRA A and B of rank r on the named projections: r x (in + out) each, per layer."""
        d, i, q, kv = self.hidden, self.intermediate, self.q_dim, self.kv_dim
        shapes = {
            "q_proj": (d, q),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (q, d),
            "gate_proj": (d, i),
            "up_proj": (d, i),
            "down_proj": (i, d),
        }
        return self.layers * sum(r * sum(shapes[t]) for t in targets if t in shapes)


def _cpu_arch(arch: dict, vocab: int, source: str) -> Arch:
    heads = arch["num_attention_heads"]
    return Arch(
        arch["num_hidden_layers"],
        arch["hidden_size"],
        arch["intermediate_size"],
        heads,
        arch["num_key_value_heads"],
        arch["hidden_size"] // heads,
        vocab,
        arch["tie_word_embeddings"],
        source,
    )


def architecture(profile: str) -> Arch:
    """The architecture of a model profile (rcgrpo.models.profiles.PROFILES)."""
    if profile == "qwen-shape":
        from rcgrpo.models.qwen_shape import ARCHITECTURE, PADDED_VOCAB

        return _cpu_arch(ARCHITECTURE, PADDED_VOCAB, "rcgrpo.models.qwen_shape.ARCHITECTURE")
    if profile == "tiny":
        from rcgrpo.models.tiny import ARCHITECTURE, VOCAB_SIZE

        # its BPE vocabulary + the two reward tokens (load_policy adds them)
        return _cpu_arch(ARCHITECTURE, VOCAB_SIZE + 2, "rcgrpo.models.tiny.ARCHITECTURE")
    if profile not in ARCHS:
        raise KeyError(f"no architecture for profile {profile!r}: add it to {__name__}.ARCHS")
    return ARCHS[profile]


ARCHS = {
    "qwen2.5-7b-instruct": Arch(
        28, 3584, 18944, 28, 4, 128, 152064, False, "Qwen/Qwen2.5-7B-Instruct config.json"
    ),
    "llama-3.1-8b-instruct": Arch(
        32,
        4096,
        14336,
        32,
        8,
        128,
        128256,
        False,
        "meta-llama/Llama-3.1-8B-Instruct config.json",
        qkv_bias=False,
    ),
    "smollm2-135m": Arch(
        30,
        576,
        1536,
        9,
        3,
        64,
        49152,
        True,
        "HuggingFaceTB/SmolLM2-135M-Instruct config.json",
        qkv_bias=False,
    ),
}


# --- the memory model -------------------------------------------------------------------------
# Capacity: a GPU sold as "80 GB" reports 79.2 GiB = 85.0e9 bytes to CUDA (H100 80 GB), and
# vLLM's gpu_memory_utilization is a fraction of that physical total; the plan takes
# --gpu-memory as the marketed size and works in the bytes CUDA reports.
PHYSICAL_PER_GB = 79.2 * 2**30 / 80
PHYSICAL_SOURCE = "H100 80 GB: torch.cuda.mem_get_info total 79.2 GiB (vLLM's capacity)"
# Every phase keeps this share of the physical capacity free (fragmentation, driver, spikes):
# vLLM alone leaves 10 % by default; a plan with less exits 2.
HEADROOM = 0.08
# The per-layer figures (saved bytes, forward + backward peak per token) come from a
# measurement of one full-width layer per profile: rcgrpo.training.plan.measure, recorded in
# layers.json beside this file by `rcgrpo plan --measure` and kept true by tests/test_plan.py.
# Logits at the sampled positions: (N, V) computed in the head's dtype, then float32 for the
# log-softmax, its backward and the entropy metric. bench/memory.py measured the peak of the
# masked path at 4.0-4.3 float32 copies per (position, row) on qwen-shape (README table).
LOGITS_BYTES = 16  # per sampled position and vocabulary row
LOGITS_SOURCE = "bench/memory.py: 4.0-4.3 fp32 copies of (N, V) at the peak (README)"
# Share of an episode's tokens that the policy sampled (the positions the LM head runs at):
# the 800 ground truths replayed with the 7B profiles' tokenizer (qwen-shape, combined protocol,
# scripts/ceiling.py's replay): median 1.6 %, p95 3.3 %, max 14.8 %; sampled tokens per episode
# median 99, p95 219, max 1,367. The p95 share: a micro-batch of episodes at their p95.
SAMPLED_SHARE = 0.033
SAMPLED_SOURCE = "800 ground truths replayed (qwen-shape tokenizer): p95 of the sampled share"
# The memory outside PyTorch's allocator below (CUDA context, vLLM's, NCCL) and the time model's
# efficiencies are assumed: no GPU has run here. `scripts/gpu_day_one.sh --out DIR` measures what
# one GPU box can (calibration.json) and `rcgrpo plan --calibration DIR/calibration.json` uses
# it in their place (rcgrpo.training.plan.calibration).
# Per process: the CUDA context and the caching allocator's slack, both assumptions: a CUDA
# context with PyTorch's kernels loaded takes a few hundred MB to ~1 GB depending on the GPU
# and libraries (0.5 GB here); the slack (fragmentation of the caching allocator) is taken as
# 5 % of what the process allocates.
CUDA_CONTEXT_GB = 0.5
ALLOCATOR_SLACK = 0.05
# vLLM beyond weights and KV: its profiling run's activation peak and CUDA graphs, ~1-2 GB for a
# 7B model at the default max_num_batched_tokens (vLLM's startup log "model weights took ...,
# non_torch_memory ..., PyTorch activation peak memory ..."); assumed 2 GB.
VLLM_OVERHEAD_GB = 2.0
# vLLM's own process. Its CUDA context (CUDA_CONTEXT_GB, as any process's) exists before vLLM
# takes the memory snapshot that gpu_memory_utilization is counted from (vllm/v1/worker/
# gpu_worker.py init_device, then request_memory: util x total), so it lies OUTSIDE the share.
# What vLLM allocates outside PyTorch after that snapshot (cuBLAS workspaces, attention
# buffers; its profiler's non_torch_increase) is inside the share, and is held asleep too:
# assumed 0.5 GB (with the context, the 1 GB once assumed for "context + non-torch").
VLLM_NON_TORCH_GB = 0.5
# NCCL's communicator buffers in each trainer process of a multi-GPU run (DDP's all-reduce):
# per channel and peer NCCL_BUFFSIZE (4 MiB) and its proxies; assumed 0.5 GB.
NCCL_GB = 0.5

# --- the time model ---------------------------------------------------------------------------
# Model FLOPs utilisation of the training forwards and backwards (transformers + DDP, LoRA,
# gradient checkpointing, flash-attention). An assumption: NeMo RL's Megatron backend is the
# fast end; a transformers step runs below it. Override with --mfu.
MFU = 0.35
# Decode reads the weights and every active sequence's KV cache once per iteration; the share of
# the datasheet bandwidth a decode step reaches is an assumption (copies reach 0.9 on this
# workplace's H200: 4.3 of 4.8 TB/s). Prefill and decode matmuls reach PREFILL_EFF of the peak.
BANDWIDTH_EFF = 0.7
PREFILL_EFF = 0.5
# Per engine iteration: scheduling, sampling and kernel launches beside the roofline time of
# the forward; an assumption (3 ms).
ITERATION_S = 0.003
# Tokens per engine iteration (chunked prefill: prefill chunks ride along with the decodes up
# to vLLM's max_num_batched_tokens). The engine does not set it and vLLM's default depends on
# its version and usage context; the plan assumes 8,192.
CHUNK_TOKENS = 8192
# One tool call between two model messages: the sandbox round trip (~0.2 ms, README) plus the
# replay of a call (bench/executor.py: ~5,000 trajectories/s in the RL regime); 1 ms.
TOOL_S = 0.001
# Weight sync of a LoRA policy per RL step: adapter export + /v1/load_lora_adapter; 21 ms on the
# CPU for qwen-shape (README, scripts/gpu_vllm_check.py); ~1 s assumed for a 7B adapter.
SYNC_S = 1.0
# The peer figure beside the estimate: NeMo RL v0.4 performance summary
# (docs/about/performance-summary.md in NVIDIA-NeMo/RL): GRPO on Llama-3.1-8B, on-policy,
# 16 x H100, 2,048 rollouts per step of 1,060 tokens on average (max 4,096), Megatron backend:
# 1,562 tokens/s/GPU (tokens used in training / step time / GPUs), 97.7 s per step.
PEER = ("NeMo RL v0.4, GRPO Llama-3.1-8B on 16 x H100 (1,060-token rollouts)", 1562.0)

# --- the rollout budget -----------------------------------------------------------------------
# The longest first prompt (system prompt with the tool docs, the first user turn, the high
# reward goal), in tokens, over all 800 BFCL v4 multi-turn tasks, per (compact tool docs,
# protocol): full JSON docs with the 7B profiles' tokenizer (qwen-shape), compact docs with
# tiny's. Measured, and kept true, by tests/test_plan_budget.py (2026-12-05).
FIRST_PROMPT_MAX = {
    (False, "combined"): 7757,
    (False, "bfcl"): 7536,
    (True, "combined"): 1185,
    (True, "bfcl"): 948,
}

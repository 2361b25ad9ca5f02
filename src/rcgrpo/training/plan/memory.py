"""The memory model of `rcgrpo plan`: what one GPU holds, term by term, and whether it fits.

Pure arithmetic over an architecture (constants.Arch), byte widths and token counts; each term
is a `Term(name, bytes, formula)` so the plan prints the formula beside the number. The terms
are: frozen weights, LoRA + optimizer, the reference adapter, checkpointed
activations and one recomputed layer at the micro-batch's tokens, logits at its sampled
positions, and the vLLM server: its context, then weights + KV cache inside its share. The
assumed values come as an `Assumed` (rcgrpo.training.plan.calibration: the constants, or a GPU's
measurements). bench/memory.py checks the same functions
against a measured peak on qwen-shape (`update_terms` is what it calls).

    .venv/bin/pytest tests/test_plan.py -q
"""

from __future__ import annotations

from dataclasses import dataclass

from rcgrpo.training.plan.calibration import ASSUMED, Assumed
from rcgrpo.training.plan.constants import GB, LOGITS_BYTES, Arch


class NoFit(ValueError):
    """A configuration that does not fit the GPUs: the message says what to change."""


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    formula: str


def count(n: float) -> str:
    """7615616512 -> '7.62B', 40370176 -> '40.4M', 32768 -> '32.8k'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}" if unit != "B" else f"{n / size:.2f}B"
    return f"{n:g}"


def dtype_bytes(dtype: str) -> int:
    """Bytes per weight or activation element of a model dtype (2 for 16-bit, 4 for float32)."""
    return 4 if dtype == "float32" else 2


@dataclass(frozen=True)
class Layer:
    """One decoder layer per token, measured (rcgrpo.training.plan.measure, layers.json):
    bytes autograd saves, and the peak of its forward + backward."""

    saved: float
    peak: float


def measured_layer(profile: str, dtype: str) -> Layer:
    """The recorded measurement of a profile's layer in `dtype`; KeyError saying which command
    records it when there is none."""
    from rcgrpo.training.plan.measure import COMMAND, recorded

    entry = recorded()["layers"].get(profile)
    if entry is None or entry["dtype"] != dtype:
        raise KeyError(f"no measured {dtype} layer for profile {profile!r}: run `{COMMAND}`")
    return Layer(entry["saved"], entry["peak"])


def update_terms(
    arch: Arch, tokens: int, sampled: int, b: int, checkpointing: bool, layer: Layer
) -> list[Term]:
    """Activations at the peak of one training forward + backward over `tokens` computed
    positions with `sampled` of them under the LM head. The logits are freed before the layers'
    backward starts, so the peak is the larger of the two, not their sum."""
    d, L = arch.hidden, arch.layers
    out: list[Term] = []
    if checkpointing:
        out = [
            Term(
                "activations, checkpointed (each layer's input)",
                L * tokens * d * b,
                f"{L} layers x {tokens:,} tok x {d} x {b} B",
            )
        ]
        layers, how = tokens * layer.peak, f"{tokens:,} tok x {layer.peak / 1e3:.1f} kB (measured)"
        name = "one layer recomputed + its backward"
    else:
        layers = L * tokens * layer.saved + tokens * (layer.peak - layer.saved)
        how = f"{L} x {tokens:,} tok x {layer.saved / 1e3:.1f} kB + one backward (measured)"
        name = "activations, every layer kept + one backward"
    logits = sampled * arch.vocab * LOGITS_BYTES
    if logits > layers:
        out.append(
            Term(
                "logits at the sampled positions (> the layers' peak)",
                logits,
                f"{sampled:,} pos x {arch.vocab:,} x {LOGITS_BYTES} B",
            )
        )
    else:
        out.append(Term(name + " (> the logits' peak)", layers, how))
    return out


def static_terms(arch: Arch, b: int, lora_params: int, gpus: int, reference: bool) -> list[Term]:
    """What the trainer holds between micro-batches: weights, trainable state, the reference,
    DDP's gradient buckets. lora_params 0 = full fine-tuning (fp32 Adam on every weight)."""
    p = arch.params()
    out = [Term("weights" + (" (frozen)" if lora_params else ""), p * b, f"{count(p)} x {b} B")]
    trainable = lora_params or p
    if lora_params:
        rows = 2 * arch.hidden  # the two reward-token embedding rows (trainable_token_indices)
        out.append(
            Term(
                "LoRA + AdamW (fp32 weights, grads, m, v)",
                (lora_params + rows) * 16,
                f"{count(lora_params + rows)} x 16 B",
            )
        )
        if reference:
            out.append(
                Term(
                    "reference: frozen copy of the starting adapter",
                    lora_params * 4,
                    f"{count(lora_params)} x 4 B",
                )
            )
    else:
        out.append(Term("grads + AdamW m, v (fp32)", p * (b + 8), f"{count(p)} x {b + 8} B"))
        if reference:
            out.append(Term("reference: deep copy of the model", p * b, f"{count(p)} x {b} B"))
    if gpus > 1:
        out.append(Term("DDP gradient buckets", trainable * 4, f"{count(trainable)} x 4 B"))
    return out


def process_terms(trainer_bytes: float, gpus: int, k: Assumed = ASSUMED) -> list[Term]:
    """A trainer process's CUDA context, NCCL's buffers (several GPUs) and its allocator's
    slack (`k`: the assumed values, or a calibration's measured ones)."""
    out = [Term("CUDA context", k.cuda_context_gb * GB, _gb(k, "cuda_context_gb"))]
    if gpus > 1:
        out.append(Term("NCCL buffers", k.nccl_gb * GB, _gb(k, "nccl_gb")))
    return out + [
        Term(
            "allocator slack",
            k.allocator_slack * trainer_bytes,
            f"{k.allocator_slack:.0%} of the above, {k.source('allocator_slack')}",
        )
    ]


def _gb(k: Assumed, name: str) -> str:
    return f"{getattr(k, name):.2g} GB, {k.source(name)}"


def kv_bytes_per_token(arch: Arch, b: int) -> int:
    """Keys and values of one token over all layers."""
    return 2 * arch.layers * arch.kv_dim * b


def vllm_terms(
    arch: Arch, b: int, share: float, gpu_bytes: float, slots: float, k: Assumed = ASSUMED
) -> tuple[list[Term], float]:
    """The awake vLLM server on its GPU: its process's CUDA context, then its reservation
    (gpu_memory_utilization x the physical GPU) split into non-torch memory, weights, overhead,
    LoRA slots (`slots` bytes) and KV cache; returns (terms, KV capacity in tokens). The context
    is outside the reservation: vLLM measures the free memory its share is taken from after
    its context exists (constants.VLLM_NON_TORCH_GB)."""
    weights = arch.params() * b
    context = Term(
        "vLLM CUDA context (outside its share)",
        k.cuda_context_gb * GB,
        _gb(k, "cuda_context_gb"),
    )
    fixed = [
        Term("vLLM non-torch memory", k.vllm_non_torch_gb * GB, _gb(k, "vllm_non_torch_gb")),
        Term("vLLM weights", weights, f"{count(arch.params())} x {b} B"),
        Term(
            "vLLM activations + CUDA graphs",
            k.vllm_overhead_gb * GB,
            _gb(k, "vllm_overhead_gb"),
        ),
        Term("vLLM LoRA slots", slots, "--max-loras x --max-lora-rank adapters"),
    ]
    kv = share * gpu_bytes - total(fixed)
    tokens = max(kv, 0) / kv_bytes_per_token(arch, b)
    return [context, *fixed] + [
        Term(
            "vLLM KV cache",
            max(kv, 0.0),
            f"{share:.2f} x {gpu_bytes / GB:.1f} GB - the 4 above = {tokens:,.0f} tokens",
        )
    ], tokens


def vllm_asleep_terms(slots: float, k: Assumed = ASSUMED) -> list[Term]:
    """What a level-1 sleep leaves on the GPU: vLLM offloads its weights to CPU memory and
    discards the KV cache; its context and non-torch memory stay, and the LoRA slots are
    counted as staying."""
    return [
        Term("vLLM asleep: CUDA context", k.cuda_context_gb * GB, _gb(k, "cuda_context_gb")),
        Term(
            "vLLM asleep: non-torch memory",
            k.vllm_non_torch_gb * GB,
            _gb(k, "vllm_non_torch_gb"),
        ),
        Term("vLLM asleep: LoRA slots", slots, "counted as kept"),
    ]


def total(terms: list[Term]) -> float:
    return sum(t.bytes for t in terms)


def largest_tokens(
    arch: Arch,
    b: int,
    checkpointing: bool,
    share: float,
    room: float,
    layer: Layer,
    slack: float = ASSUMED.allocator_slack,
) -> int:
    """The most tokens per micro-batch whose update fits in `room` bytes (a sampled share of
    `share`), including the allocator slack on them; 0 if none."""
    per_token = total(update_terms(arch, 10**6, int(share * 10**6), b, checkpointing, layer)) / 1e6
    return max(0, int(room / (per_token * (1 + slack))))

"""FLOPs of the update's forwards and backwards, counted as the kernels run them: the one count
behind `rcgrpo plan`'s update time and the GPU probe's TFLOP/s (scripts/gpu_update_probe.py),
so that a measured time turns into an efficiency the plan can use as it is.

One forward over a micro-batch that computes `tokens` positions, attends `pairs` (query, key)
pairs and runs the LM head at `sampled` positions, with N the decoder's weights (every layer's
q, k, v, o, gate, up, down; norms and biases are a rounding error), R the LoRA adapters'
weights, L layers, q = heads x head_dim, V x d the LM head:

    linear     2 N tokens        one multiply-add per weight and token
    LoRA       2 R tokens        x A, then (x A) B
    attention  4 L q pairs       QK^T and AV, 2 q FLOPs each per pair and layer; a causal row of
                                 T tokens has T^2 / 2 pairs, a suffix of n after a shared prefix
                                 of P has n P + n^2 / 2 (rcgrpo.training.shared_forward)
    head       2 V d sampled     only at the sampled positions (rcgrpo.training.grpo.head)

A backward costs, per part, its input gradients (1 x the forward for a linear map) plus, for
weights that train, their gradients (1 x more). LoRA trains the adapters only: the base and
the head are frozen, so linear 1 x, LoRA 2 x, head 1 x; a full fine-tune: linear 2 x, head
2 x. Attention has no weights: its backward runs five matmuls of the forward's two (dV, dP,
dQ, dK and the scores, which the flash and memory-efficient kernels recompute): 2.5 x.
Gradient checkpointing runs every layer's forward again in the backward (the head's chunks are
always checkpointed: they run again with or without it). One PPO pass of a LoRA policy with checkpointing:

    forward      (2N + 2R) t +  4 L q p + 2 V d s
    recompute    (2N + 2R) t +  4 L q p + 2 V d s
    backward     (2N + 4R) t + 10 L q p + 2 V d s

and pi_old and the reference add one no-grad forward each. Per token of short rows (R << N,
attention small) that is 10 N for a step with pi_old and the reference, 6 N of it the pass:
the "6 N per token" of a plain forward + backward counts weight gradients the frozen base never
takes and leaves out the recompute and the two scoring forwards.

    .venv/bin/pytest tests/test_plan.py -q -k flops
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rcgrpo.training.plan.constants import Arch

ATTENTION_BACKWARD = 2.5  # matmuls of the attention backward over the forward's (see above)


@dataclass(frozen=True)
class Work:
    """What one forward computes: positions, attended (query, key) pairs, head positions."""

    tokens: float
    pairs: float
    sampled: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(
            self.tokens + other.tokens, self.pairs + other.pairs, self.sampled + other.sampled
        )


def causal_pairs(rows: Iterable[int]) -> float:
    """(query, key) pairs of causal rows of these lengths: T^2 / 2 each."""
    return sum(t * t / 2 for t in rows)


def shared_pairs(prefix: int, suffixes: Iterable[int]) -> float:
    """Pairs of a prefix computed once and suffixes of these lengths attending to [prefix;
    themselves] (bottom-right causal): P^2 / 2 + sum(n P + n^2 / 2)."""
    return prefix * prefix / 2 + sum(n * prefix + n * n / 2 for n in suffixes)


def linear_params(arch: Arch) -> int:
    """N: the decoder's weights, every parameter but the embedding and the LM head."""
    return arch.params() - arch.vocab * arch.hidden * (1 if arch.tied else 2)


def forward_parts(arch: Arch, work: Work, lora_params: int = 0) -> dict[str, float]:
    """One forward's FLOPs by part: linear, lora, attention, head."""
    return {
        "linear": 2.0 * linear_params(arch) * work.tokens,
        "lora": 2.0 * lora_params * work.tokens,
        "attention": 4.0 * arch.layers * arch.q_dim * work.pairs,
        "head": 2.0 * arch.vocab * arch.hidden * work.sampled,
    }


def backward_factors(lora: bool) -> dict[str, float]:
    """A backward's FLOPs over its forward's, by part (module docstring)."""
    trains = 1.0 if lora else 2.0  # input gradients, + weight gradients when the base trains
    return {"linear": trains, "lora": 2.0, "attention": ATTENTION_BACKWARD, "head": trains}


def step_flops(
    arch: Arch,
    work: Work,
    lora: bool,
    lora_params: int = 0,
    checkpointing: bool = True,
    scoring: int = 2,
    passes: int = 1,
) -> float:
    """FLOPs of `scoring` no-grad forwards (pi_old, the reference) and `passes` training passes
    (forward, the checkpointed recompute, backward) over `work` (one pass's micro-batches
    summed: every count is linear in tokens, pairs and sampled)."""
    fwd = forward_parts(arch, work, lora_params if lora else 0)
    back = backward_factors(lora)
    one_forward = sum(fwd.values())
    backward = sum(v * back[k] for k, v in fwd.items())
    # the recompute: every layer under gradient checkpointing; the head's chunks always
    recompute = one_forward if checkpointing else fwd["head"]
    training = one_forward + recompute + backward
    return scoring * one_forward + passes * training

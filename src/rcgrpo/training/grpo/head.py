"""The LM head over the sampled positions, in chunks: log-probs (with gradient), entropy and the
T = 1 log-probs (without), never more than CHUNK rows of (N, V) logits alive at once.

Why chunks and a recompute: on a 7B vocabulary (V = 152,064) each float32 (N, V) copy is
0.6 MB per sampled position; a policy that writes long messages raises N, and the log-softmax,
its backward and the entropy held 4 such copies at once (bench/memory.py). Each chunk runs
under torch.utils.checkpoint: the forward keeps only the chunk's hidden states (n, d), and the
backward recomputes that chunk's logits, so the head's peak is CHUNK x V x a few copies
whatever the sampled share. Row by row the numbers are those of the unchunked head
(tests/test_rl_memory.py: log-probs, entropy and gradients to 1e-6).

    .venv/bin/pytest tests/test_rl_memory.py -q -k masked
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from rcgrpo.training.grpo.core_algos import token_entropy, token_logprobs

CHUNK = 1024  # sampled positions per chunk: 1024 x 152,064 x 4 B = 0.62 GB per float32 copy


class Sampled(NamedTuple):
    """Per sampled position (N,), no gradient: the entropy and the log-prob at T = 1 (the
    temperature the engine reports its log-probs at)."""

    entropy: torch.Tensor
    logp1: torch.Tensor


def _chunk(head, h: torch.Tensor, y: torch.Tensor, temperature: float):
    """h (n, d) hidden states, y (n,) targets -> log-probs at `temperature` (n,), entropy (n,),
    log-probs at T = 1 (n,)."""
    logits = head(h).float()  # (n, V)
    scaled = logits if temperature == 1.0 else logits / temperature
    logp = token_logprobs(scaled, y)
    with torch.no_grad():
        entropy = token_entropy(logits)
        logp1 = logp.detach() if temperature == 1.0 else token_logprobs(logits, y)
    return logp, entropy, logp1


def head_logprobs(
    head,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int | None = None,
) -> tuple[torch.Tensor, Sampled]:
    """hidden (N, d) at the sampled positions, targets (N,) -> (log-probs (N,) at the sampling
    temperature, Sampled). head: the LM head (d -> V), or the identity when hidden already
    holds logits (a head with extra math, rcgrpo.training.forward.masked_hidden)."""
    chunk = chunk or CHUNK
    grad = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for s in range(0, hidden.shape[0], chunk):
        args = (head, hidden[s : s + chunk], targets[s : s + chunk], temperature)
        parts.append(checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args))
    if not parts:  # no sampled position
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, Sampled(empty, empty)
    logp, entropy, logp1 = (torch.cat(p) for p in zip(*parts, strict=True))
    return logp, Sampled(entropy, logp1)

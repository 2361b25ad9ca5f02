"""The LM head over the sampled positions, in chunks: log-probs (with gradient), entropy and the
T = 1 log-probs (without), never more than CHUNK rows of (N, V) logits alive at once.

Why chunks and a recompute: on a 7B vocabulary (V = 152,064) each float32 (N, V) copy is
0.6 MB per sampled position; a policy that writes long messages raises N, and the log-softmax,
its backward and the entropy held 4 such copies at once (bench/memory.py). Each chunk but the
last runs under torch.utils.checkpoint: its forward keeps only the chunk's hidden states (n, d),
and the backward recomputes that chunk's logits, so the head's peak is CHUNK x V x a few copies
whatever the sampled share. The last chunk keeps its logits for the backward, which runs it
first (autograd goes from the latest node back) and frees them before any recompute: with one
chunk (N <= CHUNK) nothing is recomputed and the peak is the same. Row by row the numbers are
those of the unchunked head (tests/test_rl_memory.py: log-probs, entropy and gradients to 1e-6).

What each forward computes: the log-probs always (core_algos.token_logprobs: a log-sum-exp
over V); the entropy only where asked (`entropy=True`: a statistic of the PPO pass, which
pi_old and the reference forwards do not need), once per chunk (the backward's recompute does
not repeat it), with one (n, V) temporary; the T = 1 log-probs only at another temperature.

    .venv/bin/pytest tests/test_rl_memory.py -q -k masked
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from rcgrpo.training.grpo.core_algos import token_logprobs

CHUNK = 1024  # sampled positions per chunk: 1024 x 152,064 x 4 B = 0.62 GB per float32 copy


class Sampled(NamedTuple):
    """Per sampled position (N,), no gradient: the entropy (empty unless asked for) and the
    log-prob at T = 1 (the temperature the engine reports its log-probs at)."""

    entropy: torch.Tensor
    logp1: torch.Tensor


def _chunk(head, h: torch.Tensor, y: torch.Tensor, temperature: float, stats: dict):
    """h (n, d) hidden states, y (n,) targets -> log-probs at `temperature` (n,). On its first
    run only it sets stats["out"] = (entropy (n,) if stats["entropy"] else None, log-probs at
    T = 1 (n,)): under checkpoint the backward runs it again for the gradient alone."""
    logits = head(h).float()  # (n, V)
    scaled = logits if temperature == 1.0 else logits / temperature
    logp = token_logprobs(scaled, y)  # (n,)
    if "out" in stats:  # the backward's recompute
        return logp
    with torch.no_grad():
        logp1 = logp.detach() if temperature == 1.0 else token_logprobs(logits, y)
        entropy = None
        if stats["entropy"]:  # H = lse - sum_v p_v logit_v, p = exp(logit - lse): one (n, V) copy
            lse = torch.logsumexp(logits, -1)
            p = (logits - lse[:, None]).exp_()
            entropy = lse - p.mul_(logits).sum(-1)
    stats["out"] = entropy, logp1
    return logp


def head_logprobs(
    head,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int | None = None,
    entropy: bool = True,
) -> tuple[torch.Tensor, Sampled]:
    """hidden (N, d) at the sampled positions, targets (N,) -> (log-probs (N,) at the sampling
    temperature, Sampled). head: the LM head (d -> V), or the identity when hidden already
    holds logits (a head with extra math, rcgrpo.training.forward.masked_hidden).
    entropy=False: Sampled.entropy is empty (pi_old and the reference need none)."""
    chunk = chunk or CHUNK
    grad = torch.is_grad_enabled() and hidden.requires_grad
    parts, stats = [], []
    for s in range(0, hidden.shape[0], chunk):
        mine = {"entropy": entropy}
        args = (head, hidden[s : s + chunk], targets[s : s + chunk], temperature, mine)
        last = s + chunk >= hidden.shape[0]
        if grad and not last:
            parts.append(checkpoint(_chunk, *args, use_reentrant=False))
        else:
            parts.append(_chunk(*args))
        stats.append(mine["out"])
    if not parts:  # no sampled position
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, Sampled(empty, empty)
    logp = torch.cat(parts)
    ent = torch.cat([e for e, _ in stats]) if entropy else logp.new_zeros(0).detach()
    return logp, Sampled(ent, torch.cat([p for _, p in stats]))

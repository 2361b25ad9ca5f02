"""The RC-GRPO algorithm as pure tensor functions (verl's core_algos idea, a few lines each).

* `sample_reward_tokens`: one reward token per rollout of a group, i.i.d. with P(high)=p (the
  paper) or stratified (both tokens at least once per group; the paper did not test it).
* `group_advantages`: (R - mean)/(population std + eps) (the paper), mean-only, sign 2R - 1, or
  max-norm (R - mean)/max|R - mean|.
* `policy_loss`: PPO-clipped ratio + beta * KL(policy || reference) (k3 clamped as verl does),
  token- or sequence-mean.
* `minibatch_indices`: PPO's passes -> mini-batches (optimizer steps) -> micro-batches (by count
  or by token budget).
* `token_logprobs` / `token_entropy`: from logits, for the loss.

Nothing here touches a model or a file; tests/test_core_algos.py checks hand-computed values:

    .venv/bin/pytest tests/test_core_algos.py -q
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch

TokenScheme = Literal["iid", "stratified"]
AdvantageKind = Literal["grpo", "mean", "sign", "max_norm"]
KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["token-mean", "seq-mean"]

ZERO_STD = 1e-8  # a group whose reward std is below this is "zero-variance": advantages are 0


def sample_reward_tokens(
    n_groups: int,
    group_size: int,
    p_high: float = 0.5,
    scheme: TokenScheme = "iid",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Which rollouts get <|high_reward|>: a bool tensor (n_groups, group_size), True = high.

    iid: each entry high with probability p_high (a group is all-high with p^G, all-low with
    (1-p)^G: 6.25% together at p=0.5, G=5). stratified: the number of highs k per group is drawn
    from Binomial(G, p) conditioned on 1 <= k <= G-1 (the i.i.d. law given both tokens occur),
    then placed at random positions; needs G >= 2 and 0 < p < 1.
    """
    if not 0.0 <= p_high <= 1.0:
        raise ValueError(f"p_high must be in [0, 1], got {p_high}")
    if scheme == "iid":
        u = torch.rand(n_groups, group_size, generator=generator)
        return u < p_high
    if scheme != "stratified":
        raise ValueError(f"scheme must be 'iid' or 'stratified', got {scheme!r}")
    if group_size < 2 or not 0.0 < p_high < 1.0:
        raise ValueError(
            f"stratified sampling needs group_size >= 2 and 0 < p_high < 1 "
            f"(got G={group_size}, p={p_high}): one group cannot hold both tokens otherwise"
        )
    ks = torch.arange(1, group_size)  # (G-1,) admissible numbers of highs
    weights = torch.tensor(
        [math.comb(group_size, k) * p_high**k * (1 - p_high) ** (group_size - k) for k in ks]
    )
    n_high = torch.multinomial(weights, n_groups, replacement=True, generator=generator) + 1
    # A random permutation per group: rank of uniform noise; position high iff rank < k.
    ranks = torch.rand(n_groups, group_size, generator=generator).argsort(dim=1).argsort(dim=1)
    return ranks < n_high[:, None]


def group_advantages(
    rewards: torch.Tensor, kind: AdvantageKind = "grpo", eps: float = 1e-6
) -> torch.Tensor:
    """Per-rollout advantages from rewards (n_groups, G) -> (n_groups, G).

    grpo: (R - mean_g) / (population std_g + eps) (the paper); mean: R - mean_g;
    sign: 2R - 1 (binary rewards; gradient-starvation fix, arXiv 2605.07689; non-zero even in a
    zero-variance group, by design); max_norm: (R - mean_g) / max_g |R - mean_g|, so each group's
    largest |advantage| is 1 whatever its size or spread ("Advantage Scale Calibration",
    arXiv 2609.19164: std-normalisation blows a 1-in-G success up to sqrt(G - 1), max-norm keeps
    every group on one scale). For grpo, mean and max_norm a zero-variance group gives exact zeros.
    """
    rewards = rewards.to(torch.float32)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (n_groups, G), got shape {tuple(rewards.shape)}")
    if kind == "sign":
        return 2.0 * rewards - 1.0
    mean = rewards.mean(dim=1, keepdim=True)  # (n_groups, 1)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)  # population std, (n_groups, 1)
    centred = rewards - mean
    if kind == "mean":
        adv = centred
    elif kind == "grpo":
        adv = centred / (std + eps)
    elif kind == "max_norm":
        adv = centred / (centred.abs().amax(dim=1, keepdim=True) + eps)
    else:
        raise ValueError(f"advantage kind must be grpo, mean, sign or max_norm, got {kind!r}")
    return torch.where(std < ZERO_STD, torch.zeros_like(adv), adv)


def group_reward_stats(rewards: torch.Tensor) -> dict[str, float]:
    """Zero-variance fraction (also split: all rewards <= 0, all >= 1) and mean within-group
    population std of rewards (n_groups, G)."""
    rewards = rewards.to(torch.float32)
    std = rewards.std(dim=1, unbiased=False)
    flat = std < ZERO_STD
    return {
        "zero_variance_frac": float(flat.float().mean()),
        "zero_variance_all_fail_frac": float((flat & (rewards.amax(dim=1) <= 0)).float().mean()),
        "zero_variance_all_success_frac": float((flat & (rewards.amin(dim=1) >= 1)).float().mean()),
        "within_group_std": float(std.mean()),
    }


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs, (B, T).

    With log r = ref - logp (tokens sampled from the policy): k1 = -log r (unbiased, can be
    negative), k2 = (log r)^2 / 2, k3 = r - 1 - log r (unbiased, >= 0; Schulman 2020,
    http://joschu.net/blog/kl-approx.html). log r is clamped to [-20, 20] so exp never overflows;
    k3 is then clamped to [-10, 10] (verl's "low_var_kl"), so a token far from the reference
    adds at most 10 to the loss and gets zero KL gradient instead of an exp-sized one.
    """
    log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    if estimator == "k3":
        # As verl/trainer/ppo/core_algos.py kl_penalty("low_var_kl"): clamp log r to [-20, 20],
        # kld = exp(log r) - log r - 1, then clamp kld to [-10, 10] (only the upper bound can bite).
        return (torch.exp(log_r) - 1.0 - log_r).clamp(-10.0, 10.0)
    raise ValueError(f"kl estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")


def _aggregate(values: torch.Tensor, mask: torch.Tensor, how: Aggregation) -> torch.Tensor:
    """Masked mean of (B, T) values: over all tokens (token-mean) or per sequence, then over
    sequences (seq-mean; every rollout weighs the same whatever its length)."""
    if how == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    if how == "seq-mean":
        per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (B,)
        has_tokens = mask.sum(dim=1) > 0
        return per_seq[has_tokens].sum() / has_tokens.sum().clamp(min=1)
    raise ValueError(f"aggregation must be 'token-mean' or 'seq-mean', got {how!r}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    *,
    clip_eps: float = 0.2,
    kl_coef: float = 0.1,
    kl_estimator: KLEstimator = "k3",
    aggregation: Aggregation = "token-mean",
    entropy: torch.Tensor | None = None,
    is_weight: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clipped policy-gradient loss plus kl_coef * KL to the reference.

    logprobs (B, T): log-probs of the sampled tokens under the policy being trained (with grad);
    old_logprobs (B, T): the same under the policy that sampled them (no grad);
    advantages (B,) one per rollout, or (B, T); mask (B, T): 1 on sampled (model) tokens, 0 on
    prompt / tool / padding tokens, which get exactly zero gradient and never reach exp();
    ref_logprobs (B, T) or None (no KL term); entropy (B, T) only for the stats;
    is_weight (B, T): a truncated engine importance weight on the policy-gradient term, and
    keep (B, T): 0 on rollouts masked out of the whole loss (rcgrpo.training.grpo.engine_is;
    they still count in the mean's denominator), None for neither.
    Returns (scalar loss, stats: pg_loss, kl, clip_frac, ratio_mean, entropy).
    """
    mask_b = mask.bool()
    maskf = mask_b.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)  # (B,) -> (B, T)
    advantages = advantages.to(logprobs.dtype)
    zero = torch.zeros_like(logprobs)
    # Masked positions are replaced by 0 before exp: padding may hold -inf log-probs.
    log_ratio = torch.where(mask_b, logprobs - old_logprobs.detach(), zero)
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))  # (B, T)
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    pg = torch.maximum(pg_unclipped, pg_clipped)  # (B, T), pessimistic bound
    if is_weight is not None:  # verl's rollout IS: the weight on the pg term, no gradient
        pg = pg * is_weight.detach().to(pg.dtype)
    kl = None
    if ref_logprobs is not None:
        safe_ref = torch.where(mask_b, ref_logprobs.detach(), zero)
        safe_logp = torch.where(mask_b, logprobs, zero)
        kl = kl_penalty(safe_logp, safe_ref, kl_estimator)
    if keep is not None:
        pg = pg * keep.to(pg.dtype)
        kl = None if kl is None else kl * keep.to(kl.dtype)
    per_token = pg if kl is None else pg + kl_coef * kl
    loss = _aggregate(per_token, maskf, aggregation)

    with torch.no_grad():
        n = maskf.sum().clamp(min=1)
        stats = {
            "pg_loss": float(_aggregate(pg, maskf, aggregation)),
            "clip_frac": float(((pg_clipped > pg_unclipped).to(maskf.dtype) * maskf).sum() / n),
            "ratio_mean": float((ratio * maskf).sum() / n),
            "kl": float((kl * maskf).sum() / n) if kl is not None else 0.0,
        }
        if entropy is not None:
            stats["entropy"] = float((entropy * maskf).sum() / n)
    return loss, stats


def minibatch_indices(
    n: int,
    mini_batch_size: int,
    micro_batch_size: int,
    epochs: int = 1,
    generator: torch.Generator | None = None,
    lengths: Sequence[int] | None = None,
    max_tokens: int = 0,
    packed: bool = False,
    sampled: Sequence[int] | None = None,
    max_sampled: int = 0,
    shared_rows: Sequence[Sequence[int]] | None = None,
    attn: float = 0.0,
) -> list[list[list[torch.Tensor]]]:
    """PPO's schedule over a batch of n rollouts: `epochs` passes, each a list of mini-batches
    (one optimizer step each), each a list of micro-batch index tensors (one forward each).

    mini_batch_size 0 (or >= n) = the whole batch. With several mini-batches each pass visits
    the rollouts in a fresh order drawn from `generator` (cleanrl's per-epoch shuffle): the batch
    is group-major, so an in-order split would give each update only a few tasks. With one
    mini-batch the order is kept: it cannot change the summed gradient.

    Micro-batches: `micro_batch_size` rollouts each, in order; or, with max_tokens > 0 and the
    rollouts' `lengths` (tokens), the mini-batch's rollouts sorted by length and packed up to
    max_tokens computed tokens and at most `max_sampled` of the rollouts' `sampled` positions
    (rcgrpo.training.batching.micro_batches; `packed`: the forward concatenates them without
    padding). With `shared_rows` (each rollout's token ids: the update shares prompt prefixes)
    the budget counts the tokens the shared forward computes (shared_prefix.micro_batches, its
    clusters weighing attention at `attn`).
    The mini-batches are the same either way.
    """
    from rcgrpo.training import shared_prefix
    from rcgrpo.training.batching import micro_batches

    if max_tokens and (lengths is None or len(lengths) != n):
        raise ValueError(f"token-budget micro-batches need the {n} rollout lengths")

    def split(idx: torch.Tensor) -> list[torch.Tensor]:
        if not max_tokens:
            return list(idx.split(micro_batch_size))
        rows = idx.tolist()
        counts = [sampled[i] for i in rows] if sampled is not None else None
        if shared_rows is not None:
            mine = [shared_rows[i] for i in rows]
            return [
                idx[torch.tensor(g)]
                for g in shared_prefix.micro_batches(mine, max_tokens, counts, max_sampled, attn)
            ]
        groups = micro_batches([lengths[i] for i in rows], max_tokens, packed, counts, max_sampled)
        return [idx[torch.tensor(g)] for g in groups]

    mini = min(mini_batch_size or n, n)
    passes = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator) if mini < n else torch.arange(n)
        passes.append([split(order[i : i + mini]) for i in range(0, n, mini)])
    return passes


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids | context) from logits (..., V) already aligned with ids (...) -> (...):
    (B, T, V) with (B, T), or (N, V) with (N,) at the masked positions (rcgrpo.training.forward).

    Computed as logit - logsumexp (no (B, T, V) log-softmax copy kept for the backward)."""
    picked = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return picked.float() - torch.logsumexp(logits.float(), dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution, logits (B, T, V) -> (B, T), no grad needed."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)

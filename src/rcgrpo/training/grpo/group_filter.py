"""Which of a step's groups train (rl.group_filter), and DAPO's refill (rl.refill), counted
honestly: every rollout generated counts, kept or dropped.

The other known fixes for zero-variance groups, beside RC-GRPO's reward tokens:
- `drop_zero_variance`: DAPO's dynamic sampling (Yu et al., arXiv 2503.14476, "over-sample and
  filter out prompts with accuracy 1 and 0"): a group whose G rewards are all equal has zero
  advantage and adds nothing but noise (the KL term) to the update, so it is dropped;
- `top_variance`: RAGEN-2 (arXiv 2604.06268) keeps the top rho of the groups by reward variance
  (`rl.top_variance_keep`);
- `rl.refill: oversample` draws further groups (tasks the step has not drawn yet while enough
  are left: rollouts.round_pool; new reward tokens, new seeds) until
  the step holds `tasks_per_step` kept groups or `rl.refill_max_rounds` extra rounds are spent.

`reward/*` (the high- and low-goal means too) and the zero-variance figures of a step stay
those of its first draw (the policy as it is, comparable with an unfiltered run; the kept groups'
are logged as `reward/<name>_kept`); `rollout/groups_dropped` and `rollout/extra_rollouts`
say what the filter did, `rollout/effective_groups` (every run) how many trained groups carry a
reward spread, and every rollout of every round counts in `rollout/generated` and its sampled
tokens in `rollout/generated_tokens` (the budget `rl.generated_token_budget` and the arena
compare at). A step left with no group makes no
update (`loss/optimizer_steps` 0).

    .venv/bin/pytest tests/test_zero_variance.py -q -k filter
"""

from __future__ import annotations

import dataclasses
import math

import torch

from rcgrpo.training.grpo.metrics import other_check, reward_metrics
from rcgrpo.training.grpo.presample import downsample
from rcgrpo.training.grpo.rollouts import StepRollouts

ROUND_SEED = 104_729  # round r of a step draws with seed + r x this (a prime: no overlap)


def keep_groups(rewards: torch.Tensor, how: str, keep_share: float = 1.0) -> list[int]:
    """rewards (n, G) -> the indices of the groups that train, in order.

    none: all; drop_zero_variance: those whose rewards are not all equal; top_variance: the
    ceil(keep_share x n) of largest variance (ties: the earlier group first)."""
    n = rewards.shape[0]
    var = rewards.float().var(dim=1, unbiased=False) if n else rewards.new_zeros(0)  # (n,)
    if how == "none":
        return list(range(n))
    if how == "drop_zero_variance":
        return [i for i in range(n) if var[i] > 0]
    if how == "top_variance":
        k = math.ceil(keep_share * n)
        return sorted(sorted(range(n), key=lambda i: (-float(var[i]), i))[:k])
    raise ValueError(f"rl.group_filter {how!r}: none, drop_zero_variance or top_variance")


def subset(out: StepRollouts, groups: list[int], G: int) -> StepRollouts:
    """`out` with only `groups` (indices into its tasks), group-major as before."""
    rows = [g * G + j for g in groups for j in range(G)]
    return dataclasses.replace(
        out,
        tasks=[out.tasks[g] for g in groups],
        tokens=[out.tokens[r] for r in rows],
        rollouts=[out.rollouts[r] for r in rows],
        scores=[out.scores[r] for r in rows],
        rewards=out.rewards[groups] if groups else out.rewards[:0],
        advantages=out.advantages[rows] if rows else out.advantages[:0],
        records=[],  # the whole records were handed to on_rollouts per round
    )


def merge(parts: list[StepRollouts], n: int, G: int) -> StepRollouts:
    """The kept groups of every round, the first `n` of them, as one step."""
    return dataclasses.replace(
        parts[0],
        tasks=[t for p in parts for t in p.tasks][:n],
        tokens=[t for p in parts for t in p.tokens][: n * G],
        rollouts=[r for p in parts for r in p.rollouts][: n * G],
        scores=[s for p in parts for s in p.scores][: n * G],
        rewards=torch.cat([p.rewards for p in parts])[:n],
        advantages=torch.cat([p.advantages for p in parts])[: n * G],
        seconds=sum(p.seconds for p in parts),
        own=sum(p.own for p in parts),
        records=[],
    )


def collect(roll, cfg) -> tuple[StepRollouts, dict]:
    """roll(seed) -> one round's StepRollouts (the step's draw at that run seed); the step's
    kept groups and the metrics of what was generated and dropped. With a filter or PODS'
    down-sampling, `reward/*` and the group statistics are those of the whole first draw."""
    G, n = cfg.group_size, cfg.tasks_per_step
    first = roll(cfg.seed)
    if cfg.group_filter == "none" and cfg.refill == "none" and not cfg.rollouts_per_task:
        return first, generated([first])
    seen = reward_metrics(first.rewards, first.tokens, cfg.conditioning)
    if (other := other_check(first.scores, cfg.reward)) is not None:
        seen["reward/other_checker_mean"] = other

    def kept_of(out: StepRollouts) -> tuple[StepRollouts, int]:
        if cfg.rollouts_per_task:  # PODS: the max-variance G of each group's rollouts
            out = downsample(out, G, cfg.advantage)
        kept = keep_groups(out.rewards, cfg.group_filter, cfg.top_variance_keep)
        return subset(out, kept, G), len(out.tasks) - len(kept)

    part, dropped = kept_of(first)
    parts, extra, rounds, rolled = [part], 0, 0, [first]
    while (
        cfg.refill == "oversample"
        and sum(len(p.tasks) for p in parts) < n
        and rounds < cfg.refill_max_rounds
    ):
        rounds += 1
        more = roll(cfg.seed + ROUND_SEED * rounds)
        rolled.append(more)
        extra += len(more.rollouts)
        part, lost = kept_of(more)
        dropped += lost
        parts.append(part)
    out = merge(parts, n, G)
    metrics = {
        **seen,
        "rollout/groups_dropped": float(dropped),
        "rollout/extra_rollouts": float(extra),
        **generated(rolled),
    }
    return out, metrics


def generated(rounds: list[StepRollouts]) -> dict:
    """What a step generated over its rounds, kept or dropped: rollouts, sampled tokens, and
    the prompt tokens sent to and prefilled by the engine (when the engine counts them)."""
    out = {
        "rollout/generated": float(sum(len(r.rollouts) for r in rounds)),
        "rollout/generated_tokens": float(sum(r.generated_tokens for r in rounds)),
    }
    for name in ("rollout/prompt_tokens", "rollout/prefill_tokens"):
        if all(name in r.engine_metrics for r in rounds):
            out[name] = float(sum(r.engine_metrics[name] for r in rounds))
    return out


def first_draw(metrics: dict, filtered: dict) -> dict:
    """The step's metrics (of the trained groups) under `filtered`'s first-draw values, each
    replaced `reward/*` value kept as `reward/<name>_kept`."""
    kept = {f"{k}_kept": v for k, v in metrics.items() if k in filtered and "reward/" in k}
    return {**metrics, **filtered, **kept}

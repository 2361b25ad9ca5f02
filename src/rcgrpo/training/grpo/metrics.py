"""The metrics of one RL step, by name (each defined once in docs/metrics.md): `reward/*` from the
step's scores and tokens, `rollout/*` from the groups, `loss/*` from the optimizer steps,
`perf/*` from the wall clock.

    .venv/bin/pytest tests/test_trainer.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rcgrpo.chat.record import HIGH
from rcgrpo.training.grpo.config import RLConfig
from rcgrpo.training.grpo.core_algos import group_reward_stats
from rcgrpo.training.grpo.rollouts import StepRollouts


def step_metrics(
    cfg: RLConfig,
    step: StepRollouts,
    mask,
    gap,
    updates: list[dict],
    lr: float,
    step_seconds: float,
) -> dict:
    """mask (B, T-1): the sampled tokens; gap: the mean |engine - trainer| log-prob per sampled
    token (update.engine_gap); updates: the stats of each optimizer step (update.ppo_updates)."""
    rewards, adv = step.rewards, step.advantages
    acc = {k: sum(u[k] for u in updates) / len(updates) for k in updates[0]}
    gen_tokens = float(mask.sum())
    spread = int((rewards.float().var(dim=1, unbiased=False) > 0).sum())  # groups with a signal
    other = other_check(step.scores, cfg.reward)  # BFCL: the checker that does not train
    metrics = {
        **reward_metrics(rewards, step.tokens, cfg.conditioning),
        **({"reward/other_checker_mean": other} if other is not None else {}),
        "rollout/effective_groups": float(spread),  # trained groups with a reward spread
        "rollout/effective_group_frac": spread / cfg.tasks_per_step,
        "rollout/adv_std": float(adv.std(unbiased=False)),
        "rollout/adv_abs_mean": float(adv.abs().mean()),
        "rollout/zero_adv_frac": float((adv == 0).float().mean()),
        "rollout/response_tokens": gen_tokens / len(step.rollouts),
        "rollout/logprob_gap": float(gap),
        "loss/total": acc["total"],
        "loss/pg": acc["pg_loss"],
        "loss/kl": acc["kl"],
        "loss/clip_frac": acc["clip_frac"],
        "loss/ratio_mean": acc["ratio_mean"],
        "loss/clip_frac_last": updates[-1]["clip_frac"],  # the most off-policy update
        "loss/ratio_mean_last": updates[-1]["ratio_mean"],
        "loss/optimizer_steps": len(updates),
        "loss/entropy": acc["entropy"],
        "loss/grad_norm": acc["grad_norm"],
        "loss/lr": lr,
        "perf/gen_tokens_per_s": gen_tokens / max(step.seconds, 1e-9),
        "perf/rollout_s": step.seconds,
        "perf/step_s": step_seconds,
        **step.engine_metrics,  # rollout/prefix_cache_hit_rate, rollout/prompt_tokens, ...
    }
    return metrics


def reward_metrics(rewards: torch.Tensor, tokens: list, conditioning: str) -> dict:
    """`reward/*` and the group statistics of one draw: rewards (n, G), tokens (n*G,) the
    rollouts' reward goals, group-major. With reward conditioning, the means per goal (only for
    goals drawn), their gap, and the share of the groups' reward variance the goal explains."""
    metrics = {
        "reward/mean": float(rewards.mean()),
        **{f"rollout/{k}": v for k, v in group_reward_stats(rewards).items()},
    }
    if conditioning == "rc":
        is_high = torch.tensor([t == HIGH for t in tokens]).view(rewards.shape)
        for name, sel in (("high", is_high), ("low", ~is_high)):
            if sel.any():
                metrics[f"reward/mean_{name}"] = float(rewards[sel].mean())
        if is_high.any() and (~is_high).any():
            metrics["reward/token_gap"] = metrics["reward/mean_high"] - metrics["reward/mean_low"]
        share = goal_variance_share(rewards, is_high)
        if share is not None:
            metrics["reward/goal_variance_share"] = share
    return metrics


def goal_variance_share(rewards: torch.Tensor, is_high: torch.Tensor) -> float | None:
    """rewards, is_high (n, G) -> the share of the within-group reward variance that the goal
    token explains: sum over groups of the between-goal sum of squares (n_goal x (goal mean -
    group mean)^2 per goal) over the sum of the groups' total sums of squares; None when every
    group is constant (nothing to explain)."""
    r = rewards.float()
    centred = r - r.mean(dim=1, keepdim=True)
    total = float(centred.square().sum())
    if total <= 0.0:
        return None
    between = 0.0
    for sel in (is_high, ~is_high):
        n = sel.sum(dim=1)  # (n_groups,)
        mean = (centred * sel).sum(dim=1) / n.clamp(min=1)  # goal mean minus group mean
        between += float((n * mean.square()).sum())
    return between / total


def other_check(scores: list, reward: str) -> float | None:
    """The mean over the step's rollouts of the first named check beside the one rl.reward
    trains on (BFCL trained on "paper": the "bfcl" check); None for an environment whose
    checks do not include `reward` (its scorer chose its training reward itself)."""
    checks = scores[0].checks if scores else {}
    names = [n for n in checks if n != reward]
    if reward not in checks or not names:
        return None
    return float(torch.tensor([s.checks[names[0]] for s in scores]).float().mean())


def trim_jsonl(path: Path, step: int) -> None:
    """metrics.jsonl keeps steps 1..`step` only: after a resume the steps past the checkpoint
    are recomputed identically; a fresh run (step 0) starts an empty file instead of appending
    to an earlier run's (write_summary averages the whole file)."""
    if path.exists():
        kept = [ln for ln in path.read_text().splitlines() if json.loads(ln)["step"] <= step]
        path.write_text("".join(ln + "\n" for ln in kept))

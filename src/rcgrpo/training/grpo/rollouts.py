"""Rollout and score one RL step: draw the step's tasks and each rollout's reward token, roll
the groups out through the engine, score them, and turn the rewards into group advantages.

Every draw of step s comes from a generator seeded by (seed, s) (config.step_seed), so a
resumed run draws exactly what an uninterrupted one did. Under `accelerate launch` / torchrun
each rank rolls out its share of whole groups on its own engine, with the episode indices of the
whole batch (so the 1-process seeds), scores them, and the ranks gather what training reads
(`Sampled`: ids, loss mask, log-probs) and the scores, in rank order: every rank then holds the
1-process batch (rcgrpo.training.distributed).

    .venv/bin/pytest tests/test_trainer.py -q
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.rollout.call_stats import merge_stats
from rcgrpo.rollout.environment import Rewards
from rcgrpo.training.distributed import group_share
from rcgrpo.training.grpo import exchange
from rcgrpo.training.grpo.config import RLConfig, step_seed
from rcgrpo.training.grpo.core_algos import group_advantages, sample_reward_tokens
from rcgrpo.training.grpo.overlong import apply_overlong


@dataclass
class Sampled:
    """What the update reads of one rollout, compact enough to gather across ranks (an RL
    step of the paper preset: 1,280 episodes of 6-80k tokens; 9 bytes per token here)."""

    ids: torch.Tensor  # (T,) int32 token ids, prompt and sampled
    loss_mask: torch.Tensor  # (T,) int8, 1 where the policy sampled the token
    logprobs: torch.Tensor  # (T,) float32 the engine's log-probs (0 where not sampled)
    truncated: bool = False  # stopped by the episode token budget (rl.overlong)

    @classmethod
    def of(cls, rollout) -> Sampled:
        return cls(
            torch.as_tensor(rollout.ids, dtype=torch.int32),
            torch.as_tensor(rollout.loss_mask, dtype=torch.int8),
            torch.as_tensor(rollout.logprobs, dtype=torch.float32),
            rollout.stop_reason == "token_budget",
        )


@dataclass
class StepRollouts:
    """One step's rollouts, group-major: n tasks x G rollouts."""

    tasks: list  # (n,) the step's tasks
    tokens: list  # (n*G,) each rollout's reward token (None without conditioning)
    rollouts: list  # (n*G,) Sampled: ids, loss mask, sampling log-probs (all ranks' shares)
    scores: list[Rewards]  # (n*G,) each rollout's training reward and named checks
    rewards: torch.Tensor  # (n, G) the training reward (Rewards.train)
    advantages: torch.Tensor  # (n*G,) group advantages
    seconds: float  # wall time of the rollout (this rank's share, then the gather)
    own: int = 0  # rollouts this rank sampled itself (all of them in one process)
    # the engines' last_stats over all ranks: prefix-cache hit rate, tokens sent / prefilled,
    # busy fraction (rcgrpo.rollout.engine)
    engine_metrics: dict = field(default_factory=dict)
    records: list = field(default_factory=list)  # (own,) those rollouts whole (agent-loop records)
    first: int = 0  # batch index of records[0] (0 in one process)
    generated_tokens: int = 0  # sampled tokens of the round as rolled out (before rl.overlong)


def draw(tasks: list, cfg: RLConfig, step: int) -> tuple[list, list]:
    """Tasks (n,) and the token of each of the n*G rollouts, from the step's generator."""
    g = torch.Generator().manual_seed(step_seed(cfg.seed, step))
    n = min(cfg.tasks_per_step, len(tasks))
    picked = torch.randperm(len(tasks), generator=g)[:n].tolist()
    chosen = [tasks[i] for i in picked]
    if cfg.conditioning == "rc":
        high = sample_reward_tokens(n, cfg.group_size, cfg.p_high, cfg.token_sampling, g)
        tokens = [HIGH if h else LOW for h in high.flatten().tolist()]  # (n*G,) group-major
    else:
        tokens = [None] * (n * cfg.group_size)
    return chosen, tokens


def roll_out(engine, ranks, tasks, tokens, cfg: RLConfig, step: int, score_fn) -> StepRollouts:
    """The G rollouts of each task, scored by score_fn(task, rollout) -> Rewards
    (rcgrpo.rollout.environment.Scorer): this rank rolls out its share of whole groups
    (ranks.group_share; all of them in one process), with the episode indices they have in the
    whole batch, and every rank gets every share (ranks.gather)."""
    t0 = time.perf_counter()
    G = cfg.group_size
    flat_tasks = [t for t in tasks for _ in range(G)]  # group-major, matches tokens
    start, end = (i * G for i in ranks.group_share(len(tasks)))
    mine = []
    if end > start:  # a rank with no group (more ranks than groups) only gathers
        mine = engine.rollout(
            flat_tasks[start:end],
            tokens[start:end],
            cfg.protocol,
            step_seed(cfg.seed, step),
            first_index=start,
        )
    scored = [
        (Sampled.of(r), score_fn(t, r)) for t, r in zip(flat_tasks[start:end], mine, strict=True)
    ]
    stats = dict(getattr(engine, "last_stats", None) or {}) if mine else {}
    parts = gather(ranks, scored, stats, len(tasks), G)
    gathered = [x for part, _ in parts for x in part]  # rank order = batch order
    # the whole step's engine metrics: token counts summed over the ranks' engines, the hit
    # rate over all their prompts (rcgrpo.rollout.call_stats.merge_stats, as over Ray shards)
    engine_metrics = merge_stats([st for _, st in parts if st])
    seconds = time.perf_counter() - t0
    rollouts = [r for r, _ in gathered]
    scores = [s for _, s in gathered]
    generated = sum(int(r.loss_mask.sum()) for r in rollouts)  # before rl.overlong masks any
    rewards = torch.tensor([s.train for s in scores], dtype=torch.float32).view(-1, G)
    # rl.overlong shapes the training reward only: `rewards` (reward/* metrics) stay the checker's
    shaped, rollouts = shape_overlong(rewards, rollouts, cfg, engine)
    adv = group_advantages(shaped, cfg.advantage).flatten()  # (B,)
    return StepRollouts(
        tasks,
        tokens,
        rollouts,
        scores,
        rewards,
        adv,
        seconds,
        len(mine),
        engine_metrics,
        records=mine,
        first=start,
        generated_tokens=generated,
    )


def gather(ranks, scored: list, stats: dict, n_groups: int, G: int) -> list[tuple[list, dict]]:
    """Every rank's (scored, stats), in rank order. Across ranks in a fixed format, never a
    pickle (rcgrpo.training.grpo.exchange): decoding another rank's bytes runs nothing it chose,
    and each rank must have sent exactly its share of the groups."""
    if ranks.world == 1:
        return [(scored, stats)]
    sent = ranks.gather(exchange.encode(scored, stats))
    parts = [
        (scored, stats) if rank == ranks.rank else _sampled(data, rank)
        for rank, data in enumerate(sent)
    ]
    for rank, (part, _) in enumerate(parts):
        start, end = group_share(n_groups, rank, ranks.world)
        if len(part) != (end - start) * G:
            raise exchange.ExchangeError(
                f"rank {rank} sent {len(part)} rollouts for its share of {end - start} groups "
                f"of {G}"
            )
    return parts


def _sampled(data: bytes, rank: int) -> tuple[list, dict]:
    """Rank `rank`'s bytes as its [(Sampled, Rewards)] and engine stats."""
    rows, stats = exchange.decode(data, rank)
    return [(Sampled(*fields), rewards) for fields, rewards in rows], stats


def shape_overlong(rewards, rollouts: list, cfg: RLConfig, engine) -> tuple:
    """rl.overlong on a step: (n, G) training rewards and the rollouts, their loss masks zeroed
    (mask) or their rewards penalised by length (soft_penalty); `train` returns them as they are.
    The budget is the engine's `rollout.max_total_tokens`."""
    if cfg.overlong == "train":
        return rewards, rollouts
    truncated = torch.tensor([r.truncated for r in rollouts])
    lengths = torch.tensor([len(r.ids) for r in rollouts])
    masks = [r.loss_mask for r in rollouts]
    max_len = engine.cfg.limits.max_total_tokens
    args = (truncated, lengths, max_len, cfg.overlong_cache)
    rewards, masks = apply_overlong(cfg.overlong, rewards, masks, *args)
    return rewards, [replace(r, loss_mask=m) for r, m in zip(rollouts, masks, strict=True)]

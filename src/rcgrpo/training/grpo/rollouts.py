"""Rollout and score one RL step: draw the step's tasks and each rollout's reward token, roll
the groups out through the engine, score them, and turn the rewards into group advantages.

Every draw of step s comes from a generator seeded by (seed, s) (config.step_seed), so a
resumed run draws exactly what an uninterrupted one did. Under `accelerate launch` rank 0 rolls
out and the batch is broadcast, so every rank trains on the 1-process batch.

    .venv/bin/pytest tests/test_trainer.py -q
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.training.grpo.config import RLConfig, step_seed
from rcgrpo.training.grpo.core_algos import group_advantages, sample_reward_tokens


@dataclass
class StepRollouts:
    """One step's rollouts, group-major: n tasks x G rollouts."""

    tasks: list  # (n,) the step's tasks
    tokens: list  # (n*G,) each rollout's reward token (None without conditioning)
    rollouts: list  # (n*G,) engine Rollouts: ids, loss mask, sampling log-probs
    scores: list[tuple[int, int]]  # (n*G,) (paper 0/1, bfcl 0/1)
    rewards: torch.Tensor  # (n, G) the training reward (cfg.reward's checker)
    advantages: torch.Tensor  # (n*G,) group advantages
    seconds: float  # wall time of the rollout
    engine_metrics: dict = field(default_factory=dict)  # the engine's last_stats (rank 0)


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


def score(task, rollout, protocol: str) -> tuple[int, int]:
    """(paper 0/1, bfcl 0/1) of a rollout: its own verdicts when the agent loop scored it,
    else the checkers on its calls."""
    record = getattr(rollout, "trajectory", None)  # agent_loop.Rollout: already scored
    if record is not None:
        return int(record.paper_reward), int(record.bfcl_reward)
    from rcgrpo.bfcl.checkers import score as check

    paper, bfcl = check(task, rollout.calls, protocol)
    return paper.reward, bfcl.reward


def roll_out(engine, ranks, tasks, tokens, cfg: RLConfig, step: int, score_fn) -> StepRollouts:
    """The G rollouts of each task (rank 0 samples, every rank gets the batch), scored."""
    t0 = time.perf_counter()
    G = cfg.group_size
    flat_tasks = [t for t in tasks for _ in range(G)]  # group-major, matches tokens
    rollouts, engine_metrics = None, {}
    if ranks.rank == 0:
        rollouts = engine.rollout(flat_tasks, tokens, cfg.protocol, step_seed(cfg.seed, step))
        # prefix-cache hit rate, tokens sent / prefilled, busy fraction (rcgrpo.rollout.engine)
        engine_metrics = dict(getattr(engine, "last_stats", None) or {})
    rollouts = ranks.broadcast(rollouts)  # the 1-process batch, sampled once
    seconds = time.perf_counter() - t0
    scores = [score_fn(t, r) for t, r in zip(flat_tasks, rollouts, strict=True)]
    col = 0 if cfg.reward == "paper" else 1
    rewards = torch.tensor([s[col] for s in scores], dtype=torch.float32).view(-1, G)
    adv = group_advantages(rewards, cfg.advantage).flatten()  # (B,)
    return StepRollouts(tasks, tokens, rollouts, scores, rewards, adv, seconds, engine_metrics)

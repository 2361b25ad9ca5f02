"""Skip tasks that gave no signal before rolling them out, and train on the max-variance subset
of more rollouts: the two speed-ups of Qian et al., "On Effectiveness and Efficiency of Agentic
Tool-calling and RL Training" (ICML 2026, arXiv 2606.00135), as settings of the same trainer.

- Pre-rollout no-signal filtering (`rl.task_prefilter: no_signal`), as GRESO (Zheng et al.,
  arXiv 2506.02177) does it: a task whose last z draws were all zero-variance groups (every
  rollout the same reward: no advantage) is skipped before its rollouts with probability
  1 - `rl.prefilter_keep`^z, so a task that stays silent is tried less and less often, never
  ruled out. The step's generator walks the tasks in a random order and takes the first
  `tasks_per_step` not skipped (skipped ones fill the step when too few remain: a step always has
  its groups). Choice: a fixed keep probability (GRESO adapts it to a target share of silent
  groups; the paper does not state its schedule).
- Max-variance down-sampling (PODS, Xu et al., arXiv 2504.13818; `rl.rollouts_per_task: n`):
  each task gets n rollouts and the `group_size` of them whose rewards have the largest variance
  train; their advantages are computed over that subset, as PODS does. For a fixed subset size
  the max-variance subset is the k highest and m - k lowest rewards for some k (PODS, Lemma 1),
  so trying the m + 1 splits of the sorted rewards finds it in O(n log n).

Every rollout generated counts in `rollout/generated` and its sampled tokens against
`rl.generated_token_budget`; the streaks are saved in checkpoints, so a resumed run skips as the
uninterrupted one did.

    .venv/bin/pytest tests/test_presample.py -q
"""

from __future__ import annotations

import dataclasses

import torch

from rcgrpo.training.grpo import rollouts
from rcgrpo.training.grpo.core_algos import ZERO_STD, group_advantages
from rcgrpo.training.grpo.rollouts import StepRollouts


def skip_probability(streak: int, keep: float) -> float:
    """P(skip) of a task whose last `streak` groups had zero variance: 1 - keep^streak."""
    return 1.0 - keep**streak if streak > 0 else 0.0


def pick(order: list[int], streaks: list[int], n: int, keep: float, u: list[float]) -> list[int]:
    """The first n of `order` (indices into the task list) not skipped, u[i] ~ U(0, 1) deciding
    for order[i] (skipped when u < skip_probability); skipped ones fill up when too few remain."""
    taken = [i for i, x in zip(order, u, strict=True) if x >= skip_probability(streaks[i], keep)]
    rest = [i for i in order if i not in taken]
    return (taken + rest)[:n]


def max_variance_subset(rewards: list[float], m: int) -> list[int]:
    """Indices (ascending) of the m rewards of largest population variance: the best split of
    the sorted rewards into its k highest and m - k lowest (ties: the fewest highest)."""
    if not 0 < m <= len(rewards):
        raise ValueError(f"max_variance_subset: need 0 < m <= {len(rewards)}, got m = {m}")
    order = sorted(range(len(rewards)), key=lambda i: (rewards[i], i))  # stable by index

    def variance(idx: list[int]) -> float:
        vals = [rewards[i] for i in idx]
        mean = sum(vals) / len(vals)
        return sum((v - mean) ** 2 for v in vals) / len(vals)

    best: list[int] = order[:m]
    for k in range(1, m + 1):
        cand = order[: m - k] + order[len(order) - k :]
        if variance(cand) > variance(best) + 1e-12:
            best = cand
    return sorted(best)


def downsample(out: StepRollouts, m: int, advantage: str) -> StepRollouts:
    """A round of n tasks x N rollouts cut to the m of each group of largest reward variance,
    group-major as before, with the advantages of the kept rewards."""
    n, big = out.rewards.shape
    keep = [max_variance_subset(out.rewards[g].tolist(), m) for g in range(n)]
    rows = [g * big + j for g in range(n) for j in keep[g]]
    rewards = torch.stack([out.rewards[g, keep[g]] for g in range(n)]) if n else out.rewards
    return dataclasses.replace(
        out,
        tokens=[out.tokens[r] for r in rows],
        rollouts=[out.rollouts[r] for r in rows],
        scores=[out.scores[r] for r in rows],
        rewards=rewards,
        advantages=group_advantages(rewards, advantage).flatten(),
        records=[],  # the whole records were handed to on_rollouts with the round
    )


class NoSignal:
    """Per task id, how many of its most recent groups in a row had zero variance."""

    def __init__(self, keep: float, streaks: dict[str, int] | None = None):
        self.keep = keep
        self.streaks: dict[str, int] = dict(streaks or {})

    def pick(self, tasks: list, n: int, g: torch.Generator) -> list[int]:
        """n task indices from the step's generator `g` (the order, then one uniform each)."""
        order = torch.randperm(len(tasks), generator=g).tolist()
        u = torch.rand(len(order), generator=g).tolist()
        streaks = [self.streaks.get(t.id, 0) for t in tasks]
        return pick(order, streaks, min(n, len(tasks)), self.keep, u)

    def update(self, out: StepRollouts) -> None:
        """Count each group of a round (all N rollouts, before any down-sampling)."""
        silent = (out.rewards.float().std(dim=1, unbiased=False) < ZERO_STD).tolist()
        for task, s in zip(out.tasks, silent, strict=True):
            self.streaks[task.id] = self.streaks.get(task.id, 0) + 1 if s else 0


class Draws:
    """A trainer's task draws: each round of a step from the step's generator, a refill round
    among the tasks the step has not drawn yet (rollouts.round_pool), silent tasks skipped with
    `rl.task_prefilter: no_signal`; its state goes into checkpoints."""

    def __init__(self, tasks: list, cfg):
        self.tasks, self.drawn = tasks, set()
        on = cfg.task_prefilter == "no_signal"
        self.no_signal = NoSignal(cfg.prefilter_keep) if on else None

    def draw(self, cfg, step: int, first: bool) -> tuple[list, list]:
        """Tasks (n,) and tokens (n*G,) of a round at `cfg`'s seed; `first`: the step's own."""
        self.drawn = set() if first else self.drawn
        pool = rollouts.round_pool(self.tasks, self.drawn, cfg.tasks_per_step)
        tasks, tokens = rollouts.draw(pool, cfg, step, self.no_signal)
        self.drawn |= {t.id for t in tasks}
        return tasks, tokens

    def seen(self, out: StepRollouts) -> None:
        if self.no_signal is not None:
            self.no_signal.update(out)

    def state(self) -> dict:
        return {"no_signal": self.no_signal.streaks if self.no_signal is not None else {}}

    def restore(self, extra: dict) -> None:
        if self.no_signal is not None:
            self.no_signal.streaks = dict(extra.get("no_signal", {}))

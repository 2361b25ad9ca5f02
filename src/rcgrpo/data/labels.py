"""Quality labels: reward 1 -> <|high_reward|>, 0 -> <|low_reward|>, and the 1:1 balance.

The label is the record's reward: the environment's training check (BFCL: the paper's R, never
BFCL's own check).
It is written twice, on purpose: `reward_token` (for code) and the literal text
`[Reward Goal: <|…|>]` appended to the first user message (what the model reads, as in the
paper). `with_goal` refuses to append a second goal, so a renderer cannot double it.

The mixed (RCTP-FT) set of a split is every expert plus `round(n_experts * low_per_high)`
failures drawn round-robin over tasks and perturbation kinds (seeded), so no task or kind
dominates the low half. The plain SFT set is the experts with no token.

    .venv/bin/python -c "from rcgrpo.data.labels import goal_text; print(goal_text(1))"
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict

from rcgrpo.chat.record import HIGH, LOW, REWARD_TOKENS, Trajectory

GOAL_FORMAT = "[Reward Goal: {token}]"
GOALS = tuple(GOAL_FORMAT.format(token=t) for t in REWARD_TOKENS)


def token_for(reward: int) -> str:
    if reward not in (0, 1):
        raise ValueError(f"a reward label needs reward 0 or 1, got {reward!r}")
    return HIGH if reward == 1 else LOW


def goal_text(reward_or_token: int | str) -> str:
    token = reward_or_token if isinstance(reward_or_token, str) else token_for(reward_or_token)
    if token not in REWARD_TOKENS:
        raise ValueError(f"unknown reward token {token!r}; known: {REWARD_TOKENS}")
    return GOAL_FORMAT.format(token=token)


def goal_counts(messages: list[dict]) -> tuple[int, int]:
    """(goals in all messages, goals in the first user message)."""
    total = first = 0
    seen_user = False
    for m in messages:
        content = m.get("content") or ""
        n = sum(content.count(g) for g in GOALS)
        total += n
        if m.get("role") == "user" and not seen_user:
            first, seen_user = n, True
    return total, first


def has_goal(messages: list[dict]) -> bool:
    return goal_counts(messages)[0] > 0


def with_goal(messages: list[dict], token: str) -> list[dict]:
    """A copy of `messages` with the goal appended to the first user message's content."""
    if has_goal(messages):
        raise ValueError("these messages already carry a reward goal; refusing to add another")
    out = copy.deepcopy(messages)
    for m in out:
        if m.get("role") == "user":
            m["content"] = f"{m['content']}\n{goal_text(token)}"
            return out
    raise ValueError("no user message to carry the reward goal")


def labelled(record: Trajectory) -> Trajectory:
    """The record with its reward token set and the goal in its first user message."""
    token = token_for(record.reward)
    out = copy.copy(record)
    out.reward_token = token
    out.messages = with_goal(record.messages, token)
    return out


def select_failures(failures: list[Trajectory], n: int, seed: int) -> list[Trajectory]:
    """`n` failures drawn round-robin over tasks (then generators), seeded.

    Fewer than `n` are returned when the pool is smaller; the validation balance check then
    says so.
    """
    rng = random.Random(seed)
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for record in failures:
        by_task[record.task_id].append(record)
    order = sorted(by_task)
    rng.shuffle(order)
    for task_id in order:
        pool = by_task[task_id]
        rng.shuffle(pool)  # spreads first picks evenly over the perturbation kinds
    chosen: list[Trajectory] = []
    depth = 0
    while len(chosen) < n and any(len(by_task[t]) > depth for t in order):
        for task_id in order:
            if len(chosen) < n and len(by_task[task_id]) > depth:
                chosen.append(by_task[task_id][depth])
        depth += 1
    return chosen


def low_half(
    rollouts: list[Trajectory], perturbed: list[Trajectory], n: int, share: float, seed: int
) -> list[Trajectory]:
    """`n` failures: at most round(n * share) rollouts, the rest perturbations."""
    from_rollouts = select_failures(rollouts, min(len(rollouts), round(n * share)), seed)
    return from_rollouts + select_failures(perturbed, n - len(from_rollouts), seed)


def mixed_set(experts: list[Trajectory], lows: list[Trajectory], seed: int) -> list[Trajectory]:
    """Labelled experts + labelled failures, shuffled with `seed`."""
    if any(r.reward != 1 for r in experts):
        raise ValueError("every expert must have reward 1 before labelling")
    if any(r.reward != 0 for r in lows):
        raise ValueError("every failure must have reward 0 before labelling")
    rows = [labelled(r) for r in experts] + [labelled(r) for r in lows]
    random.Random(seed).shuffle(rows)
    return rows


def sft_set(experts: list[Trajectory]) -> list[Trajectory]:
    """The plain SFT set: experts as they are, no token and no goal text."""
    return [r for r in experts if r.reward_token is None and not has_goal(r.messages)]

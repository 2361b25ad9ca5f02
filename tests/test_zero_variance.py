"""Over-long episodes (rl.overlong): DAPO's soft penalty and the loss mask by hand, then through
the step's real rollout path (roll_out) with the trainer tests' toy engine.

    .venv/bin/pytest tests/test_zero_variance.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_trainer import TASKS, ToyEngine, tiny_policy

from rcgrpo.training.distributed import Single
from rcgrpo.training.grpo import rollouts
from rcgrpo.training.grpo.config import RLConfig
from rcgrpo.training.grpo.core_algos import group_advantages
from rcgrpo.training.grpo.overlong import apply_overlong, soft_overlong_penalty


def test_soft_penalty_by_hand():
    # L_max 100, L_c 20: 0 up to 80, then (80 - L) / 20, -1 from 100 on
    lengths = torch.tensor([10, 80, 81, 90, 100, 130])
    expected = torch.tensor([0.0, 0.0, -0.05, -0.5, -1.0, -1.0])
    assert torch.allclose(soft_overlong_penalty(lengths, 100, 20), expected)
    with pytest.raises(ValueError, match="overlong_cache"):
        soft_overlong_penalty(lengths, 100, 0)


def test_apply_overlong_each_kind_by_hand():
    rewards = torch.tensor([[1.0, 0.0]])
    masks = [torch.tensor([0, 1, 1], dtype=torch.int8), torch.tensor([0, 1], dtype=torch.int8)]
    cut = torch.tensor([False, True])
    lengths = torch.tensor([3, 100])
    args = (cut, lengths, 100, 20)
    r, m = apply_overlong("train", rewards, masks, *args)
    assert r is rewards and m is masks
    r, m = apply_overlong("mask", rewards, masks, *args)
    assert torch.equal(r, rewards) and torch.equal(m[0], masks[0])
    assert torch.equal(m[1], torch.zeros(2, dtype=torch.int8))
    assert torch.equal(masks[1], torch.tensor([0, 1], dtype=torch.int8))  # input untouched
    r, m = apply_overlong("soft_penalty", rewards, masks, *args)
    assert torch.equal(r, torch.tensor([[1.0, -1.0]])) and m is masks


class BudgetEngine(ToyEngine):
    """ToyEngine whose odd episodes of a call end on the token budget, as the agent loop marks
    them (stop_reason "token_budget"); the budget is 9 tokens, the episodes 8 or 7 long."""

    cfg = SimpleNamespace(limits=SimpleNamespace(max_total_tokens=9))

    def rollout(self, tasks, reward_tokens, protocol, seed, first_index=0):
        out = super().rollout(tasks, reward_tokens, protocol, seed, first_index)
        for i, r in enumerate(out):
            if (first_index + i) % 2:
                r.stop_reason = "token_budget"
        return out


def step(overlong: str):
    policy = tiny_policy()
    cfg = RLConfig(
        conditioning="rc", group_size=4, tasks_per_step=3, overlong=overlong, overlong_cache=4
    )
    ranks = Single(policy.model, list(policy.model.parameters()))
    tasks, tokens = rollouts.draw(TASKS, cfg, 1)
    score = lambda t, r: (r.trajectory.paper_reward, r.trajectory.bfcl_reward)  # noqa: E731
    return rollouts.roll_out(BudgetEngine(policy), ranks, tasks, tokens, cfg, 1, score)


@pytest.mark.parametrize("kind", ["mask", "soft_penalty"])
def test_overlong_through_the_step(kind):
    base, out = step("train"), step(kind)
    assert [r.truncated for r in out.rollouts] == [bool(i % 2) for i in range(12)]
    scores = torch.tensor([s[0] for s in base.scores], dtype=torch.float32).view(3, 4)
    assert torch.equal(base.rewards, scores)  # train: as before
    for i, (b, o) in enumerate(zip(base.rollouts, out.rollouts, strict=True)):
        assert torch.equal(b.ids, o.ids)  # same seeds, same episodes
        if kind == "mask" and i % 2:
            assert o.loss_mask.sum() == 0 and b.loss_mask.sum() > 0
        else:
            assert torch.equal(o.loss_mask, b.loss_mask)
    if kind == "mask":
        assert torch.equal(out.rewards, scores)
    else:  # L_max 9, L_c 4: penalty (5 - L) / 4, L = len(ids)
        lengths = torch.tensor([len(r.ids) for r in out.rollouts], dtype=torch.float32)
        penalty = ((5 - lengths) / 4).clamp(min=-1).view(3, 4)
        assert torch.equal(out.rewards, scores)  # reward/* metrics stay the checker's 0/1
        expected = group_advantages(scores + penalty, "grpo").flatten()
        assert torch.allclose(out.advantages, expected)

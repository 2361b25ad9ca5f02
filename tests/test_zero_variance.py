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


# -- group filters (rl.group_filter, rl.refill) ------------------------------------------------


def test_keep_groups_by_hand():
    from rcgrpo.training.grpo.group_filter import keep_groups

    rewards = torch.tensor([[1.0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]])
    # variances: 0, 0.1875, 0, 0.25
    assert keep_groups(rewards, "none") == [0, 1, 2, 3]
    assert keep_groups(rewards, "drop_zero_variance") == [1, 3]
    assert keep_groups(rewards, "top_variance", 0.5) == [1, 3]  # the 2 of largest variance
    assert keep_groups(rewards, "top_variance", 0.25) == [3]
    assert keep_groups(rewards, "top_variance", 0.75) == [0, 1, 3]  # a tie at 0: earlier first
    with pytest.raises(ValueError, match="group_filter"):
        keep_groups(rewards, "best")


class CountingEngine(ToyEngine):
    """ToyEngine that counts every rollout and every sampled token it generated."""

    generated = 0

    def rollout(self, tasks, reward_tokens, protocol, seed, first_index=0):
        out = super().rollout(tasks, reward_tokens, protocol, seed, first_index)
        self.generated += len(out)
        return out


def filtered(tmp_path, **over):
    from test_trainer import make

    trainer = make(tmp_path, **over)
    trainer.engine = CountingEngine(trainer.policy)
    return trainer


def half_silent(task, rollout) -> tuple[int, int]:
    """Even tasks' groups score all 0 (zero variance); odd tasks' by the sampled ids' parity."""
    r = int(task.number % 2 == 1 and sum(rollout.ids) % 2 == 1)
    return r, r


def test_drop_zero_variance_and_oversample_count_every_rollout(tmp_path):
    """Through the real Trainer step: groups dropped and extra rounds drawn are counted, every
    rollout generated is in rollout/generated, and only groups with a reward spread train."""
    t = filtered(tmp_path, group_filter="drop_zero_variance", refill="oversample",
                 refill_max_rounds=3, steps=1)  # fmt: skip
    t.score_fn = half_silent
    m = t.train_step(1)
    n, G = 3, 4
    extra = m["rollout/extra_rollouts"]
    assert m["rollout/generated"] == t.engine.generated == n * G + extra
    assert extra > 0 and extra % (n * G) == 0 and extra <= 3 * n * G  # whole rounds, capped
    rounds = 1 + extra // (n * G)
    assert m["rollout/groups_dropped"] >= 1  # the first draw held an even (silent) task
    assert m["rollout/groups_dropped"] + m["rollout/effective_groups"] <= rounds * n
    # every trained group has a spread; refill stops early only once the step is full
    assert m["rollout/effective_groups"] == 3 or extra == 3 * n * G
    assert m["rollout/effective_group_frac"] == m["rollout/effective_groups"] / n
    assert m["loss/optimizer_steps"] > 0


def test_top_variance_keeps_its_share_and_a_step_left_empty_makes_no_update(tmp_path):
    t = filtered(tmp_path, group_filter="top_variance", top_variance_keep=0.5, steps=1)
    m = t.train_step(1)
    assert m["rollout/groups_dropped"] == 1.0  # 3 groups: the top ceil(1.5) = 2 kept
    assert m["rollout/extra_rollouts"] == 0 and m["loss/optimizer_steps"] > 0
    empty = filtered(tmp_path / "empty", group_filter="drop_zero_variance", steps=1)
    empty.score_fn = lambda task, rollout: (0, 0)  # every group all 0: nothing to keep
    before = [p.detach().clone() for p in empty.model.parameters()]
    m = empty.train_step(1)
    assert m["loss/optimizer_steps"] == 0 and m["rollout/groups_dropped"] == 3.0
    assert m["reward/mean"] == 0.0 and m["rollout/zero_variance_frac"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, empty.model.parameters(), strict=True))

"""Pre-rollout no-signal filtering and PODS' max-variance down-sampling
(rcgrpo.training.grpo.presample) by hand and through the real Trainer step; the first-draw
reward columns of a filtered step; the mechanism metrics (zero-variance split, goal variance).

    .venv/bin/pytest tests/test_presample.py -q
"""

from __future__ import annotations

import pytest
import torch
from test_trainer import deterministic, make, run

from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.rollout.environment import Rewards
from rcgrpo.training.grpo import group_filter
from rcgrpo.training.grpo.config import RLConfig
from rcgrpo.training.grpo.core_algos import group_advantages, group_reward_stats
from rcgrpo.training.grpo.metrics import goal_variance_share
from rcgrpo.training.grpo.presample import (
    downsample,
    max_variance_subset,
    pick,
    skip_probability,
)
from rcgrpo.training.grpo.rollouts import StepRollouts


def test_skip_probability_and_pick_by_hand():
    assert [skip_probability(z, 0.5) for z in (0, 1, 2)] == [0.0, 0.5, 0.75]
    streaks = [0, 2, 0, 1]  # task 1 silent twice (P(skip) 0.75), task 3 once (0.5)
    # order 3, 0, 2, 1 with u .9 .6 .1 .4: 3 kept (.9 >= .5), 0 and 2 kept, 1 skipped (.4 < .75)
    assert pick([3, 0, 2, 1], streaks, 2, 0.5, [0.9, 0.6, 0.1, 0.4]) == [3, 0]
    assert pick([3, 0, 2, 1], streaks, 4, 0.5, [0.9, 0.6, 0.1, 0.4]) == [3, 0, 2, 1]  # 1 fills
    assert pick([1, 3, 0, 2], streaks, 2, 0.5, [0.4, 0.3, 0.0, 0.99]) == [0, 2]  # 1, 3 skipped


def test_max_variance_subset_by_hand():
    # two successes of ten, keep 5: both successes and three failures (variance 0.24, not 0.16)
    assert max_variance_subset([1, 0, 0, 0, 1, 0, 0, 0, 0, 0], 5) == [0, 1, 2, 3, 4]
    assert max_variance_subset([0.1, 0.5, 0.9, 0.3], 2) == [0, 2]
    # m = 3: low 0.1, 0.3 + high 0.9 has variance 0.1156 > 0.1067 (0.1 + 0.5, 0.9) > the rest
    assert max_variance_subset([0.1, 0.5, 0.9, 0.3], 3) == [0, 2, 3]
    assert max_variance_subset([1, 1, 1], 2) == [0, 1]  # no spread to find: the first two
    with pytest.raises(ValueError, match="0 < m"):
        max_variance_subset([1, 0], 3)


def test_downsample_keeps_rows_and_recomputes_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0, 0, 1], [0, 0, 0, 0]])
    out = StepRollouts(
        tasks=["a", "b"],
        tokens=list(range(8)),
        rollouts=list(range(8)),
        scores=list(range(8)),
        rewards=rewards,
        advantages=torch.zeros(8),
        seconds=0.0,
    )
    small = downsample(out, 2, "grpo")
    # group 0 sorted by (reward, index): rollouts 1, 2 (0) then 0, 3 (1); one low + one high is
    # [1, 3] (variance 0.25); group 1 has no spread: its first two
    assert small.rollouts == [1, 3, 4, 5] and small.tokens == [1, 3, 4, 5]
    assert torch.equal(small.rewards, torch.tensor([[0.0, 1], [0, 0]]))
    assert torch.allclose(small.advantages, group_advantages(small.rewards, "grpo").flatten())
    assert small.advantages[0] < 0 < small.advantages[1] and not small.advantages[2:].any()


def alternating():
    """Even tasks: every rollout 0 (a silent group); odd tasks: 1, 0, 1, 0, ... (a spread)."""
    count = [0]

    def score(task, rollout) -> Rewards:
        count[0] += 1
        r = int(task.number % 2 == 1 and count[0] % 2 == 1)
        return Rewards(float(r), {"paper": r, "bfcl": r})

    return score


def test_pods_rolls_out_more_and_trains_the_max_variance_group_size(tmp_path):
    t = make(tmp_path, rollouts_per_task=8, steps=1)  # 3 tasks x 8 rolled out, x 4 trained
    seen = []
    t.on_rollouts = lambda step, out: seen.append(out)
    m = t.train_step(1)
    assert t.engine.episodes == 24 and m["rollout/generated"] == 24.0
    assert m["rollout/generated_tokens"] == 24 * 5 and m["rollout/response_tokens"] == 5.0
    first = seen[0].rewards  # (3, 8), the whole draw
    assert first.shape == (3, 8) and m["reward/mean"] == pytest.approx(float(first.mean()))
    kept = [max_variance_subset(row.tolist(), 4) for row in first]
    kept_mean = sum(float(first[g, k].mean()) for g, k in enumerate(kept)) / 3
    assert m["reward/mean_kept"] == pytest.approx(kept_mean)
    spread = sum(0 < float(row.sum()) < 8 for row in first)  # any group with a spread keeps one
    assert m["rollout/effective_groups"] == spread


def test_no_signal_prefilter_skips_silent_tasks_and_resumes(tmp_path):
    t = make(tmp_path / "a", task_prefilter="no_signal", prefilter_keep=1e-6, steps=4)
    t.score_fn = alternating()
    drawn = []
    t.on_rollouts = lambda step, out: drawn.extend(task.number for task in out.tasks)
    t.train()
    for even in (0, 2, 4):  # silent once, then skipped: 3 odd tasks always fill the step
        assert drawn.count(even) <= 1
    assert {t.draws.no_signal.streaks[f"toy_{n}"] for n in (1, 3, 5)} == {0}
    assert all(t.draws.no_signal.streaks.get(f"toy_{n}", 1) == 1 for n in (0, 2, 4))
    over = dict(task_prefilter="no_signal", prefilter_keep=0.3)  # streaks in the checkpoint
    _, full = run(tmp_path / "full", **over)
    run(tmp_path / "cut", stop_after=3, **over)
    _, rest = run(tmp_path / "cut", resume=True, **over)
    assert [deterministic(m) for m in rest] == [deterministic(m) for m in full[2:]]


def test_pods_settings_refused_where_they_cannot_work():
    with pytest.raises(ValueError, match="rollouts_per_task 3 < group_size 4"):
        RLConfig(group_size=4, rollouts_per_task=3)
    with pytest.raises(ValueError, match="soft_penalty"):
        RLConfig(rollouts_per_task=8, overlong="soft_penalty")


def test_a_filtered_step_reports_the_first_draw_under_every_reward_column(tmp_path):
    """With a group filter, reward/mean_high was the kept groups' mean while reward/mean was the
    first draw's: for GRPO (every goal high) the two must be one number; the kept groups' mean
    is reward/mean_high_kept."""
    t = make(tmp_path, conditioning="rc", p_high=1.0, group_filter="top_variance",
             top_variance_keep=0.34, steps=1)  # fmt: skip
    t.score_fn = alternating()  # the odd task kept (mean 0.5), an even one dropped (mean 0)
    seen = []
    t.on_rollouts = lambda step, out: seen.append(out)
    m = t.train_step(1)
    assert m["reward/mean_high"] == m["reward/mean"] == pytest.approx(float(seen[0].rewards.mean()))
    best = max(range(3), key=lambda g: (float(seen[0].rewards[g].var(unbiased=False)), -g))
    assert m["reward/mean_high_kept"] == pytest.approx(float(seen[0].rewards[best].mean()))
    assert m["reward/mean_high_kept"] != m["reward/mean_high"]  # the bug's case: they differ
    assert m["reward/other_checker_mean"] == m["reward/mean"]  # the toy's two checks agree


def test_collect_reports_the_first_draw_and_first_draw_keeps_the_kept_groups_by_hand():
    """top_variance keeps ceil(0.3 x 3) = 1 of 3 groups (G = 5, every goal high): the first draw's high-goal
    mean is (3 + 0 + 5) / 15 = 0.5333; the kept group's (1, 0, 1, 0, 1) is 0.6."""
    rewards = torch.tensor([[1.0, 0, 1, 0, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    draw = StepRollouts(
        tasks=["a", "b", "c"],
        tokens=[HIGH] * 15,
        rollouts=list(range(15)),
        scores=[Rewards(float(r), {"paper": float(r), "bfcl": 0.0}) for r in rewards.flatten()],
        rewards=rewards,
        advantages=group_advantages(rewards, "grpo").flatten(),
        seconds=0.0,
        generated_tokens=150,
    )
    cfg = RLConfig(group_size=5, tasks_per_step=3, conditioning="rc", reward="paper",
                   group_filter="top_variance", top_variance_keep=0.3)  # fmt: skip
    kept, seen = group_filter.collect(lambda seed: draw, cfg)
    assert kept.tasks == ["a"] and kept.rollouts == [0, 1, 2, 3, 4]
    assert seen["reward/mean"] == seen["reward/mean_high"] == pytest.approx(8 / 15)
    assert "reward/mean_low" not in seen and seen["reward/other_checker_mean"] == 0.0
    assert seen["rollout/zero_variance_frac"] == pytest.approx(2 / 3)
    assert seen["rollout/groups_dropped"] == 2.0 and seen["rollout/generated_tokens"] == 150.0
    step = {"reward/mean": 0.6, "reward/mean_high": 0.6, "loss/total": 1.0}  # the kept group's
    got = group_filter.first_draw(step, seen)
    assert got["reward/mean_high"] == pytest.approx(8 / 15) and got["reward/mean_high_kept"] == 0.6
    assert got["reward/mean_kept"] == 0.6 and got["loss/total"] == 1.0
    assert "loss/total_kept" not in got


def test_zero_variance_split_and_goal_variance_share_by_hand():
    rewards = torch.tensor([[0.0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 1, 0], [1, 1, 0, 0]])
    stats = group_reward_stats(rewards)
    assert stats["zero_variance_frac"] == 0.5
    assert stats["zero_variance_all_fail_frac"] == stats["zero_variance_all_success_frac"] == 0.25
    tokens = [[HIGH, LOW, HIGH, LOW]] * 2 + [[HIGH, HIGH, LOW, LOW], [HIGH, HIGH, LOW, LOW]]
    is_high = torch.tensor([[t == HIGH for t in row] for row in tokens])
    # group 3: SS total 1, goals 0.5 / 0.5 -> between 0; group 4: SS 1, goals 1 / 0 -> between 1
    assert goal_variance_share(rewards, is_high) == pytest.approx(0.5)
    assert goal_variance_share(rewards[:2], is_high[:2]) is None


def test_a_refill_round_draws_tasks_the_step_has_not_drawn(tmp_path):
    """DAPO's refill: a round after the first draws among the tasks the step has not drawn yet
    (6 tasks, 3 a round: round 2 takes the other 3; round 3 finds none new and draws from all)."""
    t = make(tmp_path, group_filter="drop_zero_variance", refill="oversample",
             refill_max_rounds=2, steps=1)  # fmt: skip
    t.score_fn = lambda task, rollout: Rewards(0.0, {"paper": 0, "bfcl": 0})  # all silent
    rounds = []
    t.on_rollouts = lambda step, out: rounds.append({task.id for task in out.tasks})
    t.train_step(1)
    assert len(rounds) == 3 and not rounds[0] & rounds[1]
    assert rounds[0] | rounds[1] == {f"toy_{i}" for i in range(6)}

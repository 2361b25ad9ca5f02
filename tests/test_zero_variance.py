"""Over-long episodes (rl.overlong): DAPO's soft penalty and the loss mask by hand, then through
the step's real rollout path (roll_out) with the trainer tests' toy engine.

    .venv/bin/pytest tests/test_zero_variance.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_trainer import TASKS, ToyEngine, tiny_policy

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.rollout.environment import Rewards
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
    score = BFCL.scorer(cfg.protocol, cfg.reward)  # reads the rollouts' own verdicts
    return rollouts.roll_out(BudgetEngine(policy), ranks, tasks, tokens, cfg, 1, score)


@pytest.mark.parametrize("kind", ["mask", "soft_penalty"])
def test_overlong_through_the_step(kind):
    base, out = step("train"), step(kind)
    assert [r.truncated for r in out.rollouts] == [bool(i % 2) for i in range(12)]
    scores = torch.tensor([s.checks["paper"] for s in base.scores], dtype=torch.float32).view(3, 4)
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


def half_silent(task, rollout) -> Rewards:
    """Even tasks' groups score all 0 (zero variance); odd tasks' by the sampled ids' parity."""
    r = int(task.number % 2 == 1 and sum(rollout.ids) % 2 == 1)
    return Rewards(float(r), {"paper": r, "bfcl": r})


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
    empty.score_fn = lambda task, rollout: Rewards(0.0, {"paper": 0, "bfcl": 0})  # all 0
    before = [p.detach().clone() for p in empty.model.parameters()]
    m = empty.train_step(1)
    assert m["loss/optimizer_steps"] == 0 and m["rollout/groups_dropped"] == 3.0
    assert m["reward/mean"] == 0.0 and m["rollout/zero_variance_frac"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, empty.model.parameters(), strict=True))


def test_the_generated_token_budget_counts_dropped_rollouts_and_survives_a_resume(tmp_path):
    """rl.generated_token_budget: a run stops after the step at which every rollout's sampled
    tokens (dropped and refilled ones too) reach the budget, and a resumed run stops at the
    same step (the count is in the checkpoint)."""
    from test_trainer import run

    dapo = dict(group_filter="drop_zero_variance", refill="oversample", refill_max_rounds=2)
    t = filtered(tmp_path / "dapo", steps=20, generated_token_budget=300, **dapo)
    t.score_fn = half_silent
    history = t.train()
    spent = [m["rollout/generated_tokens"] for m in history]
    assert spent == [5 * m["rollout/generated"] for m in history]  # 5 sampled per rollout
    assert sum(spent[:-1]) < 300 <= sum(spent) and len(history) < 20
    assert t.engine.generated * 5 == sum(spent) == history[-1]["rollout/generated_tokens_total"]
    # unfiltered: 12 rollouts x 5 = 60 tokens a step, so a budget of 100 ends after step 2
    budget = dict(steps=10, generated_token_budget=100, save_every=1)
    _, full = run(tmp_path / "full", **budget)
    assert len(full) == 2
    run(tmp_path / "cut", stop_after=1, **budget)
    trainer, rest = run(tmp_path / "cut", resume=True, **budget)
    assert trainer.step == 2 and len(rest) == 1  # not 3: 60 tokens were spent before the cut


# -- engine behaviour log-probs, engine importance sampling (rl.behaviour_logprobs, engine_is) --


def test_engine_is_token_weights_by_hand():
    from rcgrpo.training.grpo.engine_is import metrics, weights

    trainer = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    engine = torch.tensor([[-1.5, -1.0, -0.5, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last position was not sampled
    # log rho = 0.5, -1, 0: rho = 1.6487, 0.3679, 1; cap 1.5 truncates the first
    w, keep = weights("token", trainer, engine, mask, cap=1.5, bound=0.01)
    assert keep is None
    assert torch.allclose(w, torch.tensor([[1.5, 0.367879, 1.0, 0.0]]), atol=1e-6)
    m = metrics("token", trainer, engine, mask, cap=1.5, bound=0.01)
    assert m["rollout/engine_is_mean"] == pytest.approx((1.5 + 0.367879 + 1.0) / 3, abs=1e-6)
    assert m["rollout/engine_is_max"] == pytest.approx(1.648721, abs=1e-6)  # before the cap
    assert m["rollout/engine_is_clipped"] == pytest.approx(1 / 3)
    assert weights("none", trainer, engine, mask, 1.5, 0.01) == (None, None)
    assert metrics("none", trainer, engine, mask, 1.5, 0.01) == {}


def test_engine_is_sequence_mask_by_hand():
    from rcgrpo.training.grpo.engine_is import metrics, weights

    engine = torch.zeros(3, 2)
    trainer = torch.tensor([[0.004, 0.006], [0.03, 0.01], [5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])  # rollout 2: nothing sampled
    # geometric mean ratios: exp(0.005) = 1.005013 (kept), exp(0.02) = 1.020201 (> 1.01: out)
    w, keep = weights("sequence", trainer, engine, mask, cap=2.0, bound=0.01)
    assert w is None and torch.equal(keep, torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]))
    m = metrics("sequence", trainer, engine, mask, cap=2.0, bound=0.01)
    assert m["rollout/engine_is_mean"] == pytest.approx((1.005013 + 1.020201) / 2, abs=1e-6)
    assert m["rollout/engine_is_max"] == pytest.approx(1.020201, abs=1e-6)
    assert m["rollout/engine_is_clipped"] == pytest.approx(0.5)  # of the rollouts with tokens


def test_policy_loss_weight_and_keep_by_hand():
    from rcgrpo.training.grpo.core_algos import policy_loss

    logp = torch.tensor([[-1.0, -2.0]])  # = pi_old: ratio 1, pg = -A = -1 per token
    args = (logp, logp, torch.tensor([1.0]), torch.ones(1, 2))
    loss, _ = policy_loss(*args, kl_coef=0.0, is_weight=torch.tensor([[0.5, 2.0]]))
    assert loss.item() == pytest.approx(-1.25)  # (-0.5 - 2) / 2
    loss, _ = policy_loss(*args, kl_coef=0.0, keep=torch.tensor([[1.0, 0.0]]))
    assert loss.item() == pytest.approx(-0.5)  # masked tokens stay in the denominator


HF_ROLLOUT = dict(max_new_tokens=12, max_total_tokens=1024, max_steps=2)


class ShiftedEngine:
    """The HF engine as it is, except that the recorded log-probs of episode 0 are lowered by
    `shift` at its sampled tokens: an engine/trainer gap of exactly `shift` there."""

    def __init__(self, engine, shift: float):
        self.engine, self.shift, self.sampled = engine, shift, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def rollout(self, *args, **kwargs):
        out = self.engine.rollout(*args, **kwargs)
        first = out[0]
        first.logprobs = [
            p - self.shift * m for p, m in zip(first.logprobs, first.mask, strict=True)
        ]
        self.sampled = [r.n_sampled for r in out]  # (B,) sampled tokens of each episode
        return out


def hf_step(tmp_path, shift: float = 0.0, temperature: float = 1.0, **over):
    """One real RL step on the tiny profile through the HF engine: (policy, metrics, engine,
    the policy forwards run without grad outside the rollout: pi_old's).
    advantage sign: an untrained model's group may score all 0, sign still updates."""
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo.trainer import Trainer

    tasks = [t for t in tasks_in("train") if t.category == "base"][:2]
    policy = load_policy(ModelConfig())
    hf = make_engine(RolloutConfig(temperature=temperature, **HF_ROLLOUT), policy, BFCL)
    engine = ShiftedEngine(hf, shift) if shift else hf
    base = dict(steps=1, tasks_per_step=2, group_size=2, micro_batch_size=2, lr=1e-3)
    cfg = RLConfig(out_dir=str(tmp_path), advantage="sign", save_every=0, **{**base, **over})
    with hf:  # its tool workers end with the test
        trainer = Trainer(
            policy, engine, tasks, cfg, BFCL.scorer(cfg.protocol), temperature=temperature
        )
        real, no_grad = trainer._logprobs, []

        def counted(model, *args):  # the trainer's own log-prob forward, counted
            if model is trainer.model and not torch.is_grad_enabled():
                no_grad.append(1)
            return real(model, *args)

        trainer._logprobs = counted
        (metrics,) = trainer.train()
    return policy, metrics, engine, len(no_grad)


def test_engine_logprobs_with_token_is_give_the_recompute_update_on_the_hf_engine(tmp_path):
    """The HF engine serves the trained weights (gap ~1e-7): pi_old from the engine, with the
    truncated weight on, makes the update the recomputed pi_old makes, without its forward.
    lr 1e-4: AdamW's first step is lr * g / (|g| + 1e-8), so on coordinates whose gradient is
    ~1e-8 the weights' 1e-7 departure from 1 moves the update by a few % of lr."""
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    start = load_policy(ModelConfig())  # the initial weights every run starts from
    ref, m_ref, _, pi_old_ref = hf_step(tmp_path / "recompute", lr=1e-4)
    tok, _, _, _ = hf_step(tmp_path / "recompute_token", lr=1e-4, engine_is="token")
    eng, m_eng, _, pi_old_eng = hf_step(tmp_path / "engine_token", lr=1e-4,
                                        behaviour_logprobs="engine", engine_is="token")  # fmt: skip
    assert (pi_old_ref, pi_old_eng) == (2, 0)  # 4 rollouts, 2 micro-batches: no pi_old forward
    assert m_ref["rollout/logprob_gap"] < 1e-5
    assert m_eng["rollout/logprob_gap"] == m_ref["rollout/logprob_gap"]
    assert m_eng["rollout/engine_is_clipped"] == 0.0
    assert m_eng["rollout/engine_is_max"] == pytest.approx(1.0, abs=1e-5)
    moved = diff = 0.0
    with torch.no_grad():
        for a, b, c, d in zip(*(p.model.parameters() for p in (start, ref, tok, eng)), strict=True):
            assert torch.equal(c, d)  # the first pass stands in exactly for the pi_old forward
            moved = max(moved, float((b - a).abs().max()))
            diff = max(diff, float((d - b).abs().max()))
    assert moved > 5e-5  # the step did update
    assert diff < 1e-5


def test_an_injected_engine_gap_gives_the_hand_computed_weights(tmp_path):
    """Episode 0's recorded log-probs lowered by 0.3: its tokens' ratio pi_trainer / pi_engine
    is exp(0.3) = 1.3499 (the HF engine's own gap is ~1e-7), the others' 1."""
    rho = 1.349859
    _, m, eng, _ = hf_step(tmp_path / "token", 0.3, behaviour_logprobs="engine",
                           engine_is="token", engine_is_cap=1.2)  # fmt: skip
    n0, n = eng.sampled[0], sum(eng.sampled)
    assert m["rollout/engine_is_max"] == pytest.approx(rho, abs=1e-5)
    assert m["rollout/engine_is_clipped"] == pytest.approx(n0 / n)  # truncated to 1.2
    assert m["rollout/engine_is_mean"] == pytest.approx((1.2 * n0 + n - n0) / n, abs=1e-5)
    assert m["rollout/logprob_gap"] == pytest.approx(0.3 * n0 / n, abs=1e-5)
    # the weights in the loss: every episode fails (A = 2R - 1 = -1) and pi_old is the first
    # pass's own log p (ratio 1), so each token's pg term is -A * w = w
    assert m["reward/mean"] == 0.0
    assert m["loss/pg"] == pytest.approx(m["rollout/engine_is_mean"], abs=1e-6)
    _, m, eng, _ = hf_step(tmp_path / "seq", 0.3, engine_is="sequence")  # recomputed pi_old
    n0, n = eng.sampled[0], sum(eng.sampled)
    assert m["loss/pg"] == pytest.approx((n - n0) / n, abs=1e-6)  # still in the denominator
    assert m["rollout/engine_is_clipped"] == pytest.approx(1 / 4)  # episode 0 masked
    assert m["rollout/engine_is_max"] == pytest.approx(rho, abs=1e-5)
    assert m["rollout/engine_is_mean"] == pytest.approx((rho + 3) / 4, abs=1e-5)
    # engine_is none: the engine's log-probs are pi_old, the PPO ratio carries the gap
    _, m, eng, _ = hf_step(tmp_path / "bypass", 0.3, behaviour_logprobs="engine")
    n0, n = eng.sampled[0], sum(eng.sampled)
    assert m["loss/ratio_mean"] == pytest.approx((rho * n0 + n - n0) / n, abs=1e-5)
    assert "rollout/engine_is_mean" not in m


def test_engine_logprobs_are_refused_where_the_engine_cannot_serve_them(tmp_path):
    from test_trainer import make

    with pytest.raises(ValueError, match="engine 'ToyEngine' returns no sampled-token log-probs"):
        make(tmp_path, behaviour_logprobs="engine")  # a test engine without log-probs
    with pytest.raises(ValueError, match="rl.engine_is=token needs rollout.temperature 1"):
        hf_step(tmp_path, temperature=1.3, engine_is="token")

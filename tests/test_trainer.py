"""The RC-GRPO trainer on a tiny random model with a toy engine: tokens, metrics, exact resume."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from toy_models import tiny_llama

from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.training.grpo.config import RLConfig
from rcgrpo.training.grpo.core_algos import token_logprobs
from rcgrpo.training.grpo.trainer import Trainer

V, TARGET = 16, 7  # vocabulary; a rollout succeeds if it samples TARGET


def tiny_policy(seed=0):
    return SimpleNamespace(model=tiny_llama(V, seed), tokenizer=None)


class ToyEngine:
    """Samples 5 tokens after [task id, reward token] from the live policy, seeded per episode
    by (seed, its index in the whole call) like Engine.rollout, so a rank's share of a step
    samples what one process does."""

    def __init__(self, policy):
        self.policy, self.synced, self.episodes, self.ticks = policy, 0, 0, []

    def sync(self, policy):
        self.synced += 1

    def watch(self, tick):  # Engine.watch: a launched rank's heartbeat, ticked per episode
        self.ticks.append(tick)

    @torch.no_grad()
    def rollout(self, tasks, reward_tokens, protocol, seed, first_index=0):
        out = []
        self.episodes += len(tasks)
        for i, (task, tok) in enumerate(zip(tasks, reward_tokens, strict=True)):
            g = torch.Generator().manual_seed(seed * 10_007 + first_index + i)
            prompt = [1, 2 + task.number] + ({HIGH: [14], LOW: [15]}.get(tok, []))
            ids, logps = list(prompt), [0.0] * len(prompt)
            for _ in range(5):
                logits = self.policy.model(input_ids=torch.tensor([ids])).logits[0, -1]
                p = torch.softmax(logits, -1)
                nxt = int(torch.multinomial(p, 1, generator=g))
                ids.append(nxt)
                logps.append(float(p[nxt].log()))
            for tick in self.ticks:
                tick()
            r = int(TARGET in ids[len(prompt) :])
            out.append(
                SimpleNamespace(
                    ids=ids,
                    loss_mask=[0] * len(prompt) + [1] * 5,
                    logprobs=logps,
                    calls=[],
                    trajectory=SimpleNamespace(paper_reward=r, bfcl_reward=r),
                    reward_token=tok,
                    stop_reason="done",
                )
            )
        return out


TASKS = [SimpleNamespace(id=f"toy_{i}", number=i) for i in range(6)]


def make(tmp_path, **over):
    policy = tiny_policy()
    base = dict(tasks_per_step=3, group_size=4, lr=5e-3, save_every=2, micro_batch_size=5)
    cfg = RLConfig(out_dir=str(tmp_path), **{**base, **over})  # batch: 3 tasks x 4 = 12
    return Trainer(policy, ToyEngine(policy), TASKS, cfg)


def run(tmp_path, steps=4, stop_after=None, resume=False, **over):
    trainer = make(tmp_path, steps=steps, **over)
    return trainer, trainer.train(resume=resume, stop_after=stop_after)


def deterministic(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


PPO = dict(mini_batch_size=6, micro_batch_size=3, inner_epochs=2)  # 4 updates per step


@pytest.mark.parametrize("over", [{}, PPO], ids=["one-update", "mini-batches"])
def test_resume_reproduces_an_uninterrupted_run(tmp_path, over):
    _, full = run(tmp_path / "full", **over)
    _, first = run(tmp_path / "cut", stop_after=3, **over)  # checkpoint at 2, "killed" after 3
    assert [deterministic(m) for m in first] == [deterministic(m) for m in full[:3]]
    trainer, rest = run(tmp_path / "cut", resume=True, **over)
    assert trainer.step == 4 and len(rest) == 2  # resumed from step 2, not 0 nor 3
    assert [deterministic(m) for m in rest] == [deterministic(m) for m in full[2:]]
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4  # step 3's first try was dropped, not duplicated
    assert full[-1]["loss/grad_norm"] > 0
    assert full[-1]["loss/optimizer_steps"] == (4 if over else 1)


def test_a_fresh_run_in_the_same_out_dir_replaces_the_old_metrics(tmp_path):
    """`make run` twice: outputs/rl/metrics.jsonl held both runs' steps (40 rows for 20 steps),
    and metrics.json's run means averaged the two runs."""
    from rcgrpo.training.grpo.run import write_summary

    run(tmp_path, steps=2, lr=1e-3)
    _, second = run(tmp_path, steps=3)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [deterministic(r) for r in rows] == [{"step": i + 1, **deterministic(m)}
                                                for i, m in enumerate(second)]  # fmt: skip
    mean = sum(m["reward/mean"] for m in second) / 3
    assert write_summary(tmp_path)["reward/mean_run_mean"] == pytest.approx(mean)


def test_rc_tokens_and_metrics(tmp_path):
    trainer, history = run(tmp_path, steps=2, token_sampling="stratified")
    tasks, tokens = trainer.draw(1)
    assert len(tasks) == 3 and len({t.id for t in tasks}) == 3 and len(tokens) == 12
    for g in range(3):  # stratified: both tokens in every group of 4
        assert {HIGH, LOW} <= set(tokens[4 * g : 4 * g + 4])
    m = history[0]
    for key in (
        "reward/mean",
        "reward/mean_high",
        "reward/mean_low",
        "rollout/zero_variance_frac",
        "rollout/within_group_std",
        "rollout/adv_std",
        "loss/kl",
        "loss/clip_frac",
        "loss/entropy",
        "loss/grad_norm",
        "perf/gen_tokens_per_s",
        "perf/step_s",
    ):
        assert key in m and m[key] == m[key], key  # present, not NaN
    assert m["rollout/logprob_gap"] < 1e-4  # the engine sampled from the weights we train
    assert trainer.engine.synced == 2


def test_grpo_has_no_tokens_and_sign_advantage_never_vanishes(tmp_path):
    trainer, history = run(tmp_path / "g", steps=1, conditioning="none")
    assert trainer.draw(1)[1] == [None] * 12
    assert history[0]["rollout/zero_adv_frac"] >= history[0]["rollout/zero_variance_frac"]
    _, history = run(tmp_path / "s", steps=1, conditioning="none", advantage="sign")
    assert history[0]["rollout/zero_adv_frac"] == 0.0  # 2R - 1 is never 0
    _, history = run(tmp_path / "m", steps=1, conditioning="none", advantage="max_norm")
    m = history[0]  # max-norm is 0 exactly on the zero-variance groups, like grpo
    assert m["rollout/zero_adv_frac"] == m["rollout/zero_variance_frac"]
    with pytest.raises(ValueError, match="group_size >= 2"):
        RLConfig(group_size=1)


@pytest.mark.parametrize("inner_epochs", [1, 2])
def test_mini_batches_are_ppo_updates_against_one_pi_old(tmp_path, monkeypatch, inner_epochs):
    import rcgrpo.training.grpo.update as trainer_mod

    trainer = make(tmp_path, mini_batch_size=6, micro_batch_size=3, inner_epochs=inner_epochs)
    forwards, losses = [], []  # (grad enabled, ids, attn) per policy forward; policy_loss args
    logprobs, real_loss = trainer._logprobs, trainer_mod.policy_loss

    def counting_logprobs(model, ids, attn, mask):
        if model is trainer.model:
            forwards.append((torch.is_grad_enabled(), ids, attn))
        return logprobs(model, ids, attn, mask)

    def recording_loss(logp, old, adv, mask, ref, **kw):
        losses.append((logp.detach(), old, mask))
        return real_loss(logp, old, adv, mask, ref, **kw)

    monkeypatch.setattr(trainer, "_logprobs", counting_logprobs)
    monkeypatch.setattr(trainer_mod, "policy_loss", recording_loss)
    initial = tiny_policy().model  # same seed: the pre-update weights of step 1
    m = trainer.train_step(1)

    # 12 rollouts, mini-batches of 6: 2 optimizer steps per pass, 2 micro-batches of 3 each
    assert m["loss/optimizer_steps"] == len(trainer.updates) == 2 * inner_epochs
    no_grad = [f for f in forwards if not f[0]]
    assert len(no_grad) == 4  # pi_old: 12 / 3 micro-batches, once per batch whatever the passes
    assert len(forwards) - len(no_grad) == 4 * inner_epochs == len(losses)
    first, second = trainer.updates[0], trainer.updates[1]
    assert first["ratio_mean"] == 1.0 and first["clip_frac"] == 0.0  # pi_old = these weights
    assert abs(second["ratio_mean"] - 1.0) > 1e-3  # after one update: off-policy (0.987 here)
    assert m["loss/ratio_mean_last"] == trainer.updates[-1]["ratio_mean"]
    assert m["loss/clip_frac_last"] == trainer.updates[-1]["clip_frac"]
    if inner_epochs == 2:  # the second pass is further off-policy: the clip acts (0.2 of tokens)
        assert trainer.updates[2]["clip_frac"] > 0
    mean = sum(u["ratio_mean"] for u in trainer.updates) / len(trainer.updates)
    assert m["loss/ratio_mean"] == pytest.approx(mean)

    grad_forwards = [f for f in forwards if f[0]]
    for (_, ids, attn), (_, old, mask) in zip(grad_forwards, losses, strict=True):
        with torch.no_grad():  # pi_old of every update = the pre-update policy's log-probs
            before = token_logprobs(
                initial(input_ids=ids, attention_mask=attn).logits[:, :-1], ids[:, 1:]
            )
        assert torch.allclose(old * mask, before * mask, atol=1e-6)
    # the second update's ratio_mean, by hand: token-weighted mean of exp(logp - old), masked
    (lp_a, old_a, mask_a), (lp_b, old_b, mask_b) = losses[2], losses[3]
    ratios = torch.cat(
        [((lp_a - old_a).exp() * mask_a).flatten(), ((lp_b - old_b).exp() * mask_b).flatten()]
    )
    assert second["ratio_mean"] == pytest.approx(
        float(ratios.sum() / (mask_a.sum() + mask_b.sum()))
    )


class ServedToyEngine(ToyEngine):
    """The toy engine with the sampled tokens' log-probs at temperature 1 (Engine.logprobs_temperature):
    what rl.behaviour_logprobs=engine reads."""

    logprobs_temperature = 1.0


@pytest.mark.parametrize("engine_is", ["token", "none"])
def test_engine_pi_old_of_every_mini_batch_is_the_policy_before_any_step(
    tmp_path, monkeypatch, engine_is
):
    """rl.behaviour_logprobs=engine, 12 rollouts in 4 mini-batches of 3 (4 optimizer steps in one
    pass). Every mini-batch's pi_old is the policy the engine sampled from: with rl.engine_is the
    trainer's own log-probs before the first step (mini-batches 2-4 used to take their own first
    forward, after 1-3 steps: ratio exactly 1, the clip never acting), without it the engine's.
    The engine gap (this engine samples from the very model: ~1e-7) is measured on pre-step
    log-probs only: the policy's drift over the first pass (~1e-2 here) is not in it."""
    import rcgrpo.training.grpo.update as update_mod

    policy = tiny_policy()
    cfg = RLConfig(out_dir=str(tmp_path), tasks_per_step=3, group_size=4, lr=5e-3, save_every=0,
                   mini_batch_size=3, micro_batch_size=3, behaviour_logprobs="engine",
                   engine_is=engine_is)  # fmt: skip
    trainer = Trainer(policy, ServedToyEngine(policy), TASKS, cfg)
    forwards, anchors = [], []  # (ids, attn) of each training forward; each loss's pi_old, mask
    logprobs, real_loss = trainer._logprobs, update_mod.policy_loss

    def recording_logprobs(model, ids, attn, mask):
        if torch.is_grad_enabled():
            forwards.append((ids, attn))
        return logprobs(model, ids, attn, mask)

    def recording_loss(logp, old, adv, mask, ref, **kw):
        anchors.append((old.detach().clone(), mask))
        return real_loss(logp, old, adv, mask, ref, **kw)

    monkeypatch.setattr(trainer, "_logprobs", recording_logprobs)
    monkeypatch.setattr(update_mod, "policy_loss", recording_loss)
    initial = tiny_policy().model  # same seed: the weights the engine sampled from
    m = trainer.train_step(1)

    assert [round(u["ratio_mean"], 4) == 1.0 for u in trainer.updates] == [True] + [False] * 3
    assert all(abs(u["ratio_mean"] - 1.0) > 1e-3 for u in trainer.updates[1:])  # off-policy
    for (ids, attn), (old, mask) in zip(forwards, anchors, strict=True):
        with torch.no_grad():
            before = token_logprobs(
                initial(input_ids=ids, attention_mask=attn).logits[:, :-1], ids[:, 1:]
            )
        assert torch.allclose(old * mask, before * mask, atol=1e-5)
    assert m["rollout/logprob_gap"] < 1e-5
    if engine_is == "token":  # pi_trainer / pi_engine over the batch, all before any step
        assert m["rollout/engine_is_max"] == pytest.approx(1.0, abs=1e-4)


def test_mini_batch_size_is_validated():
    with pytest.raises(ValueError, match="multiple of micro_batch_size"):
        RLConfig(tasks_per_step=3, group_size=4, mini_batch_size=6, micro_batch_size=4)
    with pytest.raises(ValueError, match="must divide the batch"):
        RLConfig(tasks_per_step=3, group_size=4, mini_batch_size=8, micro_batch_size=4)


def test_rctp_grpo_baseline_prompts_always_carry_the_high_goal(tmp_path):
    # rcgrpo.evaluation.variants "rctp+grpo": conditioning rc with P(high) = 1, never a goal-free prompt
    trainer, history = run(tmp_path, steps=1, p_high=1.0)
    for step in (1, 2, 3):
        assert set(trainer.draw(step)[1]) == {HIGH}
    assert "reward/mean_low" not in history[0] and "reward/token_gap" not in history[0]
    assert history[0]["reward/mean_high"] == history[0]["reward/mean"]


def test_checkpoint_restores_every_generator_with_weights_only(tmp_path):
    """RNG states are stored as tensors/lists: weights_only=True loads them and the draws after
    a load equal the draws after the save (python, numpy and torch generators)."""
    import random

    import numpy as np

    from rcgrpo.training import checkpoint

    trainer = make(tmp_path)
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    saved = checkpoint.save(tmp_path / "ck", trainer.model, trainer.optimizer, None, 7)
    draws = (random.random(), np.random.rand(), float(torch.rand(1)), np.random.randn())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    assert checkpoint.load(saved, trainer.model, trainer.optimizer)["step"] == 7
    assert (random.random(), np.random.rand(), float(torch.rand(1)), np.random.randn()) == draws


class _Payload:
    """What an attacker pickles: unpickling calls os.system (here: touch a marker file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_resume_refuses_a_crafted_checkpoint_without_running_it(tmp_path):
    from rcgrpo.training import checkpoint

    marker = tmp_path / "pwned"
    ck = checkpoint.path_for(tmp_path, 2)
    ck.mkdir(parents=True)
    torch.save({"step": 2, "model": {}, "rng": _Payload(marker)}, ck / "state.pt")
    trainer = make(tmp_path, steps=4)
    with pytest.raises(checkpoint.CheckpointError, match="written by run .unknown."):
        trainer.train(resume=True)  # not this run's: refused before it is read
    with pytest.raises(checkpoint.CheckpointError, match="state.pt holds more than tensors"):
        trainer.train(resume=str(ck))  # --resume-from names it: read, and refused
    assert not marker.exists()  # the os.system payload never ran
    assert str(ck / "state.pt") in str(pytest.raises(checkpoint.CheckpointError,
        checkpoint.load, ck, trainer.model).value)  # fmt: skip

"""The RC-GRPO trainer on a tiny random model with a toy engine: tokens, metrics, exact resume."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from toy_models import tiny_llama

from rcgrpo.grpo.trainer import RLConfig, Trainer
from rcgrpo.trajectories.record import HIGH, LOW

V, TARGET = 16, 7  # vocabulary; a rollout succeeds if it samples TARGET


def tiny_policy(seed=0):
    return SimpleNamespace(model=tiny_llama(V, seed), tokenizer=None)


class ToyEngine:
    """Samples 5 tokens after [task id, reward token] from the live policy, seeded per call."""

    def __init__(self, policy):
        self.policy, self.synced = policy, 0

    def sync(self, policy):
        self.synced += 1

    @torch.no_grad()
    def rollout(self, tasks, reward_tokens, protocol, seed):
        g = torch.Generator().manual_seed(seed)
        out = []
        for task, tok in zip(tasks, reward_tokens, strict=True):
            prompt = [1, 2 + task.number] + ({HIGH: [14], LOW: [15]}.get(tok, []))
            ids, logps = list(prompt), [0.0] * len(prompt)
            for _ in range(5):
                logits = self.policy.model(input_ids=torch.tensor([ids])).logits[0, -1]
                p = torch.softmax(logits, -1)
                nxt = int(torch.multinomial(p, 1, generator=g))
                ids.append(nxt)
                logps.append(float(p[nxt].log()))
            r = int(TARGET in ids[len(prompt) :])
            out.append(
                SimpleNamespace(
                    ids=ids,
                    loss_mask=[0] * len(prompt) + [1] * 5,
                    logprobs=logps,
                    calls=[],
                    trajectory=SimpleNamespace(paper_reward=r, bfcl_reward=r),
                    reward_token=tok,
                )
            )
        return out


TASKS = [SimpleNamespace(id=f"toy_{i}", number=i) for i in range(6)]


def run(tmp_path, steps=4, stop_after=None, resume=False, **over):
    policy = tiny_policy()
    cfg = RLConfig(
        steps=steps,
        tasks_per_step=3,
        group_size=4,
        lr=5e-3,
        save_every=2,
        micro_batch_size=5,
        out_dir=str(tmp_path),
        **over,
    )
    trainer = Trainer(policy, ToyEngine(policy), TASKS, cfg)
    return trainer, trainer.train(resume=resume, stop_after=stop_after)


def deterministic(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    _, full = run(tmp_path / "full")
    _, first = run(tmp_path / "cut", stop_after=3)  # checkpoint at 2, "killed" after step 3
    assert [deterministic(m) for m in first] == [deterministic(m) for m in full[:3]]
    trainer, rest = run(tmp_path / "cut", resume=True)
    assert trainer.step == 4 and len(rest) == 2  # resumed from step 2, not 0 nor 3
    assert [deterministic(m) for m in rest] == [deterministic(m) for m in full[2:]]
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4  # step 3's first try was dropped, not duplicated
    assert full[-1]["loss/grad_norm"] > 0


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
    with pytest.raises(ValueError, match="group_size >= 2"):
        RLConfig(group_size=1)

"""Rollout engines on the tiny profile: seeded reproducibility, batch independence, log-probs a
training forward pass reproduces, greedy = argmax, stopping; vLLM only where it is installed.

    .venv/bin/pytest tests/test_engines.py -q
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rcgrpo.bfcl.tasks import get_task, tasks_in
from rcgrpo.engines import RolloutConfig, make_engine
from rcgrpo.engines.hf import sample_next
from rcgrpo.models import ModelConfig, load_policy
from rcgrpo.trajectories.agent_loop import AgentLoop
from rcgrpo.trajectories.record import HIGH, LOW

CFG = RolloutConfig(max_new_tokens=24, max_total_tokens=1200, max_batch=8)


@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig(profile="tiny"))


@pytest.fixture(scope="module")
def tasks():
    return tasks_in("train")[::90][:6]  # a few tasks across the categories


@pytest.fixture(scope="module")
def rollouts(policy, tasks):
    engine = make_engine(CFG, policy)
    return engine.rollout(tasks, [HIGH, LOW] * 3, seed=7)


def test_seeded_rollouts_reproduce_and_seeds_matter(policy, tasks, rollouts):
    again = make_engine(CFG, policy).rollout(tasks, [HIGH, LOW] * 3, seed=7)
    assert [r.ids for r in again] == [r.ids for r in rollouts]
    assert [r.logprobs for r in again] == [r.logprobs for r in rollouts]
    other = make_engine(CFG, policy).rollout(tasks, [HIGH, LOW] * 3, seed=8)
    assert [r.ids for r in other] != [r.ids for r in rollouts]


def test_an_episode_does_not_depend_on_its_batch(policy, tasks, rollouts):
    """Episode 2 alone (batch of 1, no padding) samples the same ids as inside the batch."""
    alone = make_engine(CFG, policy)
    from rcgrpo.engines.base import episode_seed

    loop_ids = rollouts[2].ids[: rollouts[2].prompt_len]
    sample = alone.generate([loop_ids], [CFG.max_new_tokens], [episode_seed(7, 2, 0)])[0]
    first = [t for t, m in zip(rollouts[2].ids, rollouts[2].mask, strict=True) if m]
    assert sample.ids == first[: len(sample.ids)]


def test_logprobs_match_a_training_forward_pass(policy, rollouts):
    """What issue 5 recomputes (forward over ids, logits[t-1] -> ids[t]) equals the engine's."""
    for r in rollouts[:3]:
        ids = torch.tensor([r.ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0].float()  # (T, V)
        logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]  # (T-1,)
        mask = torch.tensor(r.mask[1:], dtype=torch.bool)
        engine_lp = torch.tensor(r.logprobs[1:])[mask]
        assert mask.any()
        torch.testing.assert_close(engine_lp, logp[mask], atol=2e-4, rtol=1e-4)


def test_sampled_tokens_are_the_only_masked_in_and_bounded(policy, rollouts):
    from rcgrpo.trajectories.prompts import Renderer

    renderer = Renderer(policy.tokenizer, policy.stop_id)
    for r in rollouts:
        # the sampled ids, decoded, are the conversation the chat template renders
        history = [{k: m[k] for k in ("role", "content")} for m in r.messages]
        tools = AgentLoop(get_task(r.task_id), renderer, "combined", None).tools
        assert renderer.decode(r.ids) == renderer.text(history, tools, False)
        assert r.n_sampled >= 1 and all(m == 0 for m in r.mask[: r.prompt_len])
        assert r.stop_reason in ("no_calls", "done", "step_limit", "token_budget")
        assert len(r.ids) <= CFG.max_total_tokens
        assert r.trajectory.reward_token == r.reward_token
        assert r.trajectory.provenance.seed == 7 and r.trajectory.split == "train"


def test_greedy_is_argmax_and_stops_at_max_new(policy, tasks):
    engine = make_engine(RolloutConfig(temperature=0.0, max_new_tokens=5), policy)
    prompt = engine.renderer.prompt([{"role": "user", "content": "ls"}], None)
    ids = list(prompt)
    (sample,) = engine.generate([prompt], [5], [0])
    for tok in sample.ids:  # teacher-forced argmax reproduces greedy decoding
        with torch.no_grad():
            nxt = policy.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()
        assert int(nxt) == tok
        ids.append(tok)
    assert len(sample.ids) <= 5


def test_top_p_keeps_the_nucleus():
    logits = torch.tensor([[5.0, 4.0, -3.0, -4.0]])
    gens = [torch.Generator().manual_seed(s) for s in range(1)]
    draws = {int(sample_next(logits, 1.0, 0.9, gens)[0]) for _ in range(200)}
    assert draws <= {0, 1} and 0 in draws
    assert {int(sample_next(logits, 1.0, 1e-6, gens)[0]) for _ in range(20)} == {0}


def test_config_rejects_unknown_engine():
    with pytest.raises(ValueError, match="rollout.engine"):
        RolloutConfig(engine="sglang")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_matches_hf_under_greedy(policy, tasks):
    greedy = RolloutConfig(temperature=0.0, max_new_tokens=16, max_total_tokens=1200)
    hf = make_engine(greedy, policy).rollout(tasks[:2], HIGH, seed=0)
    vl = make_engine(RolloutConfig(**{**greedy.__dict__, "engine": "vllm"}), policy)
    assert [r.calls for r in vl.rollout(tasks[:2], HIGH, seed=0)] == [r.calls for r in hf]


def test_bfcl_protocol_rolls_every_turn_through_the_engine(policy, tasks):
    from rcgrpo.trajectories.prompts import Renderer

    cfg = RolloutConfig(protocol="bfcl", max_new_tokens=12, max_total_tokens=1500)
    rollouts = make_engine(cfg, policy).rollout(tasks[:3], HIGH, seed=0)
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    for task, r in zip(tasks[:3], rollouts, strict=True):
        assert r.protocol == "bfcl" and r.trajectory.protocol == "bfcl"
        users = [m for m in r.messages if m["role"] == "user"]
        if r.stop_reason == "finished":  # the random policy answers in prose: one turn each
            assert len(r.calls) == len(task.turns) == len(users)
        history = [{k: m[k] for k in ("role", "content")} for m in r.messages]
        tools = AgentLoop(task, renderer, "bfcl", None).tools
        assert renderer.decode(r.ids) == renderer.text(history, tools, False)

"""Rollout engines on the tiny profile: seeded reproducibility, batch independence, log-probs a
training forward pass reproduces, greedy = argmax, stopping; the vLLM server engine against the HF engine (one server per module, built in its
own venv on first use: scripts/vllm_venv.sh).

    .venv/bin/pytest tests/test_engines.py -q
"""

from __future__ import annotations

import pytest
import torch

from rcgrpo.bfcl.tasks import get_task, tasks_in
from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.agent_loop import AgentLoop
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.execution import make_engine
from rcgrpo.rollout.hf import sample_next, uniforms

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
    from rcgrpo.rollout.scheduler import episode_seed

    loop_ids = rollouts[2].ids[: rollouts[2].prompt_len]
    sample = alone.generate([loop_ids], [CFG.max_new_tokens], [episode_seed(7, 2, 0)])[0]
    first = [t for t, m in zip(rollouts[2].ids, rollouts[2].mask, strict=True) if m]
    assert sample.ids == first[: len(sample.ids)]


def test_logprobs_match_a_training_forward_pass(policy, rollouts):
    """What the trainer recomputes (forward over ids, logits[t-1] -> ids[t]) equals the engine's."""
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
    from rcgrpo.chat.prompts import Renderer

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


def test_a_second_stop_token_ends_the_message_as_sampled(policy, tasks):
    """Llama 3.1 ends a tool call with <|eom_id|>, not its template's <|eot_id|>: any token of
    Policy.stop_ids ends a message in the engine, and the agent loop keeps it as the sampled
    end (mask 1) instead of sampling on past it and forcing the template's stop after."""
    import dataclasses

    greedy = RolloutConfig(temperature=0.0, max_new_tokens=12, max_total_tokens=1200)
    (plain,) = make_engine(greedy, policy).rollout(tasks[:1], HIGH, seed=0)
    first = plain.ids[plain.prompt_len :][:12]  # the first message's greedy ids
    assert plain.mask[plain.prompt_len :][:3] == [1, 1, 1]  # three sampled tokens at least
    eom = first[2]  # a token it samples mid-message stands in for <|eom_id|>
    assert eom != policy.stop_id
    both = dataclasses.replace(policy, also_stop=(eom,))
    assert both.stop_ids == (policy.stop_id, eom)
    (cut,) = make_engine(greedy, both).rollout(tasks[:1], HIGH, seed=0)
    n = first.index(eom) + 1  # the message ends at the first eom, which was sampled
    assert cut.ids[cut.prompt_len : cut.prompt_len + n] == first[:n]
    assert cut.mask[cut.prompt_len : cut.prompt_len + n] == [1] * n
    assert cut.ids[cut.prompt_len + n] != policy.stop_id  # no forced stop after it
    said = next(m["content"] for m in cut.messages if m["role"] == "assistant")
    assert said == policy.tokenizer.decode(first[: n - 1])  # the message ended there


def test_stop_tokens_of_a_llama_vocabulary():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    from rcgrpo.models.loading import stop_tokens

    vocab = {"<|begin_of_text|>": 0, "<|eot_id|>": 1, "<|eom_id|>": 2, "hi": 3}
    llama = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, "hi")))
    assert stop_tokens(llama) == (1, (2,))  # the template's end first, then <|eom_id|>
    tiny = load_policy(ModelConfig()).tokenizer  # ChatML: <|im_end|> alone
    assert stop_tokens(tiny) == (tiny.convert_tokens_to_ids("<|im_end|>"), ())


def test_top_p_keeps_the_nucleus():
    logits = torch.tensor([[5.0, 4.0, -3.0, -4.0]]).expand(200, -1)
    u = uniforms([0], 200)[0]  # one draw per row
    draws = set(sample_next(logits, 1.0, 0.9, u).tolist())
    assert draws == {0, 1}
    assert set(sample_next(logits, 1.0, 1e-6, u).tolist()) == {0}
    edges = torch.tensor([0.0, 1.0 - 2**-24])  # the ends of [0, 1) pick kept tokens only
    assert set(sample_next(logits[:2], 1.0, 0.9, edges).tolist()) <= {0, 1}


def test_inverse_cdf_sampling_follows_the_softmax():
    """One uniform per row through the inverse CDF draws from softmax(logits / temperature)."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0])
    n = 20000
    for temperature in (1.0, 0.7):
        tok = sample_next(logits.expand(n, -1), temperature, 1.0, uniforms([3], n)[0])
        freq = torch.bincount(tok, minlength=5).float() / n
        torch.testing.assert_close(
            freq, torch.softmax(logits / temperature, -1), atol=0.012, rtol=0
        )
    assert torch.equal(uniforms([5, 6], 4)[1], uniforms([6], 4)[0])  # a row's stream is its seed's


def test_rows_that_stop_early_leave_the_others_unchanged(policy, tasks):
    """Different max_new per row (rows cut from the cache mid-way) and different prompt lengths:
    every row equals the same prompt generated alone, ids and log-probs."""
    engine = make_engine(CFG, policy)
    loops = [AgentLoop(t, engine.renderer, "combined", None) for t in tasks]
    prompts = [loop.ids[: 300 + 37 * i] for i, loop in enumerate(loops)]
    prompts[3] = prompts[2]  # equal lengths share a prefill forward
    max_new, seeds = [1, 3, 20, 20, 5, 20], [11, 12, 13, 14, 15, 16]
    batch = engine.generate(prompts, max_new, seeds)
    for p, n, s, got in zip(prompts, max_new, seeds, batch, strict=True):
        (alone,) = engine.generate([p], [n], [s])
        assert got.ids == alone.ids and 1 <= len(got.ids) <= n
        torch.testing.assert_close(got.logprobs, alone.logprobs, atol=1e-4, rtol=1e-4)
    assert batch[2].ids != batch[3].ids  # same prompt and prefill, own seed


def test_config_rejects_unknown_engine():
    with pytest.raises(ValueError, match="RolloutConfig.engine=sglang: must be one of hf, vllm"):
        RolloutConfig(engine="sglang")


def test_bfcl_protocol_rolls_every_turn_through_the_engine(policy, tasks):
    from rcgrpo.chat.prompts import Renderer

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


def test_prefix_cache_changes_nothing_but_the_work(policy, tasks):
    """bfcl protocol (several messages per episode): reusing an episode's K/V across its
    messages samples the same ids, and its log-probs are a training forward pass's."""
    cfg = RolloutConfig(protocol="bfcl", max_new_tokens=16, max_total_tokens=1500, max_batch=8)
    engine = make_engine(cfg, policy)
    cached = engine.rollout(tasks, HIGH, seed=3)
    plain = make_engine(RolloutConfig(**{**cfg.__dict__, "prefix_cache": False}), policy)
    again = plain.rollout(tasks, HIGH, seed=3)
    assert engine.prefilled_tokens < plain.prefilled_tokens / 2  # the store was used
    assert [r.ids for r in cached] == [r.ids for r in again]
    assert max(sum(m["role"] == "assistant" for m in r.messages) for r in cached) >= 3
    for r, a in zip(cached, again, strict=True):
        torch.testing.assert_close(r.logprobs, a.logprobs, atol=1e-4, rtol=1e-4)
        ids = torch.tensor([r.ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0].float()  # (T, V)
        logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]  # (T-1,)
        mask = torch.tensor(r.mask[1:], dtype=torch.bool)
        torch.testing.assert_close(
            torch.tensor(r.logprobs[1:])[mask], logp[mask], atol=2e-4, rtol=1e-4
        )


def test_torch_threads_are_set_deliberately_and_restored(monkeypatch):
    from rcgrpo.runtime import DEFAULT_TORCH_THREADS, torch_thread_count, torch_threads

    monkeypatch.delenv("RCGRPO_TORCH_THREADS", raising=False)
    assert torch_thread_count() == DEFAULT_TORCH_THREADS and torch_thread_count(3) == 3
    monkeypatch.setenv("RCGRPO_TORCH_THREADS", "2")
    assert torch_thread_count() == 2 and torch_thread_count(1) == 1  # explicit wins
    before = torch.get_num_threads()
    with torch_threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    monkeypatch.setenv("RCGRPO_TORCH_THREADS", "two")
    with pytest.raises(ValueError, match="RCGRPO_TORCH_THREADS"):
        torch_thread_count()


def test_prefix_store_gives_the_longest_proper_prefix_once():
    from rcgrpo.rollout.hf import PrefixStore

    store = PrefixStore()
    store.put([1, 2], ["a"])
    store.put([1, 2, 3], ["b"])
    store.put([7, 2, 3], ["c"])
    assert store.take([1, 2, 3]) == (2, ["a"])  # proper prefix only: [1, 2, 3] itself is not
    assert store.take([1, 2, 3, 4]) == (3, ["b"])
    assert store.take([1, 2, 3, 4]) is None  # each entry serves one continuation
    assert store.take([7, 2, 3, 9]) == (3, ["c"]) and not any(store.by_len.values())


# -- the vLLM server engine (rollout.engine=vllm), one server for the whole module ---------------
VLLM_CFG = RolloutConfig(temperature=0.0, max_new_tokens=16, max_total_tokens=1200, max_batch=8)


@pytest.fixture(scope="module")
def lora_policy():
    """The tiny model with LoRA (fresh: B = 0, so it is the base model until trained)."""
    return load_policy(ModelConfig(profile="tiny", lora=True, lora_r=8))


@pytest.fixture(scope="module")
def vllm_engine(lora_policy):
    from rcgrpo.rollout.vllm_lifecycle import group_alive

    cfg = RolloutConfig(**{**VLLM_CFG.__dict__, "engine": "vllm", "vllm_max_lora_rank": 8})
    engine = make_engine(cfg, lora_policy)
    yield engine
    groups = (engine.server.proc.pid, engine.server.server_pid())  # its guard, the server
    engine.close()
    assert all(group_alive(g) == [] for g in groups)  # both process groups gone: no orphans


def _greedy_hf(policy, tasks):
    return make_engine(VLLM_CFG, policy).rollout(tasks, [HIGH, LOW] * 2, seed=0)


def test_vllm_greedy_ids_and_calls_equal_hf(lora_policy, vllm_engine, tasks):
    hf = _greedy_hf(lora_policy, tasks[:4])
    vl = vllm_engine.rollout(tasks[:4], [HIGH, LOW] * 2, seed=0)
    assert [r.ids for r in vl] == [r.ids for r in hf]
    assert [r.calls for r in vl] == [r.calls for r in hf]
    assert [r.mask for r in vl] == [r.mask for r in hf] and sum(r.n_sampled for r in vl) > 20


def test_vllm_sampled_logprobs_are_the_trainers(lora_policy, vllm_engine, tasks):
    """Sampling at T = 1 with seeds: the ids come back token-exact, reproducible per seed, and
    their log-probs equal a training forward pass over those ids within 1e-4."""
    from dataclasses import replace

    vllm_engine.cfg = replace(vllm_engine.cfg, temperature=1.0)
    try:
        first = vllm_engine.rollout(tasks[:3], HIGH, seed=5)
        again = vllm_engine.rollout(tasks[:3], HIGH, seed=5)
    finally:
        vllm_engine.cfg = replace(vllm_engine.cfg, temperature=0.0)
    assert [r.ids for r in first] == [r.ids for r in again]
    for r in first:
        ids = torch.tensor([r.ids])
        with torch.no_grad():
            logits = lora_policy.model(input_ids=ids).logits[0].float()  # (T, V)
        logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]  # (T-1,)
        mask = torch.tensor(r.mask[1:], dtype=torch.bool)
        assert mask.sum() >= 5
        torch.testing.assert_close(
            torch.tensor(r.logprobs[1:])[mask], logp[mask], atol=1e-4, rtol=0
        )


def test_vllm_adapter_update_changes_the_served_policy(lora_policy, vllm_engine, tasks):
    """A LoRA step (B moved) synced as a runtime adapter: the server's greedy outputs change and
    equal the HF engine's on the updated weights; the reward rows were frozen, no restart."""
    before = vllm_engine.rollout(tasks[:4], [HIGH, LOW] * 2, seed=0)
    pid, version = vllm_engine.server.proc.pid, vllm_engine.version
    assert not any(
        p.requires_grad for n, p in lora_policy.model.named_parameters() if "trainable_tokens" in n
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in lora_policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    vllm_engine.sync(lora_policy)
    after = vllm_engine.rollout(tasks[:4], [HIGH, LOW] * 2, seed=0)
    assert vllm_engine.server.proc.pid == pid and vllm_engine.version == version + 1
    assert vllm_engine.model_name.startswith(f"policy-v{version + 1}-")  # + its content hash
    assert [r.ids for r in after] != [r.ids for r in before]
    assert [r.ids for r in after] == [r.ids for r in _greedy_hf(lora_policy, tasks[:4])]


def test_vllm_reward_rows_stay_frozen_through_the_trainer_and_a_real_step(
    lora_policy, vllm_engine, tasks, tmp_path
):
    """The Trainer's reference adapter (peft set_adapter marks the active adapter trainable)
    used to re-enable the reward-token rows frozen for vLLM: they trained, and every sync
    re-exported the base and restarted the server. Through the real order (engine, Trainer,
    a step with non-zero advantages, sync): rows frozen and unchanged, the adapters trained,
    no restart, no warning."""
    import warnings
    from dataclasses import replace

    from rcgrpo.models.export import reward_rows
    from rcgrpo.rollout.environment import Rewards
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    def parity(task, rollout):  # a reward with variance: the random tiny model solves nothing
        r = sum(t for t, m in zip(rollout.ids, rollout.mask, strict=True) if m) % 2
        return Rewards(float(r), {"paper": r, "bfcl": r})

    rows = {n: p for n, p in lora_policy.model.named_parameters() if "trainable_tokens" in n}
    cfg = RLConfig(tasks_per_step=3, group_size=4, steps=1, lr=5e-2, kl_coef=0.1,
                   save_every=0, out_dir=str(tmp_path), protocol="bfcl")  # fmt: skip
    trainer = Trainer(lora_policy, vllm_engine, tasks, cfg, score_fn=parity)
    assert trainer.ref_adapter is not None  # the reference adapter was added ...
    assert not any(p.requires_grad for p in rows.values())  # ... and the freeze held
    assert not any(p is q for p in rows.values() for q in trainer.params)
    before = reward_rows(lora_policy)
    lora = {n: p.detach().clone() for n, p in lora_policy.model.named_parameters()
            if "lora_B.default" in n}  # fmt: skip
    pid, version = vllm_engine.server.proc.pid, vllm_engine.version
    vllm_engine.cfg = replace(vllm_engine.cfg, temperature=1.0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the "reward-token rows moved" warning fails here
            m = trainer.train_step(1)  # roll out, update, engine.sync
    finally:
        vllm_engine.cfg = replace(vllm_engine.cfg, temperature=0.0)
    assert m["rollout/zero_adv_frac"] < 1 and m["loss/grad_norm"] > 0  # a real update
    assert torch.equal(reward_rows(lora_policy), before)
    assert any(not torch.equal(p, lora[n]) for n, p in lora_policy.model.named_parameters()
               if n in lora)  # fmt: skip
    assert vllm_engine.server.proc.pid == pid and vllm_engine.version == version + 1


def test_vllm_serves_the_behaviour_logprobs_of_a_real_step(
    lora_policy, vllm_engine, tasks, tmp_path
):
    """rl.behaviour_logprobs=engine with the token weight through the vLLM server: its sampled
    tokens' log-probs (`logprobs: 0`, raw, temperature 1) are pi_old, no pi_old forward runs,
    and the weights pi_trainer / pi_engine stay at 1 (fp32 on both sides here)."""
    from dataclasses import replace

    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    cfg = RLConfig(tasks_per_step=2, group_size=2, steps=1, lr=1e-3, save_every=0,
                   out_dir=str(tmp_path), protocol="bfcl", advantage="sign",
                   behaviour_logprobs="engine", engine_is="token")  # fmt: skip
    trainer = Trainer(lora_policy, vllm_engine, tasks, cfg)
    vllm_engine.cfg = replace(vllm_engine.cfg, temperature=1.0)
    try:
        m = trainer.train_step(1)
    finally:
        vllm_engine.cfg = replace(vllm_engine.cfg, temperature=0.0)
    assert m["loss/grad_norm"] > 0 and m["rollout/logprob_gap"] < 1e-4
    assert m["rollout/engine_is_max"] == pytest.approx(1.0, abs=1e-3)
    assert m["rollout/engine_is_clipped"] == 0.0


@pytest.mark.slow
def test_vllm_full_finetune_syncs_by_restart(policy, tasks):
    """The tiny profile's default (full fine-tune): sync re-exports and restarts the server; its
    outputs change and equal the HF engine's on the new weights."""
    import copy

    full = copy.deepcopy(policy)
    engine = make_engine(RolloutConfig(**{**VLLM_CFG.__dict__, "engine": "vllm"}), full)
    try:
        before = engine.rollout(tasks[:2], HIGH, seed=0)
        assert [r.ids for r in before] == [
            r.ids for r in make_engine(VLLM_CFG, full).rollout(tasks[:2], HIGH, seed=0)
        ]
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in full.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        engine.sync(full)
        after = engine.rollout(tasks[:2], HIGH, seed=0)
        assert [r.ids for r in after] != [r.ids for r in before]
        hf = make_engine(VLLM_CFG, full).rollout(tasks[:2], HIGH, seed=0)
        assert [r.ids for r in after] == [r.ids for r in hf]
    finally:
        engine.close()


def test_episodes_carry_their_measured_clock(policy, tasks):
    """Each episode of a real batched HF rollout records when each message was asked for and
    sampled (rcgrpo.rollout.clock): one entry per assistant message, in order, inside the
    episode's own window, inside the engine call's wall time."""
    import time

    cfg = RolloutConfig(protocol="bfcl", max_new_tokens=12, max_total_tokens=1500)
    started = time.time_ns()
    rollouts = make_engine(cfg, policy).rollout(tasks[:3], HIGH, seed=0)
    ended = time.time_ns()
    for r in rollouts:
        t = r.timing
        entries = t["messages"]
        assert len(entries) == sum(m["role"] == "assistant" for m in r.messages) >= 1
        assert started <= t["start"] <= entries[0][0] and entries[-1][1] <= t["end"] <= ended
        for asked, sampled, tools_start, tools_end, seconds in entries:
            assert asked < sampled <= tools_start <= tools_end
            assert all(s is None or s >= 0 for s in seconds)
        starts = [e[0] for e in entries]
        assert starts == sorted(starts)

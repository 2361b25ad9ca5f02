"""The token-exact agent loop, driven with scripted model messages (the ground truth, prose,
broken calls) so every branch is reached: masks, observations, protocols, stops, SFT rendering.

    .venv/bin/pytest tests/test_agent_loop.py -q
"""

from __future__ import annotations

import pytest
from bfcl_loops import bfcl_loop, finished

from rcgrpo.bfcl.executor import parse_calls
from rcgrpo.bfcl.tasks import REVEAL_MESSAGE, get_task
from rcgrpo.chat.prompts import NEW_FUNCTIONS_HEADER, Renderer, format_calls
from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.agent_loop import Limits, results
from rcgrpo.rollout.sft_render import render_example


@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig(profile="tiny"))


@pytest.fixture(scope="module")
def renderer(policy):
    return Renderer(policy.tokenizer, policy.stop_id)


def say(loop, text: str, stop: bool = True) -> list[int]:
    """Feed one scripted model message as if sampled; returns the ids fed."""
    ids = loop.renderer.encode(text) + ([loop.renderer.stop_id] if stop else [])
    loop.feed(ids, [-1.0] * len(ids))
    return ids


def expert(loop, task, protocol: str) -> list[list[int]]:
    """Play the ground truth: one message per turn with all its calls, then end the turn."""
    fed = []
    for turn in task.ground_truth:
        if turn:
            fed.append(say(loop, format_calls(turn)))
        if protocol == "bfcl":
            fed.append(say(loop, "Done with this request."))
    if protocol == "combined":
        fed.append(say(loop, "[done()]"))
    return fed


def check_layout(loop, fed: list[list[int]]) -> None:
    """mask == 1 exactly on the fed ids, and decode(ids) == the template's rendering."""
    r = finished(loop)
    assert len(r.ids) == len(r.mask) == len(r.logprobs)
    sampled = [t for t, m in zip(r.ids, r.mask, strict=True) if m]
    assert sampled == [t for ids in fed for t in ids]
    assert all(lp == 0.0 for lp, m in zip(r.logprobs, r.mask, strict=True) if not m)
    assert all(m == 0 for m in r.mask[: r.prompt_len])
    history = [{k: m[k] for k in ("role", "content")} for m in r.messages]
    assert loop.renderer.decode(r.ids) == loop.renderer.text(history, loop.tools, False)
    # every tool observation and user message lies entirely in mask-0 tokens
    masked_text = loop.renderer.decode([t for t, m in zip(r.ids, r.mask, strict=True) if not m])
    for message in r.messages:
        if message["role"] in ("tool", "user", "system"):
            assert message["content"] in masked_text


@pytest.mark.parametrize("protocol", ["combined", "bfcl"])
def test_expert_episode_scores_and_masks(renderer, protocol):
    task = get_task("multi_turn_base_0")
    loop = bfcl_loop(task, renderer, protocol, HIGH, Limits(max_total_tokens=8192))
    fed = expert(loop, task, protocol)
    r = finished(loop)
    assert r.stop_reason == ("done" if protocol == "combined" else "finished")
    assert r.trajectory.reward == 1 and r.trajectory.checks["bfcl"] == 1
    gt = [[str(c) for c in parse_calls(format_calls(t)).calls] for t in task.ground_truth]
    if protocol == "combined":  # one turn, one step per ground-truth turn
        assert r.calls == [[t for t in gt if t]]
    else:
        assert r.calls == [[t] if t else [] for t in gt]
    assert [m["role"] for m in r.messages].count("tool") >= 3  # observations were appended
    check_layout(loop, fed)


@pytest.mark.parametrize("protocol", ["combined", "bfcl"])
def test_a_batch_of_loops_is_scored_as_each_loop_alone(renderer, protocol):
    """`results` (what Engine.rollout calls: the environment's scorer on the whole batch, BFCL's
    in one request to its worker) gives every rollout the rewards and reasons it gets alone."""
    loops = []
    for name in ("multi_turn_base_0", "multi_turn_base_15") * 2:
        task = get_task(name)
        loop = bfcl_loop(task, renderer, protocol, HIGH, Limits(max_total_tokens=8192))
        if len(loops) % 3:
            expert(loop, task, protocol)  # passes
        else:
            say(loop, "[ls(a=1)]")  # a wrong call, then the turn / episode ends
            while loop.pending() is not None:
                say(loop, "I cannot help.")
        loops.append(loop)
    batched = [r.trajectory for r in results(loops, BFCL.scorer(protocol))]
    alone = [finished(loop).trajectory for loop in loops]
    assert [(t.reward, t.checks, t.reward_reason) for t in batched] == [
        (t.reward, t.checks, t.reward_reason) for t in alone
    ]
    assert {t.reward for t in alone} == {0, 1}


def test_reward_token_single_id_in_prompt_and_masked(policy, renderer):
    task = get_task("multi_turn_base_1")
    for token in (HIGH, LOW):
        loop = bfcl_loop(task, renderer, "combined", token)
        tid = policy.reward_token_ids[token]
        positions = [i for i, t in enumerate(loop.ids) if t == tid]
        assert len(positions) == 1 and positions[0] < loop.prompt_len
        assert renderer.decode(loop.ids).count(f"[Reward Goal: {token}]") == 1
        # appended to the first user message, not the system prompt
        assert loop.messages[1]["content"].endswith(f"[Reward Goal: {token}]")
    plain = bfcl_loop(task, renderer, "combined", None)
    assert not set(policy.reward_token_ids.values()) & set(plain.ids)


def test_no_parsable_call_ends_the_turn_cleanly(renderer):
    task = get_task("multi_turn_base_0")  # 4 turns
    loop = bfcl_loop(task, renderer, "bfcl", None)
    fed = [say(loop, "[cd(folder=)")]  # broken call: the turn ends, no observation
    assert loop.episode.tools.turn == 1 and loop.calls == [[], []]
    assert loop.messages[-1]["role"] == "user"
    fed.append(say(loop, "I would rather not."))
    fed.append(say(loop, "Nothing to do."))
    fed.append(say(loop, "Still nothing."))
    r = finished(loop)
    assert r.stop_reason == "finished" and r.calls == [[], [], [], []]
    assert r.trajectory.checks["bfcl"] == 0 and r.trajectory.reward == 0
    assert "tool" not in [m["role"] for m in r.messages]
    check_layout(loop, fed)
    # combined: prose ends the whole episode
    combined = bfcl_loop(task, renderer, "combined", None)
    say(combined, "Sure, I will help.")
    assert finished(combined).stop_reason == "no_calls" and combined.pending() is None


def test_miss_func_reveals_functions_in_the_reveal_turn(renderer):
    task = get_task("multi_turn_miss_func_0")
    (turn, names), *_ = task.missed_functions.items()
    loop = bfcl_loop(task, renderer, "bfcl", None, Limits(max_total_tokens=8192))
    first_prompt = renderer.decode(loop.ids)
    assert not any(f"\n{n}(" in first_prompt for n in names)  # hidden at first
    fed = []
    for t in range(turn):
        calls = task.ground_truth[t]
        if calls:
            fed.append(say(loop, format_calls(calls)))
        fed.append(say(loop, "Done."))
    reveal = loop.messages[-1]
    assert reveal["role"] == "user" and reveal["content"].startswith(REVEAL_MESSAGE)
    assert NEW_FUNCTIONS_HEADER in reveal["content"]
    assert all(f"\n{n}(" in "\n" + reveal["content"].split(NEW_FUNCTIONS_HEADER)[1] for n in names)
    for t in range(turn, len(task.ground_truth)):
        if task.ground_truth[t]:
            fed.append(say(loop, format_calls(task.ground_truth[t])))
        fed.append(say(loop, "Done."))
    assert finished(loop).trajectory.checks["bfcl"] == 1
    check_layout(loop, fed)


def test_step_limit_and_token_budget_stop_the_episode(renderer):
    task = get_task("multi_turn_base_0")
    loop = bfcl_loop(task, renderer, "bfcl", None, Limits(max_steps=2))
    say(loop, "[pwd()]")
    say(loop, "[ls()]")
    r = finished(loop)
    assert r.stop_reason == "step_limit" and r.calls == [[["pwd()"], ["ls()"]]]
    assert r.trajectory.checks["bfcl"] == 0  # BFCL force-quits the entry

    tight = bfcl_loop(task, renderer, "combined", None, Limits(max_total_tokens=720))
    assert tight.max_new() <= 720 - len(tight.ids)
    while tight.pending() is not None:
        say(tight, "[ls(a=True)]")
    assert finished(tight).stop_reason == "token_budget"
    assert len(finished(tight).ids) <= 720
    no_room = bfcl_loop(task, renderer, "combined", None, Limits(max_total_tokens=100))
    assert no_room.pending() is None and finished(no_room).stop_reason == "token_budget"
    assert sum(finished(no_room).mask) == 0


def test_cut_message_gets_a_forced_unmasked_stop(renderer):
    loop = bfcl_loop(get_task("multi_turn_base_0"), renderer, "combined", None)
    fed = say(loop, "Let me think about", stop=False)  # hit max_new without a stop token
    r = finished(loop)
    assert r.ids[-len(fed) - 2 : -2] == fed and r.ids[-2] == renderer.stop_id
    assert r.mask[-2] == 0  # the stop was not sampled: no loss on it


@pytest.mark.parametrize("protocol", ["combined", "bfcl"])
def test_render_example_matches_rollout_layout(policy, renderer, protocol):
    """SFT on a recorded trajectory sees exactly the ids a rollout of the same text has."""
    task = get_task("multi_turn_miss_func_3")
    loop = bfcl_loop(task, renderer, protocol, LOW, Limits(max_total_tokens=16384))
    fed = []
    for turn in task.ground_truth:
        if turn:
            fed.append(say(loop, format_calls(turn)))
        if protocol == "bfcl" and loop.pending() is not None:
            fed.append(say(loop, "Finished."))
    if loop.pending() is not None:
        fed.append(say(loop, "[done()]"))
    r = finished(loop)
    example = render_example(r.trajectory, policy, BFCL)
    assert example.ids == r.ids and example.mask == r.mask
    # a record without the system prompt (an older layout) renders the same
    trimmed = r.trajectory.messages[1:]
    record = type(r.trajectory)(**{**r.trajectory.__dict__, "messages": trimmed})
    assert render_example(record, policy, BFCL).ids == r.ids

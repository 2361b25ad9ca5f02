"""A tool answer of any size costs the parent little: the worker cuts each observation to
env.max_observation_chars, and the agent loop never tokenizes what the episode's token budget
cannot hold.

The family: a directory `cp` in BFCL's file system shares children, so 4 cheap calls a level
double the paths below a folder; 18 levels (73 calls), then `find(path='A18')`, answer ~50 MB in
well under a second. Before the cap, the parent spent 197 s and 16.9 GB rendering and
tokenizing that one observation.

    .venv/bin/pytest tests/test_observation_budget.py -q
"""

from __future__ import annotations

import resource
import time

import pytest
from bfcl_loops import bfcl_loop
from test_reward_hacking import Scripted

from rcgrpo.bfcl import observations
from rcgrpo.bfcl.environment import LocalEpisode
from rcgrpo.bfcl.executor import parse_calls
from rcgrpo.bfcl.tasks import get_task
from rcgrpo.chat.prompts import Renderer
from rcgrpo.chat.record import HIGH
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.config import RolloutConfig

LEVELS = 18


def doubling(levels: int) -> list[str]:
    """One message per level: A{i+1} holds two folders that share A{i}'s children."""
    out = ["mkdir(dir_name='A0')"]
    for i in range(levels):
        out.append(
            f"[cp(source='A{i}', destination='B{i}'), mkdir(dir_name='A{i + 1}'), "
            f"cp(source='A{i}', destination='A{i + 1}'), cp(source='B{i}', destination='A{i + 1}')]"
        )
    return out


@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig(profile="tiny"))


def test_the_uncut_answer_really_is_huge():
    """The family does what it says, in this process with the cap lifted (x2 a level: 18 levels
    answer ~50 MB)."""
    episode = LocalEpisode(get_task("multi_turn_base_1"), hide_missed=False)
    episode.begin_turn(0)
    for text in doubling(12):
        episode.step(parse_calls(text).calls)
    observations.set_max_chars(10**9)
    try:
        (found,) = episode.step(parse_calls("find(path='A12')").calls).observations
    finally:
        observations.set_max_chars(observations.DEFAULT_MAX_CHARS)
    assert len(found) > 10 * observations.DEFAULT_MAX_CHARS  # 8,190 paths at 12 levels: 344 kB


def test_cp_find_family_is_cut_in_the_worker_in_seconds_and_little_memory(policy):
    script = [*doubling(LEVELS), f"find(path='A{LEVELS}')", "All done."]
    cfg = RolloutConfig(protocol="bfcl", max_new_tokens=160, max_total_tokens=60_000,
                        max_steps=len(script) + 2)  # fmt: skip
    engine = Scripted(cfg, policy, script)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB
    start = time.monotonic()
    (rollout,) = engine.rollout([get_task("multi_turn_base_1")], HIGH, seed=0)
    took = time.monotonic() - start
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 2**20  # GB
    print(f"cp+find: {took:.1f} s, parent peak memory +{grew:.2f} GB")
    tools = [m["content"] for m in rollout.messages if m["role"] == "tool"]
    found = tools[-1]
    cap = observations.DEFAULT_MAX_CHARS
    assert found.startswith('{"matches": [') and found.endswith(" chars]")
    left = int(found.rsplit("[truncated ", 1)[1].split()[0])
    assert left > 10 * cap and len(found) <= cap + 40  # cut: what was left out is named
    assert all(len(t) <= cap + 40 for t in tools)
    assert rollout.stop_reason == "finished" and grew < 1.0 and took < 120


def test_what_the_budget_cannot_hold_is_never_tokenized(policy, monkeypatch):
    """An observation the remaining budget cannot hold ends the episode on token_budget without
    being rendered (the budget's room x the longest token's characters is below its size)."""
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    seen = []
    real = Renderer.continuation
    monkeypatch.setattr(
        Renderer, "continuation", lambda self, h, p, *a: seen.append(p) or real(self, h, p, *a)
    )
    loop = bfcl_loop(get_task("multi_turn_base_1"), renderer, protocol="bfcl")
    loop.limits = type(loop.limits)(160, 8000, 30)
    for text in doubling(10):  # 2,046 paths: find answers ~70k characters, cut to the cap
        ids = renderer.encode(text) + [renderer.stop_id]
        loop.feed(ids, [0.0] * len(ids))
    assert loop.pending() is not None
    room = 1000  # tokens left: 1000 x the longest token's characters < the cut observation
    loop.limits = type(loop.limits)(160, len(loop.ids) + 160 + room, 30)
    assert room * renderer.longest_token < observations.DEFAULT_MAX_CHARS
    seen.clear()
    ids = renderer.encode("find(path='A10')") + [renderer.stop_id]
    loop.feed(ids, [0.0] * len(ids))
    assert loop.stop_reason == "token_budget"
    assert not any("matches" in m["content"] for p in seen for m in p), "it was tokenized"


def test_a_long_decimal_from_square_root_is_cut_in_the_sandbox_worker():
    """MathAPI's square_root answers a Decimal of `precision` digits: 200,000 digits come back
    from the sandboxed worker as one capped observation, the marker naming what was left out."""
    from rcgrpo.bfcl.environment import Episode
    from rcgrpo.bfcl.sandbox import Sandbox
    from rcgrpo.envs.config import EnvConfig

    sandbox = Sandbox(EnvConfig())
    try:
        episode = Episode(get_task("multi_turn_base_15"), sandbox=sandbox)
        episode.begin_turn()
        (answer,) = episode.step("square_root(number=2, precision=200000)").observations
    finally:
        sandbox.close()
    cap = observations.DEFAULT_MAX_CHARS
    assert cap < len(answer) < cap + 40 and answer.endswith(" chars]")
    assert "[truncated " in answer and "1.41421356" in answer

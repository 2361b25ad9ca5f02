"""Time budgets per model message and per episode (env.message_timeout_s, env.episode_timeout_s):
calls left when a budget runs out are answered "not run: time budget" and never run, the call
running at that moment is stopped, and nothing of it reaches the state or the reward.

Driven through the real AgentLoop and a real sandbox worker: one message of 20 calls of
`power(base=3, exponent=12000000)` (~2.6 s each on this machine; 103 s run and replayed before
the budgets) and an episode whose tool time is spent.

    .venv/bin/pytest tests/test_time_budget.py -q
"""

from __future__ import annotations

import time

import pytest
from bfcl_loops import bfcl_loop

from rcgrpo.bfcl.progress import OUT_OF_TIME
from rcgrpo.bfcl.sandbox import Sandbox
from rcgrpo.bfcl.tasks import get_task
from rcgrpo.chat.prompts import Renderer
from rcgrpo.envs.config import EnvConfig
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig

POWER = "power(base=3, exponent=12000000)"
STOPPED = "Error during execution: timed out: time budget"


@pytest.fixture(scope="module")
def renderer():
    policy = load_policy(ModelConfig(profile="tiny"))
    return Renderer(policy.tokenizer, policy.stop_id)


def say(loop, renderer, text):
    ids = renderer.encode(text) + [renderer.stop_id]
    loop.feed(ids, [0.0] * len(ids))


def tools(loop) -> list[str]:
    return [m["content"] for m in loop.messages + loop.pending_messages if m["role"] == "tool"]


def test_a_message_of_20_slow_calls_ends_within_its_budget(renderer):
    sandbox = Sandbox(EnvConfig(tool_timeout_s=10.0, message_timeout_s=1.0))
    try:
        loop = bfcl_loop(get_task("multi_turn_base_15"), renderer, sandbox=sandbox)
        start = time.monotonic()
        say(loop, renderer, "[" + ", ".join([POWER] * 20) + "]")
        took = time.monotonic() - start
        print(f"20 x power under a 1 s message budget: {took:.1f} s")
        assert tools(loop) == [STOPPED] + [OUT_OF_TIME] * 19
        assert loop.calls == [[]]  # nothing ran to its end: nothing is scored
        # the tool time it cost, in the worker's own time (a busy box stretches the wall time):
        # the 1 s budget and the stopped call, not 20 x 2.6 s
        assert loop.episode.tools.tool_seconds < 6.0
    finally:
        sandbox.close()


def test_an_episode_whose_tool_time_is_spent_runs_nothing_more(renderer):
    sandbox = Sandbox(EnvConfig(tool_timeout_s=10.0, episode_timeout_s=1.0))
    try:
        loop = bfcl_loop(get_task("multi_turn_base_15"), renderer, sandbox=sandbox)
        say(loop, renderer, POWER)  # stopped when the episode's 1 s is spent
        say(loop, renderer, "absolute_value(number=-2)")  # a fast call, but no time is left
        assert tools(loop) == [STOPPED, OUT_OF_TIME]
        assert loop.calls == [[]] and loop.pending() is not None  # the episode goes on
    finally:
        sandbox.close()

"""The reward counts what ran, and no model message can break a rollout.

Driven through the real `AgentLoop` (tiny model's tokenizer, scripted messages) and the live
sandboxed `Episode`: calls whose stored string would mean another call, non-finite numbers,
unhashable literals and surrogates are error observations that never run, every accepted call's
string reads back as the same call, and the scoring replay agrees with the live episode.

    .venv/bin/pytest tests/test_reward_hacking.py -q
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from bfcl_loops import bfcl_loop, finished

from rcgrpo.bfcl.checkers import score
from rcgrpo.bfcl.environment import Episode
from rcgrpo.bfcl.executor import parse_calls
from rcgrpo.bfcl.live_replay import hostile_family, hostile_texts, live_vs_replay
from rcgrpo.bfcl.sandbox import Sandbox
from rcgrpo.bfcl.tasks import get_task, load_tasks
from rcgrpo.chat.prompts import Renderer
from rcgrpo.chat.record import HIGH
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.envs.config import EnvConfig
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.engine import Engine, Sample


@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig(profile="tiny"))


@pytest.fixture(scope="module")
def renderer(policy):
    return Renderer(policy.tokenizer, policy.stop_id)


def play(renderer, task, messages: list[list[str]]):
    """Feed one list of model messages per turn (bfcl protocol), each turn closed by prose."""
    loop = bfcl_loop(task, renderer, protocol="bfcl")
    for turn in messages:
        for text in [*turn, "Done."]:
            if loop.pending() is None:
                break
            ids = renderer.encode(text) + [renderer.stop_id]
            loop.feed(ids, [-1.0] * len(ids))
    while loop.pending() is not None:  # later turns: prose
        ids = renderer.encode("Done.") + [renderer.stop_id]
        loop.feed(ids, [-1.0] * len(ids))
    return finished(loop)


def test_calls_whose_keys_spell_the_real_call_never_run_and_score_zero(renderer):
    """Each ground-truth call sent as JSON whose one key spells its arguments: every live call
    is an error, so neither reward may pass (the stored string used to re-parse as the real
    call, and both checkers paid 1)."""
    task = get_task("multi_turn_base_0")
    messages = [[hostile_texts(call)[0] for call in turn] for turn in task.ground_truth]
    assert "source='final_report.pdf', destination='temp') #" in " ".join(sum(messages, []))
    rollout = play(renderer, task, messages)
    assert rollout.trajectory.reward == 0 and rollout.trajectory.checks["bfcl"] == 0
    assert rollout.calls == [[] for _ in task.ground_truth]  # nothing ran, nothing is scored
    assert all("tool_calls" not in m for m in rollout.messages)


def test_nan_amount_is_refused_before_it_reaches_the_balance():
    """`fund_account(amount=NaN)` used to set the live balance to NaN while its stored string
    `nan` did not re-parse, so the scorer skipped it."""
    task = next(t for t in load_tasks().values() if "TradingBot" in t.involved_classes)
    episode = Episode(task)
    episode.begin_turn(0)
    before = episode.state()["TradingBot"]["account_info"]
    step = episode.step('{"name": "fund_account", "arguments": {"amount": NaN}}')
    assert "not a finite number" in step.observations[0]
    assert episode.state()["TradingBot"]["account_info"] == before


@pytest.mark.parametrize(
    "text",
    [
        "cd(folder={[1]})",
        "cd(folder={[1]: 2})",
        "cd(folder={{}: 2})",
        '{"name": "cd", "arguments": {"\\ud800": 1}}',
        "cd(folder='\\ud800')",  # the tool's error message quotes the surrogate
    ],
)
def test_no_message_breaks_the_rollout(renderer, text):
    """Unhashable literals (TypeError from the parser) and lone surrogates (the tokenizer's
    TypeError) end as this episode's business: the rollout finishes, its text valid UTF-8."""
    rollout = play(renderer, get_task("multi_turn_base_0"), [[text]])
    assert rollout.stop_reason == "finished"
    for message in rollout.messages:
        message["content"].encode("utf-8")  # raises on a lone surrogate
    error = parse_calls(text).errors or [m["content"] for m in rollout.messages[-3:]]
    assert error


def test_every_accepted_call_reads_back_as_itself():
    """The canonical form the checkers replay: parse(str(c)) == c, for every ground-truth call
    and for calls that exercise tuples, sets, -0.0, big ints and NFKC-folded names."""
    texts = [c for t in load_tasks().values() for turn in t.ground_truth for c in turn]
    texts += ["f(a=(1,), b={1, 2}, c=-0.0, d=10**2)", f"f(a={2**1000})", "f(ﬁle_name='x')"]
    for text in texts:
        for call in parse_calls(text).calls:
            again = parse_calls(str(call))
            assert again.errors == [] and again.calls == [call], text


def test_the_hostile_family_is_refused_at_parse_time():
    task = get_task("multi_turn_base_0")
    family = [t for call in task.ground_truth[0] for t in hostile_texts(call)]
    assert len(family) == 15 * len(task.ground_truth[0])
    for text in family:
        parsed = parse_calls(text)
        assert parsed.calls == [] and parsed.errors, text


def test_live_and_replay_agree_on_the_hostile_family_and_the_ground_truth():
    tasks = [get_task(i) for i in ("multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2")]
    for task, _, messages in hostile_family(tasks):
        assert live_vs_replay(task, messages) == ""
    for task in tasks:
        truth = [[[call] for call in turn] for turn in task.ground_truth]
        assert live_vs_replay(task, truth) == ""
        assert all(v.passed for v in score(task, [[t] if t else [] for t in task.ground_truth]))


def test_json_keys_with_quotes_get_a_clear_one_line_error():
    text = json.dumps({"name": "cd", "arguments": {"folder'": "a"}})
    (error,) = parse_calls(text).errors
    assert "argument name of 'cd'" in error and "\n" not in error


class Scripted(Engine):
    """Answers the n-th message of every episode with the n-th text of `script` (real
    tokenizer ids): the scheduler, agent loop and tool sandboxes under test are real."""

    def __init__(self, cfg, policy, script):
        super().__init__(cfg, policy, BFCL)
        self.texts = script
        self.script = [self.renderer.encode(t) + [policy.stop_id] for t in script]

    def sync(self, policy):
        pass

    def generate(self, prompts, max_new, seeds, episodes=None):
        out = []
        for prompt in prompts:
            step = self.renderer.decode(prompt).count("<|im_start|>assistant") - 1
            ids = self.script[min(step, len(self.script) - 1)]
            out.append(Sample(list(ids), [0.0] * len(ids)))
        return out


HOSTILE_MESSAGES = [
    "cd(folder={[1]})",
    '{"name": "cd", "arguments": {"\\ud800": 1}}',
    "[cd(folder={{}: 2}), ls()]",
    "cd(folder='\\ud800')",
    "All done.",
]


@pytest.mark.parametrize("scheduler", ["lockstep", "async"])
def test_the_probes_pass_through_the_scheduler(policy, scheduler):
    """bfcl protocol: each probe ends its turn (no runnable call), the episode goes on."""
    cfg = RolloutConfig(
        protocol="bfcl", max_new_tokens=64, max_total_tokens=6000, scheduler=scheduler
    )
    tasks = [get_task("multi_turn_base_0"), get_task("multi_turn_base_1")]
    engine = Scripted(cfg, policy, HOSTILE_MESSAGES)
    rollouts = engine.rollout(tasks, HIGH, seed=0)
    assert [r.stop_reason for r in rollouts] == ["finished", "finished"]
    assert engine.last_stats["rollout/episode_errors"] == 0
    for rollout in rollouts:
        for message in rollout.messages:
            message["content"].encode("utf-8")


@pytest.mark.parametrize("scheduler", ["lockstep", "async"])
def test_an_episode_whose_code_raises_fails_alone_and_is_counted(policy, monkeypatch, scheduler):
    """A fault in one episode's own code (injected: the real probes no longer raise) ends that
    episode with reward 0 and its reason; the other episodes of the call finish."""
    step = Episode.step

    def faulty(self, text_or_calls):
        if self.task.id == "multi_turn_base_1":
            raise RuntimeError("tool state lost\nsecond line")
        return step(self, text_or_calls)

    monkeypatch.setattr(Episode, "step", faulty)
    cfg = RolloutConfig(max_new_tokens=64, max_total_tokens=4000, scheduler=scheduler)
    tasks = [get_task(f"multi_turn_base_{n}") for n in (0, 1, 2)]
    engine = Scripted(cfg, policy, ["ls()", "done()"])
    rollouts = engine.rollout(tasks, HIGH, seed=0)
    assert [r.stop_reason for r in rollouts] == ["done", "error", "done"]
    failed = rollouts[1].trajectory
    assert failed.reward == failed.checks["bfcl"] == 0
    assert (
        failed.reward_reason["paper"]["reason"] == "episode failed: RuntimeError: tool state lost"
    )
    assert engine.last_stats["rollout/episode_errors"] == 1
    assert len(rollouts[1].ids) == len(rollouts[1].mask) == len(rollouts[1].logprobs)


@pytest.mark.parametrize("scheduler", ["lockstep", "async"])
def test_replaced_tool_workers_are_counted_and_the_workers_outlive_the_episode_threads(
    policy, monkeypatch, scheduler
):
    """A call over the tool limit replaces its worker, counted in that rollout call's
    rollout/tool_workers_replaced. The engine's workers then serve its next call: the async
    scheduler's episode threads that started them have ended, and the workers live on (the
    kernel's parent-death signal follows the forking thread: rcgrpo.bfcl.worker_process)."""
    from rcgrpo.bfcl import limits

    monkeypatch.setattr(limits, "_chosen", [EnvConfig(tool_timeout_s=0.5)])  # back after
    cfg = RolloutConfig(
        protocol="bfcl", max_new_tokens=64, max_total_tokens=6000, scheduler=scheduler
    )
    tasks = [get_task("multi_turn_base_15")] * 2  # MathAPI
    engine = Scripted(cfg, policy, ["power(base=10, exponent=300000000)", "All done."])
    try:
        rollouts = engine.rollout(tasks, HIGH, seed=0)
        assert engine.last_stats["rollout/tool_workers_replaced"] == 2
        for rollout in rollouts:
            assert any("timed out after 0.5s" in m["content"] for m in rollout.messages)
        engine.script = Scripted(cfg, policy, ["absolute_value(number=-2)", "All done."]).script
        rollouts = engine.rollout(tasks, HIGH, seed=1)
        assert engine.last_stats["rollout/tool_workers_replaced"] == 0
        assert all('{"result": 2' in str(r.messages) for r in rollouts)
    finally:
        engine.close()


def test_a_trusted_replay_that_overruns_fails_the_episode_not_the_caller(renderer):
    """The worker is killed (for real) after a slow call; its rebuild replays that call as
    trusted, and under load it overruns: the episode ends as a failure with that reason."""
    sandbox = Sandbox(EnvConfig(tool_timeout_s=5.0))
    try:
        loop = bfcl_loop(get_task("multi_turn_base_15"), renderer, sandbox=sandbox)
        say = renderer.encode("power(base=3, exponent=3000000)") + [renderer.stop_id]
        loop.feed(say, [0.0] * len(say))
        assert loop.pending() is not None
        os.kill(sandbox.pid(), signal.SIGKILL)
        sandbox.config = EnvConfig(tool_timeout_s=0.001)  # the rebuild's replay overruns
        say = renderer.encode("absolute_value(number=-2)") + [renderer.stop_id]
        loop.feed(say, [0.0] * len(say))
        assert loop.stop_reason == "error" and "trusted call timed out" in loop.error
        rollout = finished(loop)
        assert (
            rollout.reward == 0 and "trusted" in rollout.trajectory.reward_reason["paper"]["reason"]
        )
    finally:
        sandbox.close()

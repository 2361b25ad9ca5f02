"""The third environment, BFCL v4's agentic memory category (key-value back end, offline:
rcgrpo.envs.memory): its tasks from the installed bfcl-eval, an expert episode replayed through
the real agent loop and scored by bfcl-eval's own agentic checker, its SFT rendering, and the
data stage's expert and failure.

    .venv/bin/pytest tests/test_memory_env.py -q
"""

from __future__ import annotations

import pytest

from rcgrpo.chat.prompts import Renderer
from rcgrpo.envs.memory import Memory
from rcgrpo.envs.memory_tasks import conversation
from rcgrpo.rollout.agent_loop import AgentLoop, Limits, results
from rcgrpo.rollout.environment import Environment

MEMORY = Memory()


@pytest.fixture(scope="module")
def policy():
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    return load_policy(ModelConfig(profile="tiny"))


def test_tasks_come_from_bfcl_eval_and_the_run_can_pick_it():
    from rcgrpo.envs import get
    from rcgrpo.envs.config import EnvConfig

    assert isinstance(MEMORY, Environment) and get(EnvConfig(name="memory")).name == "memory"
    train, test = MEMORY.tasks("train"), MEMORY.tasks("test")
    assert (len(train), len(test)) == (139, 16) and not {t.id for t in train} & {t.id for t in test}
    assert {t.category for t in test} == set(MEMORY.categories)
    task = MEMORY.task("memory_0-customer-0")
    assert task.question == "What is my first name?" and task.answers == ("Michael",)
    with pytest.raises(ValueError, match="turn by turn"):
        MEMORY.episode(task, "combined")


def replayed(policy, task, answer: str):
    """The expert's messages fed to the agent loop as if sampled, `answer` at the end."""
    record = MEMORY.expert(task, "bfcl", task.split)
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    loop = AgentLoop(MEMORY.episode(task, "bfcl"), renderer, None, Limits(4096, 10**6, 20))
    said = [m["content"] for m in record.messages if m["role"] == "assistant"]
    for text in [*said[:-1], answer]:
        ids = renderer.encode(text) + [renderer.stop_id]
        loop.feed(ids, [0.0] * len(ids))
    return loop


def test_an_expert_episode_through_the_agent_loop_is_scored_by_bfcl_evals_checker(policy):
    # notetaker, the shortest conversation; a question whose source the expert finds and stores
    notes = [
        t for t in [*MEMORY.tasks("train"), *MEMORY.tasks("test")] if t.category == "notetaker"
    ]
    task = next(t for t in notes if any(t.ground_truth[:-1]))
    right, wrong = (replayed(policy, task, a) for a in (task.answers[0], "No idea."))
    scored = results([right, wrong], MEMORY.scorer("bfcl"))
    assert [r.stop_reason for r in scored] == ["finished", "finished"]
    assert [r.trajectory.checks for r in scored] == [{"correct": 1}, {"correct": 0}]
    users = [m for m in scored[0].messages if m["role"] == "user"]
    assert (
        len(users) == len(conversation("notetaker")) + 1 and users[-1]["content"] == task.question
    )
    # the memory tools ran: the expert's store and read-back came back as observations
    tools = [m["content"] for m in scored[0].messages if m["role"] == "tool"]
    assert tools and all("error" not in t.lower() for t in tools)
    from rcgrpo.rollout.sft_render import render_example

    assert render_example(scored[0].trajectory, policy, MEMORY).ids == scored[0].ids


def test_the_data_stage_gets_an_expert_and_a_usable_failure():
    from rcgrpo.data.failures import is_usable_failure

    task = MEMORY.task("memory_0-customer-0")
    expert = MEMORY.expert(task, "bfcl", task.split)
    (failure,) = MEMORY.failures(task, "bfcl", task.split, 0, usable=is_usable_failure)
    assert (expert.reward, failure.reward) == (1, 0)
    assert expert.calls[0] == [[c] for c in task.ground_truth[0][0]]  # stored in the first turn
    assert MEMORY.check_call(expert.calls[0][0][0]) is None and MEMORY.check_call("x(") is not None

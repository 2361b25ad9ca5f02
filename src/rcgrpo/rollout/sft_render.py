"""A recorded trajectory rendered as SFT token ids + assistant-only loss mask, laid out exactly
as the agent loop (rcgrpo.rollout.agent_loop) lays out a live rollout of the same policy: the
same system prompt, tool list, reward goal and continuations, so SFT and RL see one format.

    .venv/bin/pytest tests/test_agent_loop.py -q -k render_example
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rcgrpo.bfcl.environment import Episode
from rcgrpo.chat import prompts
from rcgrpo.chat.record import Trajectory
from rcgrpo.rollout.agent_loop import first_messages, with_revealed_docs


@dataclass
class Example:
    """An SFT example: ids (T,) and the assistant-only loss mask (T,)."""

    ids: list[int]
    mask: list[int]
    task_id: str = ""
    reward_token: str | None = None
    extra: dict = field(default_factory=dict)


def render_example(trajectory: Trajectory, policy) -> Example:
    """A recorded trajectory as token ids + assistant-only mask, laid out exactly as rollouts
    of `policy` (a models.Policy) are: same system prompt, tools, reward goal, continuations. The system and first user
    message are rebuilt from the task (so a record from any source renders the same prompt);
    the remaining messages are taken from the record. An assistant message's text is `content`,
    or the BFCL python list of its `tool_calls` when content is empty."""
    from rcgrpo.bfcl.tasks import get_task

    renderer, compact_docs = prompts.Renderer(policy.tokenizer, policy.stop_id), policy.compact_docs
    task = get_task(trajectory.task_id)
    episode = Episode(task, hide_missed=trajectory.protocol == "bfcl")
    episode.begin_turn(0)
    messages, tools = first_messages(
        task, episode, trajectory.protocol, trajectory.reward_token, compact_docs
    )
    rest = trajectory.messages[[m["role"] for m in trajectory.messages].index("user") + 1 :]
    ids = renderer.prompt(messages, tools)
    mask = [0] * len(ids)
    pending: list[dict] = []
    turn = 0
    for message in rest:
        if message["role"] != "assistant":
            content = message.get("content") or ""
            if message["role"] == "user":
                turn += 1
                content = with_revealed_docs(task, turn, content, trajectory.protocol, compact_docs)
            pending.append({"role": message["role"], "content": content})
            continue
        if pending:  # observations / user turn between two assistant messages
            piece = renderer.continuation(messages, pending, tools, True)
            ids, mask = ids + piece, mask + [0] * len(piece)
            messages, pending = messages + pending, []
        text = message.get("content") or prompts.format_calls(message.get("tool_calls") or [])
        piece = renderer.encode(text) + [renderer.stop_id]
        ids, mask = ids + piece, mask + [1] * len(piece)
        messages = [*messages, {"role": "assistant", "content": text}]
    tail = renderer.encode(renderer.after_stop)
    return Example(ids + tail, mask + [0] * len(tail), task.id, trajectory.reward_token)

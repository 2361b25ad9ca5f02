"""A recorded trajectory rendered as SFT token ids + assistant-only loss mask, laid out exactly
as the agent loop (rcgrpo.rollout.agent_loop) lays out a live rollout of the same policy on the
same environment: the same system prompt, tool list, reward goal and continuations, so SFT and
RL see one format.

    .venv/bin/pytest tests/test_agent_loop.py -q -k render_example
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rcgrpo.chat import prompts
from rcgrpo.chat.record import Trajectory
from rcgrpo.rollout.agent_loop import opening, with_revealed_docs
from rcgrpo.rollout.environment import Environment


@dataclass
class Example:
    """An SFT example: ids (T,) and the assistant-only loss mask (T,)."""

    ids: list[int]
    mask: list[int]
    task_id: str = ""
    reward_token: str | None = None
    extra: dict = field(default_factory=dict)


def render_example(trajectory: Trajectory, policy, env: Environment) -> Example:
    """A recorded trajectory as token ids + assistant-only mask, laid out exactly as rollouts
    of `policy` (a models.Policy) on `env` are: same system prompt, tools, reward goal,
    continuations. The system and first user message are rebuilt from the task by an episode
    of `env` (so a record from any source renders the same prompt), and each later user
    message gets the tools that episode reveals at that turn, unless it describes them already;
    the remaining messages are taken from the record. An assistant message's text is
    `content`, or the python list of its `tool_calls` when content is empty."""
    renderer, compact_docs = prompts.Renderer(policy.tokenizer, policy.stop_id), policy.compact_docs
    episode = env.episode(env.task(trajectory.task_id), trajectory.protocol)
    messages, docs, tools = opening(episode, trajectory.reward_token, compact_docs)
    shown = {d["name"] for d in docs}
    rest = trajectory.messages[[m["role"] for m in trajectory.messages].index("user") + 1 :]
    ids = renderer.prompt(messages, tools)
    mask = [0] * len(ids)
    pending: list[dict] = []
    for message in rest:
        if message["role"] != "assistant":
            content = message.get("content") or ""
            if message["role"] == "user" and not isinstance(episode.next_turn(), str):
                content = with_revealed_docs(content, episode.tool_docs(), shown, compact_docs)
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
    return Example(ids + tail, mask + [0] * len(tail), trajectory.task_id, trajectory.reward_token)

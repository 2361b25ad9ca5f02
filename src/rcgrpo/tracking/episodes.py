"""One recorded episode read as a person reads it: turns, model messages, tool calls.

`episode_tree(rollout)` takes the rollout record the trainer trains on (rcgrpo.rollout.agent_loop.
Rollout: ids (T,), loss mask (T,), sampling log-probs (T,), the messages and the scored
Trajectory) and returns its turns; each turn holds the model's messages in order, each message
its sampled tokens, the sum of their log-probs, the context length it was sampled from, the
messages it answered and its tool calls with their observations. Nothing is re-run or
re-tokenised: token counts and log-probs come from the mask and log-probs the loss uses, the
calls and observations from the record's messages. No mlflow here (rcgrpo.tracking.traces turns
the tree into an MLflow trace).

How the record lines up (agent_loop.AgentLoop): every assistant message is one run of mask = 1
tokens (its sampled ids, stop included when sampled; a forced stop is mask 0), in order; its
`tool_calls` are the parsed calls, and the tool messages after it are one observation per call,
then one per parse error. An episode that ends on a message (done(), step limit, token budget)
never shows that message's observations to the model, so those calls have none.

    .venv/bin/pytest tests/test_traces.py -q -k tree
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class ToolCall:
    call: str  # the parsed call as executed, e.g. "cd(folder='workspace')"
    name: str  # the function name
    observation: str | None  # what the model was shown; None when the episode ended first
    error: bool  # the observation is an error (executor error, or a tool's {"error": ...})
    window: tuple[int, int] | None = None  # measured (start, end) ns; None: not recorded


@dataclass
class Message:
    index: int  # 0-based among the episode's assistant messages
    text: str  # the decoded message
    tokens: int  # sampled tokens (loss mask 1)
    logprob_sum: float  # sum of their sampling log-probs
    context_tokens: int  # tokens before the message: what it was sampled from
    inputs: list[dict]  # the messages it answered (first: the user prompt; then observations)
    calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)  # error observations of unparsable parts
    window: tuple[int, int] | None = None  # measured (asked, sampled) ns; None: not recorded


@dataclass
class Turn:
    index: int
    user: str  # the user message that opened the turn (turn 0: the prompt with its reward goal)
    messages: list[Message] = field(default_factory=list)


def sampled_runs(mask: list[int], logprobs: list[float]) -> list[tuple[int, int, float]]:
    """(start, length, log-prob sum) of each maximal run of mask = 1, in order.

    >>> sampled_runs([0, 0, 1, 1, 0, 1], [0, 0, -0.5, -0.25, 0, -1.0])
    [(2, 2, -0.75), (5, 1, -1.0)]
    """
    runs: list[tuple[int, int, float]] = []
    start = None
    for i, m in enumerate([*mask, 0]):  # a sentinel 0 closes a run at the end
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i - start, float(sum(logprobs[start:i]))))
            start = None
    return runs


def is_error(observation: str) -> bool:
    """An executor error ("Error during execution: ...", "Error: could not parse ...") or a
    BFCL tool's own failure, returned as a JSON object with an "error" key."""
    text = observation.lstrip()
    if text.startswith("Error"):
        return True
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            return False
        return isinstance(value, dict) and "error" in value
    return False


def call_windows(start: int, end: int, seconds: list) -> list[tuple[int, int]]:
    """(start, end) ns of each tool call of one step, laid end to end from `start` with the
    seconds the worker measured; calls with None (killed by a limit, their time is the kill and
    the restart) share what is left of the step's wall time [start, end].

    >>> call_windows(1000, 5000, [1e-6, None, 2e-6])
    [(1000, 2000), (2000, 3000), (3000, 5000)]
    """
    known = sum(int(t * 1e9) for t in seconds if t is not None)
    unknown = sum(t is None for t in seconds)
    share = max(0, end - start - known) // unknown if unknown else 0
    out, at = [], start
    for t in seconds:
        width = share if t is None else int(t * 1e9)
        out.append((at, at + width))
        at += width
    return out


def _timed(turns: list[Turn], timing: dict | None) -> None:
    """Put the measured windows of Rollout.timing on the messages and calls, when it has one
    entry per message (a rollout from another engine has none: windows stay None)."""
    messages = [m for t in turns for m in t.messages]
    entries = (timing or {}).get("messages") or []
    if len(entries) != len(messages):
        return
    for message, (asked, sampled, tools_start, tools_end, seconds) in zip(
        messages, entries, strict=True
    ):
        message.window = (asked, sampled)
        if len(seconds) == len(message.calls):
            for call, w in zip(
                message.calls, call_windows(tools_start, tools_end, seconds), strict=True
            ):
                call.window = w


def _call_name(call: str) -> str:
    return call.split("(", 1)[0].strip() or "call"


def episode_tree(rollout) -> list[Turn]:
    """The turns of a finished rollout (see the module docstring). Token figures are 0 where
    the mask does not line up with the messages (a rollout from another engine)."""
    messages = rollout.messages
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        return []
    runs = sampled_runs(rollout.mask, rollout.logprobs)
    n_assistant = sum(m["role"] == "assistant" for m in messages)
    if len(runs) != n_assistant:
        runs = [(0, 0, 0.0)] * n_assistant
    turns = [Turn(0, messages[users[0]].get("content") or "")]
    inputs: list[dict] = [{"role": "user", "content": turns[0].user}]
    last: Message | None = None
    observed, k = 0, 0  # observations of `last` seen so far; assistant messages so far
    for m in messages[users[0] + 1 :]:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant":
            start, length, logprob = runs[k]
            calls = [ToolCall(c, _call_name(c), None, False) for c in m.get("tool_calls") or []]
            last = Message(k, content, length, logprob, start, inputs, calls)
            turns[-1].messages.append(last)
            inputs, observed, k = [], 0, k + 1
            continue
        inputs.append({"role": role, "content": content})
        if role == "user":
            turns.append(Turn(len(turns), content))
            last = None
        elif role == "tool" and last is not None:
            if observed < len(last.calls):
                last.calls[observed].observation = content
                last.calls[observed].error = is_error(content)
            else:
                last.parse_errors.append(content)
            observed += 1
    _timed(turns, getattr(rollout, "timing", None))
    return turns


def clip(text: str, limit: int) -> str:
    """text cut to `limit` characters, saying how much was cut (0 = no limit)."""
    if not limit or len(text) <= limit:
        return text
    return f"{text[:limit]} ... [{len(text) - limit} more characters]"


def check_fields(record) -> tuple[dict, dict]:
    """({"reward": the record's reward, "reward_<check>": value of every other check},
    {"reason": .., "failing_turn": .., "reason_<check>": ..}) of a scored record: its first
    check is its reward (BFCL: reward = paper R, reward_bfcl; the calculator: reward_used_tool)."""
    reasons = record.reward_reason or {}

    def why(name: str) -> dict:
        reason = reasons.get(name)
        return reason if isinstance(reason, dict) else {"reason": reason or ""}

    first, *rest = list(record.checks) or [""]
    values = {"reward": record.reward, **{f"reward_{n}": record.checks[n] for n in rest}}
    told = {"reason": why(first).get("reason", ""), "failing_turn": why(first).get("failing_turn")}
    return values, {**told, **{f"reason_{n}": why(n).get("reason", "") for n in rest}}

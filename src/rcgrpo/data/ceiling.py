"""The ceiling of a set of token limits: the ground truth replayed through the agent loop.

`replay(task, renderer, ...)` drives one `AgentLoop` as a rollout engine would, except that the
"model" is scripted: each of its messages is the expert's assistant text (rcgrpo.envs.bfcl.
experts, the calls in BFCL's python form, then the turn-closing reply or `done()`), tokenised
by the policy's tokenizer plus the stop token and cut at `loop.max_new()` exactly as generation
would be. The episode then meets the same limits, step counts and stop rules a policy meets,
and is scored with the same checkers. A task whose ground truth does not score 1 here cannot be
solved by any policy under those limits: the share that does is the ceiling of the limits.

    .venv/bin/python scripts/ceiling.py --profile qwen-shape --protocol combined
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from rcgrpo.bfcl.tasks import Task
from rcgrpo.chat.prompts import Renderer
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.envs.bfcl.experts import expert
from rcgrpo.rollout.agent_loop import AgentLoop, Limits, Rollout, results


def replay(
    task: Task,
    renderer: Renderer,
    protocol: str,
    limits: Limits,
    compact_docs: bool,
    reward_token: str | None = None,
) -> tuple[Rollout, int]:
    """(the finished rollout, the longest scripted message in tokens with its stop token)."""
    texts = [m["content"] for m in expert(task, protocol).messages if m["role"] == "assistant"]
    episode = BFCL.episode(task, protocol, limits.max_steps)
    loop = AgentLoop(episode, renderer, reward_token, limits, compact_docs)
    longest = 0
    for text in texts:
        if loop.pending() is None:
            break
        ids = [*renderer.encode(text), renderer.stop_id]
        longest = max(longest, len(ids))
        sampled = ids[: loop.max_new()]  # generation stops at max_new tokens, stop or not
        loop.feed(sampled, [0.0] * len(sampled))
    if loop.pending() is not None:  # the script ran out: end it as a model that stops talking
        loop._finish("script_end")
    return results([loop], BFCL.scorer(protocol))[0], longest


@dataclass
class Ceiling:
    """Per category: (solved under the limits, tasks); plus the lengths measured on the way."""

    solved: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    prompt_lens: list[int] = field(default_factory=list)  # first prompt, tokens
    episode_lens: list[int] = field(default_factory=list)  # whole replayed sequence, tokens
    longest_message: int = 0  # tokens, stop included
    stops: Counter = field(default_factory=Counter)  # stop reason of the unsolved episodes
    failed: list[str] = field(default_factory=list)  # task ids not solved

    @property
    def total(self) -> tuple[int, int]:
        return (sum(k for k, _ in self.solved.values()), sum(n for _, n in self.solved.values()))


def ceiling(
    tasks: list[Task],
    renderer: Renderer,
    protocol: str,
    limits: Limits,
    compact_docs: bool,
    reward_token: str | None = None,
) -> Ceiling:
    out = Ceiling()
    for task in tasks:
        rollout, longest = replay(task, renderer, protocol, limits, compact_docs, reward_token)
        ok = rollout.reward == 1
        out.solved[task.category][0] += ok
        out.solved[task.category][1] += 1
        out.prompt_lens.append(rollout.prompt_len)
        out.episode_lens.append(len(rollout.ids))
        out.longest_message = max(out.longest_message, longest)
        if not ok:
            out.stops[rollout.stop_reason] += 1
            out.failed.append(task.id)
    return out

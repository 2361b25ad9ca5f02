"""Token-in-token-out multi-turn rollout of one episode of the run's environment.

`AgentLoop` is a small state machine (verl's idea) that an engine drives: `pending()` gives the
ids to continue from, the engine samples, `feed()` appends the sampled ids (mask 1, with their
log-probs), hands the message to the episode, which parses and runs its calls, and appends the
tool observations / next user turn as tokens (mask 0). Ids are never re-tokenised: what the
trainer sees is what was sampled.

The episode (rcgrpo.rollout.environment.Episode, opened by the environment) owns the prompt
protocol: the first messages and tools, what a message does, when a turn or the episode ends.
The loop owns the tokens: the reward goal on the first user message, the chat template, the
budgets, and tools that become callable mid-episode, described in the user turn that reveals
them (the system prompt cannot change under token-in-token-out).
Stops: the episode's (BFCL: done, finished, no_calls) / step limit / token budget / error.

    .venv/bin/pytest tests/test_agent_loop.py -q
"""

from __future__ import annotations

from dataclasses import dataclass

from rcgrpo.chat import prompts
from rcgrpo.chat.record import Provenance, Trajectory
from rcgrpo.rollout.clock import EpisodeClock
from rcgrpo.rollout.environment import Episode, Rewards, Scorer

STEP_LIMIT = 20  # model messages per turn: BFCL's (bfcl_eval MAXIMUM_STEP_LIMIT)


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int = 128  # per model message
    max_total_tokens: int = 2048  # whole episode: prompt + every turn
    max_steps: int = STEP_LIMIT  # model messages per turn


@dataclass
class Rollout:
    """One finished episode. ids/mask/logprobs are aligned, length T."""

    task_id: str
    protocol: str
    reward_token: str | None
    ids: list[int]  # (T,) the exact sequence: prompt, sampled ids, observation ids
    mask: list[int]  # (T,) 1 = sampled by the policy (train on it), 0 = prompt/tool/forced
    logprobs: list[float]  # (T,) sampling policy's log p(token) at temperature 1; 0.0 where mask 0
    prompt_len: int  # ids[:prompt_len] is the first prompt (reward goal included)
    messages: list[dict]  # the conversation; decode(ids) == chat template rendering of it
    calls: list[list[list[str]]]  # per turn, per step, call strings (checkers' layout)
    stop_reason: str  # the episode's, or "step_limit" | "token_budget" | "error"
    trajectory: Trajectory | None = None  # the record, scored (`results`)
    timing: dict | None = None  # measured wall clock: rcgrpo.rollout.clock.EpisodeClock.record
    error: str = ""  # why the episode failed, with stop reason "error"

    @property
    def reward(self) -> int:
        return self.trajectory.reward

    @property
    def n_sampled(self) -> int:
        return sum(self.mask)

    @property
    def loss_mask(self) -> list[int]:
        return self.mask


def opening(episode: Episode, reward_token: str | None, compact: bool):
    """(messages, tools) of the first prompt, the reward goal on its last user message, the
    tools as the chat template takes them; the episode must be at no turn yet."""
    messages, docs = episode.opening()
    last = messages[-1]
    goal = {**last, "content": prompts.with_reward_goal(last["content"], reward_token)}
    return [*messages[:-1], goal], docs, prompts.tool_entries(docs, compact)


def with_revealed_docs(content: str, docs: list[dict], shown: set[str], compact: bool) -> str:
    """A user message with the docs of the tools callable now that were not shown yet (added
    to `shown`); unchanged when there are none or it describes them already."""
    new = [d for d in docs if d["name"] not in shown]
    shown.update(d["name"] for d in new)
    if not new or prompts.NEW_FUNCTIONS_HEADER in content:
        return content
    return content + prompts.NEW_FUNCTIONS_HEADER + prompts.tools_text(new, compact)


class AgentLoop:
    """One episode in flight. Drive it: while (ids := loop.pending()) is not None: feed(...)."""

    def __init__(
        self,
        episode: Episode,
        renderer: prompts.Renderer,
        reward_token: str | None = None,
        limits: Limits = Limits(),
        compact_docs: bool = True,
        provenance: Provenance | None = None,
    ):
        self.episode, self.renderer, self.limits = episode, renderer, limits
        self.task, self.protocol = episode.task, episode.protocol
        self.reward_token, self.compact = reward_token, compact_docs
        self.provenance = provenance or Provenance(generator="rollout")
        self.messages, docs, self.tools = opening(episode, reward_token, compact_docs)
        self.shown = {d["name"] for d in docs}  # tools described to the model so far
        self.ids = renderer.prompt(self.messages, self.tools)
        self.prompt_len = len(self.ids)
        self.mask = [0] * len(self.ids)
        self.logprobs = [0.0] * len(self.ids)
        self.calls: list[list[list[str]]] = [[]]
        self.pending_messages: list[dict] = []  # shown to the model with the next prompt
        self.stop_reason = ""
        self.error = ""  # why the episode failed, with stop reason "error"
        self.clock = EpisodeClock()
        if self.prompt_len + 1 >= limits.max_total_tokens:  # no room for a single sampled token
            self._finish("token_budget")

    # -- what the engine sees -----------------------------------------------------------------
    def pending(self) -> list[int] | None:
        """The ids to generate from, or None when the episode is over."""
        return None if self.stop_reason else self.ids

    def max_new(self) -> int:
        return min(self.limits.max_new_tokens, self.limits.max_total_tokens - len(self.ids) - 1)

    def feed(self, sampled: list[int], logprobs: list[float]) -> None:
        """Append one sampled message (its stop token included if sampled), act on it.

        Whatever this episode's own code raises on the message (parsing, a tool worker that
        cannot rebuild the state, rendering the observations) ends this episode alone as a
        failure (stop "error", reward 0, the reason kept), never the rollout call."""
        before = (len(self.ids), len(self.messages), [list(turn) for turn in self.calls])
        n_timed = self.clock.sampled()
        try:
            self._feed(sampled, logprobs)
        except Exception as e:  # noqa: BLE001 - one episode's failure is its own outcome
            n_ids, n_messages, self.calls = before
            del self.ids[n_ids:], self.mask[n_ids:], self.logprobs[n_ids:]
            del self.messages[n_messages:]
            self.clock.drop(n_timed)
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._finish("error")

    def _feed(self, sampled: list[int], logprobs: list[float]) -> None:
        # any end-of-message token the model sampled (<|eom_id|> too) is kept as sampled
        stopped = bool(sampled) and sampled[-1] in self.renderer.stop_ids
        content_ids = sampled[:-1] if stopped else sampled
        self._append(sampled, 1, logprobs)
        if not stopped:  # cut by max_new: close the message with a forced (unsampled) stop
            self._append([self.renderer.stop_id], 0)
        text = self.renderer.decode(content_ids)
        self.clock.tools_started()
        step = self.episode.step(text)
        self.clock.tools_done(step)
        message = {"role": "assistant", "content": text}
        if step.calls:
            message["tool_calls"] = [str(c) for c in step.calls]
        self.messages.append(message)
        if not step.calls:  # prose or unparsable: the turn ends (BFCL: decode failure ends it)
            return self._end_turn()
        # only calls that ran are scored: a refused, unparsable or killed call changed nothing
        executed = [str(c) for c, e in zip(step.calls, step.executed, strict=True) if e]
        if executed:  # a call that ran nothing (BFCL's done()) is not a step of the trajectory
            self.calls[-1].append(executed)
        if step.stop:
            return self._finish(step.stop)
        self.pending_messages += [{"role": "tool", "content": o} for o in step.observations]
        if self.episode.steps_left <= 0:
            return self._finish("step_limit")
        self._continue()

    # -- internals ----------------------------------------------------------------------------
    def _append(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.mask += [mask] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def _end_turn(self) -> None:
        user = self.episode.next_turn()
        if isinstance(user, str):  # the episode is over, this is why
            return self._finish(user)
        docs = self.episode.tool_docs()
        last = with_revealed_docs(user[-1]["content"], docs, self.shown, self.compact)
        self.pending_messages += [*user[:-1], {**user[-1], "content": last}]
        self.calls.append([])
        self._continue()

    def _continue(self) -> None:
        """Append the pending messages + generation prompt as tokens, if the budget allows."""
        room = self.limits.max_total_tokens - len(self.ids) - 1
        chars = sum(len(m["content"]) for m in self.pending_messages)
        if chars > room * self.renderer.longest_token:  # cannot fit: never tokenized at all
            return self._finish("token_budget")
        history = [{k: m[k] for k in ("role", "content")} for m in self.messages]
        ids = self.renderer.continuation(history, self.pending_messages, self.tools, True)
        if len(self.ids) + len(ids) + 1 >= self.limits.max_total_tokens:
            return self._finish("token_budget")
        self._append(ids, 0)
        self.messages += self.pending_messages
        self.pending_messages = []
        self.clock.ready()

    def _finish(self, reason: str) -> None:
        """Close the sequence so that decode(ids) == rendering of self.messages."""
        self.stop_reason = reason
        self.clock.finish()
        self.pending_messages = []  # never shown to the model: not part of the record
        self._append(self.renderer.encode(self.renderer.after_stop), 0)

    def rollout(self) -> Rollout:
        """The finished episode, not scored yet (`results` scores a batch and records it)."""
        if not self.stop_reason:
            raise RuntimeError(f"{self.task.id}: episode still running")
        return Rollout(
            self.task.id,
            self.protocol,
            self.reward_token,
            self.ids,
            self.mask,
            self.logprobs,
            self.prompt_len,
            self.messages,
            self.calls,
            self.stop_reason,
            timing=self.clock.record(),
            error=self.error,
        )

    def record(self, rewards: Rewards) -> Trajectory:
        """The episode's record with its scores (the reasons, then the stop reason)."""
        return Trajectory(
            task_id=self.task.id,
            category=self.task.category,
            split=self.episode.split,
            protocol=self.protocol,
            messages=self.messages,
            calls=self.calls,
            reward=int(rewards.train),
            checks=dict(rewards.checks),
            provenance=self.provenance,
            reward_token=self.reward_token,
            reward_reason={**rewards.reasons, "stop": self.stop_reason},
        )


def results(loops: list[AgentLoop], scorer: Scorer) -> list[Rollout]:
    """The rollouts of finished loops, scored by `scorer` in one batch (an environment that
    scores elsewhere, BFCL's sandbox worker, shares the round trips), each with its record."""
    rollouts = [loop.rollout() for loop in loops]
    scores = scorer.batch([(loop.task, r) for loop, r in zip(loops, rollouts, strict=True)])
    for loop, r, rewards in zip(loops, rollouts, scores, strict=True):
        r.trajectory = loop.record(rewards)
    return rollouts

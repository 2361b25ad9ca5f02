"""Token-in-token-out multi-turn rollout of one BFCL episode, and SFT rendering of a record.

`AgentLoop` is a small state machine (verl's idea) that an engine drives: `pending()` gives the
ids to continue from, the engine samples, `feed()` appends the sampled ids (mask 1, with their
log-probs), parses and executes the calls, and appends the tool observations / next user turn
as tokens (mask 0). Ids are never re-tokenised: what the trainer sees is what was sampled.

Protocols:
* "combined" (paper): one prompt "Step 1: ... Step n: ..." with a `done()` tool; every function
  is listed from the start; `done()` ends the episode and is not scored.
* "bfcl" (official): user turns one at a time; in miss_func the held-out functions are listed in
  the reveal turn's user message; BFCL's per-turn step limit (hitting it ends the episode, as
  BFCL's force-quit does).
Stops: done / a message with no parsable call (ends the turn) / step limit / token budget.

    .venv/bin/pytest tests/test_agent_loop.py -q
"""

from __future__ import annotations

from dataclasses import dataclass

from rcgrpo.bfcl.checkers import score, score_many
from rcgrpo.bfcl.environment import STEP_LIMIT
from rcgrpo.bfcl.replay import Verdict
from rcgrpo.bfcl.tasks import Task, split_of
from rcgrpo.chat import prompts
from rcgrpo.chat.record import Provenance, Trajectory
from rcgrpo.rollout.bfcl_environment import BFCL
from rcgrpo.rollout.clock import EpisodeClock
from rcgrpo.rollout.environment import Episode


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
    stop_reason: str  # "done" | "no_calls" | "finished" | "step_limit" | "token_budget" | "error"
    trajectory: Trajectory  # the record, scored with both checkers
    timing: dict | None = None  # measured wall clock: rcgrpo.rollout.clock.EpisodeClock.record

    @property
    def reward(self) -> int:
        return self.trajectory.paper_reward

    @property
    def n_sampled(self) -> int:
        return sum(self.mask)

    @property
    def loss_mask(self) -> list[int]:
        return self.mask


def first_messages(
    task: Task, episode: Episode, protocol: str, reward_token: str | None, compact: bool
) -> tuple[list[dict], list[dict]]:
    """(messages, tools) of the first prompt; the episode must be at turn 0."""
    system = prompts.SYSTEM_PROMPT
    docs = episode.tool_docs()
    if protocol == "combined":
        system += prompts.COMBINED_SUFFIX
        docs = [*docs, prompts.DONE_DOC]
        user = prompts.combined_request(list(task.turns))
    else:
        user = "\n".join(m["content"] for m in task.turns[0])
    user = prompts.with_reward_goal(user, reward_token)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return messages, prompts.tool_entries(docs, compact)


def with_revealed_docs(task: Task, turn: int, content: str, protocol: str, compact: bool) -> str:
    """A bfcl-protocol reveal turn's user message with the docs of the functions it reveals."""
    names = sorted(task.missed_functions.get(turn, []))
    if protocol != "bfcl" or not names or prompts.NEW_FUNCTIONS_HEADER in content:
        return content
    docs = [d for d in task.function_docs if d["name"] in names]
    return content + prompts.NEW_FUNCTIONS_HEADER + prompts.tools_text(docs, compact)


class AgentLoop:
    """One episode in flight. Drive it: while (ids := loop.pending()) is not None: feed(...)."""

    def __init__(
        self,
        task: Task,
        renderer: prompts.Renderer,
        protocol: str = "combined",
        reward_token: str | None = None,
        limits: Limits = Limits(),
        compact_docs: bool = True,
        provenance: Provenance | None = None,
        sandbox=None,
    ):
        if protocol not in ("bfcl", "combined"):
            raise ValueError(f"protocol must be 'bfcl' or 'combined', got {protocol!r}")
        self.task, self.renderer, self.protocol, self.limits = task, renderer, protocol, limits
        self.reward_token, self.compact = reward_token, compact_docs
        self.provenance = provenance or Provenance(generator="rollout")
        # sandbox: the tool worker of this episode (None: this thread's, rcgrpo.bfcl.sandbox)
        self.episode = BFCL.episode(task, protocol, limits.max_steps, sandbox)
        self.episode.begin_turn(0)
        self.messages, self.tools = first_messages(
            task, self.episode, protocol, reward_token, compact_docs
        )
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
            return self._end_turn("no_calls")
        # only calls that ran are scored: a refused, unparsable or killed call changed nothing
        executed = [str(c) for c, e in zip(step.calls, step.executed, strict=True) if e]
        if executed:  # a bare done() is not a step of the trajectory
            self.calls[-1].append(executed)
        if any(c.name == "done" for c in step.calls) and self.protocol == "combined":
            return self._finish("done")
        self.pending_messages += [{"role": "tool", "content": o} for o in step.observations]
        if self.episode.steps_left <= 0:
            return self._finish("step_limit")
        self._continue()

    # -- internals ----------------------------------------------------------------------------
    def _append(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.mask += [mask] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def _end_turn(self, reason: str) -> None:
        if self.protocol == "combined" or self.episode.turn + 1 >= self.episode.n_turns:
            return self._finish(reason if self.protocol == "combined" else "finished")
        user = self.episode.begin_turn()
        turn = self.episode.turn
        last = with_revealed_docs(self.task, turn, user[-1]["content"], "bfcl", self.compact)
        user = [*user[:-1], {**user[-1], "content": last}]
        self.pending_messages += user
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

    def result(self, verdicts: tuple[Verdict, Verdict] | None = None) -> Rollout:
        """The finished rollout, scored here unless `verdicts` = (paper, bfcl) are given
        (`results` scores a whole batch of loops in one request to the sandbox worker)."""
        if not self.stop_reason:
            raise RuntimeError(f"{self.task.id}: episode still running")
        if self.stop_reason == "error":  # a failed episode scores 0 on both, with its reason
            paper = bfcl = Verdict(False, None, f"episode failed: {self.error}")
        else:
            paper, bfcl = verdicts or score(self.task, self.calls, self.protocol)
        trajectory = Trajectory(
            task_id=self.task.id,
            category=self.task.category,
            split=split_of(self.task),
            protocol=self.protocol,
            messages=self.messages,
            calls=self.calls,
            paper_reward=paper.reward,
            bfcl_reward=bfcl.reward,
            provenance=self.provenance,
            reward_token=self.reward_token,
            reward_reason={
                "paper": paper.to_dict(),
                "bfcl": bfcl.to_dict(),
                "stop": self.stop_reason,
            },
        )
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
            trajectory,
            self.clock.record(),
        )


def results(loops: list[AgentLoop]) -> list[Rollout]:
    """`result()` of every finished loop, scored in one request per protocol.

    One round trip to the sandbox worker per trajectory costs ~0.2 ms of process switches on
    top of ~0.25 ms of replay; a rollout batch (an RL step's n x G episodes, an evaluation
    shard) shares them (bench/executor.py, the k = 40 row). Verdicts equal `result()`'s.
    """
    verdicts: list = [None] * len(loops)
    for protocol in dict.fromkeys(loop.protocol for loop in loops):
        index = [i for i, loop in enumerate(loops) if loop.protocol == protocol]
        scored = _score_each_alone_on_failure(
            [(loops[i].task, loops[i].calls) for i in index], protocol
        )
        for i, verdict in zip(index, scored, strict=True):
            verdicts[i] = verdict
    return [loop.result(v) for loop, v in zip(loops, verdicts, strict=True)]


def _score_each_alone_on_failure(items, protocol: str) -> list[tuple[Verdict, Verdict]]:
    """`score_many`; if the batch raises (a trusted replay that overruns its limit in a rebuilt
    worker), each trajectory is scored alone and the one that raises fails with the reason."""
    try:
        return score_many(items, protocol)
    except Exception:  # noqa: BLE001 - find the trajectory at fault below
        out = []
        for task, calls in items:
            try:
                out.append(score(task, calls, protocol))
            except Exception as e:  # noqa: BLE001 - this trajectory's failure, with its reason
                failed = Verdict(False, None, f"scoring failed: {type(e).__name__}: {e}")
                out.append((failed, failed))
        return out

"""BFCL v4's agentic memory category, key-value back end, as an environment: the model talks
with a user over a scenario's conversation (customer, finance, healthcare, notetaker,
student), may store what it learns with the memory tools (`core_memory_add`,
`archival_memory_add`, `..._key_search`, ...: bfcl-eval's `MemoryAPI_kv`, imported from the
installed wheel, never copied), and is then asked one question about it. Check "correct":
bfcl-eval's own agentic checker (one of the answers in the final reply, case and punctuation
aside). 155 questions; every tenth is held out (16 test, 139 train).

How it differs from bfcl-eval, and why: bfcl-eval runs a scenario's prerequisite conversation
once, keeps the memory on disk, and asks every question on that snapshot. Here one episode is
the scenario's conversation followed by one question, its memory in that episode alone, so an
episode's reward depends on its own actions (what RL needs) and episodes never share state.
Turn by turn only (protocol "bfcl"): the category is about remembering across turns, which one
combined request would defeat. Long: 24 (notetaker) to 109 (customer) user turns, 3.5 k to
88 k characters, so it is a GPU-sized environment (the `tiny` profile's 1,536-token budget
ends an episode in the first turns). The tools run in this process (no sandbox): bounded
dictionary operations and a BM25 ranking over at most 50 keys.

    rcgrpo run --set env.name=memory --set rollout.protocol=bfcl --set rl.protocol=bfcl --set dataset.protocol=bfcl --set dataset.train_categories=[] --preset paper
    .venv/bin/pytest tests/test_memory_env.py -q
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rcgrpo.bfcl.dispatch import dispatch
from rcgrpo.bfcl.executor import CallError, parse_calls
from rcgrpo.bfcl.observations import shown
from rcgrpo.bfcl.replay import parse_call_string
from rcgrpo.chat.prompts import format_calls
from rcgrpo.chat.record import Provenance, Trajectory
from rcgrpo.envs.memory_tasks import (
    CATEGORIES,
    MemoryTask,
    all_tasks,
    conversation,
    expert_calls,
    tool_docs,
)
from rcgrpo.rollout.environment import NoWorkers, Rewards, carried

SYSTEM_PROMPT = (
    "You are an assistant with a long-term memory. Call the memory functions listed below to "
    "store what the user tells you and to look it up later; to call them, reply with only a "
    "python list of calls, e.g. [core_memory_add(key='name', value='Ada')]. Otherwise reply in "
    "plain text; a plain reply ends your turn."
)
NOTED = "Noted."


def memory_api():
    """A fresh, empty key-value memory (bfcl-eval's MemoryAPI_kv; nothing written to disk)."""
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.memory_kv import MemoryAPI_kv

    return MemoryAPI_kv()


@dataclass
class MemoryStep:
    calls: list
    observations: list
    executed: list
    stop: str = ""


class MemoryEpisode:
    """The scenario's conversation turn by turn, then the question, on one empty memory."""

    def __init__(self, task: MemoryTask, protocol: str, step_limit: int = 20):
        if protocol != "bfcl":
            raise ValueError(f"the memory environment is turn by turn (bfcl), not {protocol!r}")
        self.task, self.protocol, self.split, self.step_limit = (
            task,
            protocol,
            task.split,
            step_limit,
        )
        self.turns = [*conversation(task.category), [{"role": "user", "content": task.question}]]
        self.turn, self.steps = 0, 0
        api = memory_api()
        self.functions = {d["name"]: getattr(api, d["name"]) for d in tool_docs()}

    def opening(self) -> tuple[list[dict], list[dict]]:
        user = "\n".join(m["content"] for m in self.turns[0])
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ], list(tool_docs())

    def step(self, text: str) -> MemoryStep:
        self.steps += 1
        parsed = parse_calls(text)
        observations, executed = [], []
        for call in parsed.calls:
            _, observation = dispatch(call, self.functions)
            observations.append(shown(observation))
            executed.append(call.name in self.functions)
        observations += [shown(f"Error: could not parse tool call: {e}") for e in parsed.errors]
        return MemoryStep(parsed.calls, observations, executed)

    def next_turn(self) -> list[dict] | str:
        self.turn += 1
        if self.turn >= len(self.turns):
            return "finished"
        self.steps = 0
        return list(self.turns[self.turn])

    def tool_docs(self) -> list[dict]:
        return list(tool_docs())

    @property
    def steps_left(self) -> int:
        return self.step_limit - self.steps


def final_reply(task: MemoryTask, messages: list[dict]) -> str:
    """The plain reply to the question: the last assistant message without calls after the
    question's user turn ("" when the episode ended before it)."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users or messages[users[-1]]["content"] != task.question:
        return ""
    said = [m for m in messages[users[-1] :] if m["role"] == "assistant"]
    plain = [m["content"] for m in said if not m.get("tool_calls")]
    return plain[-1] if plain else ""


@dataclass(frozen=True)
class MemoryScorer:
    protocol: str = "bfcl"
    reward: str = "correct"

    def __post_init__(self):
        if self.reward != "correct":
            raise ValueError(f"memory reward {self.reward!r}: correct")

    def __call__(self, task: MemoryTask, rollout) -> Rewards:
        rewards = carried(rollout, self.reward)
        if rewards is not None:
            return rewards
        from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker

        reply = final_reply(task, getattr(rollout, "messages", None) or [])
        verdict = agentic_checker(reply, list(task.answers))
        why = "" if verdict["valid"] else verdict.get("error_message", "")
        return Rewards(
            float(verdict["valid"]),
            {"correct": int(verdict["valid"])},
            {"correct": {"reason": why}},
        )

    def batch(self, items) -> list[Rewards]:
        return [self(task, rollout) for task, rollout in items]


@dataclass
class Played:
    messages: list
    calls: list = field(default_factory=list)


class Memory:
    """The agentic memory category as an Environment (rcgrpo.rollout.environment)."""

    name = "memory"
    protocols = ("bfcl",)
    categories = CATEGORIES
    kinds = ("wrong_answer",)
    checks = ("correct",)

    def __init__(self, cfg=None):
        self.cfg = cfg

    def tasks(self, split: str, categories: Sequence[str] = ()) -> list[MemoryTask]:
        if unknown := sorted(set(categories) - set(CATEGORIES)):
            raise ValueError(f"memory categories {unknown}: one of {', '.join(CATEGORIES)}")
        keep = set(categories or CATEGORIES)
        return [t for t in all_tasks().values() if t.split == split and t.category in keep]

    def task(self, task_id: str) -> MemoryTask:
        if task_id not in all_tasks():
            raise KeyError(f"unknown memory task {task_id!r}: ids look like memory_0-customer-0")
        return all_tasks()[task_id]

    def episode(self, task: MemoryTask, protocol: str, step_limit: int = 20, worker=None):
        return MemoryEpisode(task, protocol, step_limit)

    def scorer(self, protocol: str = "bfcl", reward: str | None = None) -> MemoryScorer:
        return MemoryScorer(protocol, reward or "correct")

    def workers(self, k: int = 0):
        return NoWorkers()

    # -- the data stage ---------------------------------------------------------------------------
    def play(self, task, protocol, split, answer: str, generator: str) -> Trajectory:
        """The expert's calls turn by turn, "Noted." after each turn, `answer` to the question."""
        episode, messages, calls = self.episode(task, protocol), [], []
        for turn, steps in enumerate(expert_calls(task)):
            user = episode.opening()[0][-1:] if turn == 0 else episode.next_turn()
            messages += user
            calls.append([list(steps)] if steps else [])
            if steps:
                step = episode.step(format_calls(steps))
                messages.append(
                    {"role": "assistant", "content": format_calls(steps), "tool_calls": steps}
                )
                messages += [{"role": "tool", "content": o} for o in step.observations]
            last = turn == len(conversation(task.category))
            messages.append({"role": "assistant", "content": answer if last else NOTED})
        rewards = self.scorer(protocol)(task, Played(messages, calls))
        return Trajectory(
            task_id=task.id,
            category=task.category,
            split=split,
            protocol=protocol,
            messages=messages,
            calls=calls,
            reward=int(rewards.train),
            checks=dict(rewards.checks),
            provenance=Provenance(generator),
            reward_reason=dict(rewards.reasons),
        )

    def expert(self, task: MemoryTask, protocol: str, split: str) -> Trajectory:
        return self.play(task, protocol, split, task.answers[0], "expert")

    def failures(self, task, protocol, split, seed, kinds=(), attempts=4, usable=None) -> list:
        """One failure: the same memory work, then an answer that does not say it."""
        if unknown := sorted(set(kinds) - {"wrong_answer"}):
            raise ValueError(f"memory failure kinds {unknown}: wrong_answer")
        record = self.play(task, protocol, split, "I do not remember.", "perturbation:wrong_answer")
        keep = record.reward == 0 and (usable is None or usable(record))
        return [record] if keep else []

    def check_call(self, text: str) -> str | None:
        try:
            parse_call_string(text)
        except CallError as e:
            return str(e)
        return None

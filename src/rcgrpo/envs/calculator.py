"""A small arithmetic environment: "What is 12 + 7?" with two tools, add(a, b) and mul(a, b).

The second environment of the project, and the example of docs/environments.md: tasks, an
episode, a scorer and the data stage's expert and failures in one file, through the same agent
loop, engines, trainer, evaluation and data stage as BFCL. An episode is one turn: the model
calls a tool as a python list (`[add(a=12, b=7)]`), reads the result as a tool message, and
answers with the number in plain text, which ends the episode. Checks: "correct" (the answer is
the result; trains by default) and "used_tool" (the right tool ran with the right arguments).
Tasks are made from a fixed seed: 40 per category, the numbers 0..20, a tenth of them held out.
Its tools are two integer operations on parsed literals (`ast.literal_eval`): no sandbox.

    rcgrpo run --set env.name=calculator --set dataset.train_categories=[]
    .venv/bin/pytest tests/test_calculator.py -q
"""

from __future__ import annotations

import ast
import functools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rcgrpo.chat.prompts import format_calls
from rcgrpo.chat.record import Provenance, Trajectory
from rcgrpo.rollout.environment import NoWorkers, Rewards, carried

CATEGORIES = ("add", "mul")
TOOLS = {"add": (lambda a, b: a + b, "+"), "mul": (lambda a, b: a * b, "*")}
DOCS = [
    {
        "name": name,
        "description": f"a {sign} b",
        "parameters": {
            "type": "dict",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
    for name, (_, sign) in TOOLS.items()
]
SYSTEM_PROMPT = (
    "You are a calculator. To compute, reply with only a python list of calls, e.g. "
    "[add(a=2, b=3)]; the result comes back as a tool message. Then reply with the number alone."
)
PER_CATEGORY, HELD_OUT = 40, 4  # tasks per category, of which held out (test)
KINDS = ("wrong_argument", "wrong_tool", "wrong_answer")


@dataclass(frozen=True)
class CalcTask:
    id: str  # "calc_add_3"
    category: str  # the tool that solves it
    a: int
    b: int
    split: str

    @property
    def answer(self) -> int:
        return TOOLS[self.category][0](self.a, self.b)

    @property
    def ground_truth(self) -> tuple:
        """Per turn, the expert's call strings (the data stage's train_max_calls counts them)."""
        return ([f"{self.category}(a={self.a}, b={self.b})"],)


@functools.cache
def all_tasks() -> dict[str, CalcTask]:
    rng, out = random.Random(0), {}
    for category in CATEGORIES:
        for n in range(PER_CATEGORY):
            a, b = rng.randint(0, 20), rng.randint(0, 20)
            split = "test" if n < HELD_OUT else "train"
            out[f"calc_{category}_{n}"] = CalcTask(f"calc_{category}_{n}", category, a, b, split)
    return out


@dataclass
class CalcCall:
    name: str
    kwargs: dict

    def __str__(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"


def parse(text: str) -> list[CalcCall]:
    """The calls of a message `[add(a=1, b=2), ...]`; [] when it is no list of calls. Only
    literal keyword arguments are read (ast.literal_eval): model text is data, never code."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return []
    items = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for item in items:
        if not (isinstance(item, ast.Call) and isinstance(item.func, ast.Name)) or item.args:
            return []
        try:
            kwargs = {k.arg: ast.literal_eval(k.value) for k in item.keywords}
        except ValueError:
            return []
        calls.append(CalcCall(item.func.id, kwargs))
    return calls


@dataclass
class CalcStep:
    calls: list
    observations: list
    executed: list
    stop: str = ""


@dataclass
class CalcEpisode:
    task: CalcTask
    protocol: str
    step_limit: int = 20
    steps: int = 0
    answer: str | None = None

    @property
    def split(self) -> str:
        return self.task.split

    def opening(self) -> tuple[list[dict], list[dict]]:
        sign = TOOLS[self.task.category][1]
        user = f"What is {self.task.a} {sign} {self.task.b}?"
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ], DOCS

    def step(self, text: str) -> CalcStep:
        self.steps += 1
        calls = parse(text)
        if not calls:
            self.answer = text.strip()
            return CalcStep([], [], [])
        observations, executed = [], []
        for call in calls:
            tool = TOOLS.get(call.name, (None,))[0]
            ok = tool is not None and set(call.kwargs) == {"a", "b"}
            ok = ok and all(type(v) is int and abs(v) < 10**6 for v in call.kwargs.values())
            observations.append(str(tool(**call.kwargs)) if ok else f"Error: bad call {call}")
            executed.append(ok)
        return CalcStep(calls, observations, executed)

    def next_turn(self) -> str:
        return "finished"  # one turn: the answer ends the episode

    def tool_docs(self) -> list[dict]:
        return DOCS

    @property
    def steps_left(self) -> int:
        return self.step_limit - self.steps


def last_answer(rollout) -> str:
    """The text of the last assistant message without calls (the answer), or ""."""
    messages = getattr(rollout, "messages", None) or []
    said = [m["content"] for m in messages if m["role"] == "assistant" and not m.get("tool_calls")]
    return said[-1] if said else ""


@dataclass(frozen=True)
class CalcScorer:
    protocol: str = "combined"
    reward: str = "correct"

    def __post_init__(self):
        if self.reward not in Calculator.checks:
            raise ValueError(f"calculator reward {self.reward!r}: one of correct, used_tool")

    def __call__(self, task: CalcTask, rollout) -> Rewards:
        rewards = carried(rollout, self.reward)
        if rewards is not None:
            return rewards
        numbers = re.findall(r"-?\d+", last_answer(rollout))
        correct = int(numbers == [str(task.answer)])
        ran = [parse(f"[{c}]") for turn in rollout.calls for step in turn for c in step]
        used = int([CalcCall(task.category, {"a": task.a, "b": task.b})] in ran)
        checks = {"correct": correct, "used_tool": used}
        reasons = {"answer": last_answer(rollout)[:200], "expected": task.answer}
        return Rewards(float(checks[self.reward]), checks, reasons)

    def batch(self, items) -> list[Rewards]:
        return [self(task, rollout) for task, rollout in items]


@dataclass
class Played:
    """What a scorer reads of an expert or a failure made here."""

    messages: list
    calls: list = field(default_factory=list)


class Calculator:
    """The calculator as an Environment (rcgrpo.rollout.environment). cfg: the run's `env:`
    section (nothing in it applies: no sandbox)."""

    name = "calculator"
    protocols = ("combined",)  # one request, answered in one turn
    categories = CATEGORIES
    kinds = KINDS
    checks = ("correct", "used_tool")

    def __init__(self, cfg=None):
        self.cfg = cfg

    def tasks(self, split: str, categories: Sequence[str] = ()) -> list[CalcTask]:
        if unknown := sorted(set(categories) - set(CATEGORIES)):
            raise ValueError(f"calculator categories {unknown}: one of {', '.join(CATEGORIES)}")
        keep = set(categories or CATEGORIES)
        return [t for t in all_tasks().values() if t.split == split and t.category in keep]

    def task(self, task_id: str) -> CalcTask:
        if task_id not in all_tasks():
            raise KeyError(f"unknown calculator task {task_id!r}: ids look like calc_add_0")
        return all_tasks()[task_id]

    def episode(self, task: CalcTask, protocol: str, step_limit: int = 20, worker=None):
        if protocol not in self.protocols:
            raise ValueError(f"the calculator's protocol is 'combined', not {protocol!r}")
        return CalcEpisode(task, protocol, step_limit)

    def scorer(self, protocol: str = "combined", reward: str | None = None) -> CalcScorer:
        return CalcScorer(protocol, reward or "correct")

    def workers(self, k: int = 0) -> NoWorkers:
        return NoWorkers()

    # -- the data stage ---------------------------------------------------------------------------
    def play(self, task, protocol, split, calls, answer, generator) -> Trajectory:
        """A scored record of `calls` (call strings, one step) then `answer`, run here."""
        episode, messages = self.episode(task, protocol), []
        if calls:
            text = format_calls(calls)
            step = episode.step(text)
            messages.append({"role": "assistant", "content": text, "tool_calls": list(calls)})
            messages += [{"role": "tool", "content": o} for o in step.observations]
        messages.append({"role": "assistant", "content": answer})
        record_calls = [[list(calls)] if calls else []]
        rewards = self.scorer(protocol)(task, Played(messages, record_calls))
        return Trajectory(
            task_id=task.id,
            category=task.category,
            split=split,
            protocol=protocol,
            messages=[episode.opening()[0][-1], *messages],
            calls=record_calls,
            reward=int(rewards.train),
            checks=dict(rewards.checks),
            provenance=Provenance(generator),
            reward_reason=dict(rewards.reasons),
        )

    def expert(self, task: CalcTask, protocol: str, split: str) -> Trajectory:
        calls = list(task.ground_truth[0])
        return self.play(task, protocol, split, calls, str(task.answer), "expert")

    def failures(self, task, protocol, split, seed, kinds=(), attempts=4, usable=None) -> list:
        """One failure per kind: a wrong argument, the wrong tool, or a wrong final answer."""
        if unknown := sorted(set(kinds) - set(KINDS)):
            raise ValueError(f"calculator failure kinds {unknown}: one of {', '.join(KINDS)}")
        rng = random.Random(f"{seed}:{task.id}")
        other = CATEGORIES[1 - CATEGORIES.index(task.category)]
        wrong_a = task.a + rng.choice((1, 2, 3))
        made = {
            "wrong_argument": ([f"{task.category}(a={wrong_a}, b={task.b})"], None),
            "wrong_tool": ([f"{other}(a={task.a}, b={task.b})"], None),
            "wrong_answer": (list(task.ground_truth[0]), str(task.answer + rng.choice((1, -1)))),
        }
        out = []
        for kind in kinds or KINDS:
            calls, answer = made[kind]
            if answer is None:  # the answer is what the wrong call returned
                answer = self.episode(task, protocol).step(format_calls(calls)).observations[0]
            record = self.play(task, protocol, split, calls, answer, f"perturbation:{kind}")
            if record.reward == 0 and (usable is None or usable(record)):
                out.append(record)
        return out

    def check_call(self, text: str) -> str | None:
        return None if parse(f"[{text}]") else f"not a call: {text[:80]!r}"

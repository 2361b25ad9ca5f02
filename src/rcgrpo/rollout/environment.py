"""The environment seam: what the agent loop, the engines, the trainer, the evaluation and the
data stage need of a benchmark. Nothing below names one: the run picks it (`env.name`,
rcgrpo.envs) and hands it down.

Small protocols (typing.Protocol: structural, nothing to inherit) and one value type:

* `Environment`: the tasks of a split (`tasks`, `task(id)` for a Ray shard), an `Episode` on one
  task, the `Scorer` of a protocol and a training reward, its tool workers (`workers(k)`), and
  for the data stage an expert trajectory, failures made from it and a call-text check.
* `Episode`: one task in flight, as the agent loop drives it: `opening()` the first messages and
  tool docs, `step(text)` runs one model message, `next_turn()` the next user turn (or why the
  episode is over), `tool_docs()` the tools callable now, `steps_left` in this turn.
* `Scorer`: a finished rollout of a task -> `Rewards`; `batch` scores a rollout call's episodes
  together (an environment that replays them elsewhere shares the round trips).
* `Rewards`: the scalar the policy is trained on plus every named check (reported as metrics
  and evaluation columns under its name) and the reasons.

Why a `Rewards` and not a tuple: nothing above the environment may know how many checks a
benchmark has nor what they are called (BFCL: "paper" and "bfcl"; the calculator: "correct" and
"used_tool"). Implementations: rcgrpo.envs (bfcl, calculator); docs/environments.md.

    .venv/bin/pytest tests/test_environment_seam.py -q
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Rewards:
    """One scored rollout. train: what the advantages are computed from; checks: every named
    check (the training one included when it is a check), in the order reports list them;
    reasons: per check, why (what the evaluation's outcomes.jsonl keeps)."""

    train: float
    checks: Mapping[str, float]
    reasons: Mapping[str, Any] = field(default_factory=dict)


def carried(rollout, reward: str) -> Rewards | None:
    """The Rewards a rollout of the agent loop carries (its record was scored in its rollout
    call: `Scorer.batch`), trained on the check `reward`; None for a rollout with no record."""
    record = getattr(rollout, "trajectory", None)
    if record is None:
        return None
    checks = dict(record.checks)
    return Rewards(float(checks[reward]), checks, dict(record.reward_reason or {}))


class StepResult(Protocol):
    """What `Episode.step` returns for one model message."""

    calls: Sequence[Any]  # the calls it parsed; str(call) is the call's text
    observations: Sequence[str]  # one per call, then one per parse error
    executed: Sequence[bool]  # per call: it ran (what a scorer replays)
    stop: str  # "" or why this message ends the episode (BFCL's combined protocol: "done")


@runtime_checkable
class Episode(Protocol):
    """One task in flight. `task` has `.id` and `.category`; `split` is the task's side."""

    task: Any
    split: str
    protocol: str

    def opening(self) -> tuple[list[dict], list[dict]]:
        """(messages, tool docs) of the first prompt: system and user messages (the agent loop
        appends the reward goal to the last one) and the docs of the tools listed in it."""
        ...

    def step(self, text: str) -> StepResult: ...

    def next_turn(self) -> list[dict] | str:
        """After a message without calls: the next turn's user messages, or a stop reason (a
        str, e.g. "finished") when the episode is over."""
        ...

    def tool_docs(self) -> list[dict]:
        """The docs of the tools callable now (a tool that becomes callable mid-episode is
        described to the model in the user turn that reveals it)."""
        ...

    @property
    def steps_left(self) -> int: ...


@runtime_checkable
class Scorer(Protocol):
    """score(task, rollout) -> Rewards. A rollout is what the engine returned for the task, or
    anything with its `calls` (per turn, per step, call strings)."""

    def __call__(self, task: Any, rollout: Any) -> Rewards: ...

    def batch(self, items: Sequence[tuple[Any, Any]]) -> list[Rewards]:
        """Rewards of (task, rollout) pairs scored together; equal to each scored alone."""
        ...


class Workers(Protocol):
    """An environment's tool workers for one engine: `worker(i)` is where episode i runs its
    tool calls (passed to `Environment.episode`); `close()` stops them."""

    def worker(self, index: int) -> Any: ...

    def restarts(self) -> int:
        """Workers replaced so far (a call killed at its limit, or a worker that died)."""
        ...

    def close(self) -> None: ...


class NoWorkers:
    """`Workers` of an environment whose tools run in the episode itself (none to replace)."""

    def worker(self, index: int) -> None:
        return None

    def restarts(self) -> int:
        return 0

    def close(self) -> None:
        return None


@runtime_checkable
class Environment(Protocol):
    """A benchmark: its tasks (each with `.id` and `.category`), episodes and scorers."""

    name: str
    protocols: tuple[str, ...]  # prompt protocols; the first is the environment's own
    categories: tuple[str, ...]  # its task categories, in the order reports list them
    kinds: tuple[str, ...]  # the failures it makes for the data stage (`failures`)
    checks: tuple[str, ...]  # its checks' names, its own training reward first

    def tasks(self, split: str, categories: Sequence[str] = ()) -> list:
        """The tasks of one split ("train" | "test"), of `categories` (() = all)."""
        ...

    def task(self, task_id: str) -> Any: ...

    def episode(self, task: Any, protocol: str, step_limit: int = 20, worker=None) -> Episode:
        """An episode at no turn yet; its tool calls run in `worker` (None: a default one);
        at most `step_limit` model messages a turn."""
        ...

    def scorer(self, protocol: str, reward: str | None = None) -> Scorer:
        """The scorer of rollouts under `protocol`, training on the check `reward` names
        (rl.reward; None: the environment's own choice)."""
        ...

    def workers(self, k: int = 0) -> Workers:
        """k tool workers (0: the environment's choice), started on first use."""
        ...

    # -- the data stage ---------------------------------------------------------------------------
    def expert(self, task: Any, protocol: str, split: str) -> Any:
        """A correct trajectory of `task` (a scored rcgrpo.chat.record.Trajectory)."""
        ...

    def failures(
        self,
        task: Any,
        protocol: str,
        split: str,
        seed: int,
        kinds: Sequence[str] = (),
        attempts: int = 4,
        usable: Callable[[Any], bool] | None = None,
    ) -> list:
        """Scored failures made from the expert, at most one per failure kind (`kinds` () =
        all of the environment's), trying up to `attempts` candidates a kind; `usable` is the
        data stage's rule for a failure worth training on (rcgrpo.data.failures)."""
        ...

    def check_call(self, text: str) -> str | None:
        """Why a recorded call text is malformed (None: it parses)."""
        ...

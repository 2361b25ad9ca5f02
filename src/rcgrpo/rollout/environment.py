"""The environment seam: what the trainer, the evaluation and an agent loop need of a benchmark.

Three small protocols (typing.Protocol: structural, nothing to inherit) and one value type:

* `Environment` gives the tasks of a split, opens an `Episode` on one of them and builds the
  `Scorer` of a protocol and a training reward.
* `Episode` is one task in flight: `begin_turn` returns the next turn's user messages,
  `tool_docs` the tools callable now, `step(text)` parses and runs one model message (a result
  with `.calls` and `.observations`), `steps_left` how many messages the turn still allows.
* `Scorer` maps a finished rollout of a task to `Rewards`: the scalar the policy is trained on
  plus every named check (reported as metrics and evaluation columns under its name).

Why a `Rewards` and not a tuple: the trainer and the evaluation must not know how many checks a
benchmark has nor what they are called (BFCL: "paper" and "bfcl"; the toy calculator of the
tests: "correct" and "used_add"). BFCL is the one real implementation
(rcgrpo.rollout.bfcl_environment); tests/test_environment_seam.py runs the toy through the same
Trainer and evaluation. Design and how to add one: docs/environments.md.

    .venv/bin/pytest tests/test_environment_seam.py -q
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


class StepResult(Protocol):
    """What `Episode.step` returns: the calls it parsed and one observation per call/error."""

    calls: Sequence[Any]
    observations: Sequence[str]


@runtime_checkable
class Episode(Protocol):
    """One task in flight (rcgrpo.bfcl.environment.Episode is BFCL's)."""

    def begin_turn(self, turn: int | None = None) -> list[dict]: ...

    def tool_docs(self) -> list[dict]: ...

    def step(self, text: str) -> StepResult: ...

    @property
    def steps_left(self) -> int: ...


@runtime_checkable
class Scorer(Protocol):
    """score(task, rollout) -> Rewards; the rollout is what the engine returned for the task."""

    def __call__(self, task: Any, rollout: Any) -> Rewards: ...


@runtime_checkable
class Environment(Protocol):
    """A benchmark: its tasks (each with `.id` and `.category`), episodes and scorers."""

    name: str

    def tasks(self, split: str) -> list: ...

    def episode(self, task: Any, protocol: str) -> Episode: ...

    def scorer(self, protocol: str, reward: str | None = None) -> Scorer:
        """The scorer of rollouts under `protocol`, training on the check `reward` names
        (rl.reward; None: the environment's own choice)."""
        ...

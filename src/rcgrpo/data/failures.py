"""Failure trajectories (reward 0) from two sources, each recorded in provenance.generator.

(b) "perturbation:<kind>": an expert's calls changed the way real agents get them wrong, then
    re-executed and re-scored (rcgrpo.data.perturbations: the kinds); only reward-0
    trajectories are returned.
(a) "rollout": rollouts of the base policy through issue 3's engine (`rollout_failures`), kept
    when `refusal` finds nothing wrong: paper reward 0, an assistant message, and at least one
    call the executor parsed and dispatched (a random policy's prose is noise, not a failure of
    tool calling). Optional: perturbations alone give a full balanced set.
The same rule screens perturbations and, in the dataset build, every rollout given to the low half.

    .venv/bin/pytest tests/test_failures.py -q
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rcgrpo.bfcl.tasks import Task
from rcgrpo.chat.record import Trajectory
from rcgrpo.data.experts import DONE

if TYPE_CHECKING:
    from rcgrpo.models.profiles import ModelConfig

# Why a trajectory is refused as a low-reward example, in the order `refusal` checks them.
REFUSALS = ("reward_1", "no_assistant_message", "no_parsed_call", "empty_assistant_message")


def api_calls(record: Trajectory) -> list[str]:
    """The calls the executor parsed and dispatched, in order: every string of `record.calls`
    except done() (it ends a combined episode; it is no API call). A dispatched call may still
    have failed (unknown tool, wrong argument: an error observation); it counts, since a wrong
    call is exactly the failure RCTP-FT's low half should show."""
    return [c for turn in record.calls for step in turn for c in step if c != DONE]


def refusal(record: Trajectory) -> str | None:
    """Why `record` is no usable low-reward example (one of REFUSALS), or None if it is one.

    A usable failure is a failure *of tool calling* (paper: wrong tool, wrong or missing
    argument, premature stop). The first reason that applies is returned:
      reward_1                 paper reward is not 0: not a failure at all
      no_assistant_message     the policy said nothing (the prompt alone used the token budget)
      no_parsed_call           no call parsed and dispatched (`api_calls` is empty): prose or
                               garbage only, or a bare done(). It would teach <|low_reward|> to
                               mean "emit noise", not "make realistic mistakes"
      empty_assistant_message  an assistant message with neither text nor calls (the validation
                               suite's empty_assistant expectation refuses such rows too)
    Kept on purpose: a rollout whose last message is unparsable after some dispatched calls (the
    agent loop stops on it, reward_reason["stop"] == "no_calls"), and one cut by the step limit
    or token budget after some calls: both are the paper's "premature stop" failure.
    """
    assistant = [m for m in record.messages if m.get("role") == "assistant"]
    if record.paper_reward != 0:
        return "reward_1"
    if not assistant:
        return "no_assistant_message"
    if not api_calls(record):
        return "no_parsed_call"
    if not all(m.get("content") or m.get("tool_calls") for m in assistant):
        return "empty_assistant_message"
    return None


def is_usable_failure(record: Trajectory) -> bool:
    """True when `record` may be a low-reward row (`refusal` says why not)."""
    return refusal(record) is None


@dataclass
class RolloutReport:
    """Rollouts screened by `refusal`: the usable ones, and how many were refused and why."""

    records: list[Trajectory] = field(default_factory=list)  # usable failures, in order
    tried: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSALS, 0))
    model: dict | None = None  # {"profile", "path", "seed"} of the policy rolled out

    def add(self, record: Trajectory) -> bool:
        """Count `record`; keep it if it is a usable failure (returned True)."""
        self.tried += 1
        reason = refusal(record)
        if reason is None:
            self.records.append(record)
        else:
            self.refused[reason] += 1
        return reason is None

    def summary(self) -> dict:
        """The manifest's `rollouts` entry; tried == kept + sum(refused.values())."""
        return {
            "model": self.model,
            "tried": self.tried,
            "kept": len(self.records),
            "refused": dict(self.refused),
        }


def rollout_failures(
    tasks: list[Task],
    protocol: str,
    seed: int,
    model: ModelConfig,
    max_total_tokens: int = 0,
    backend=None,
) -> RolloutReport:
    """Usable failures (`refusal` is None) among rollouts of the base policy of `model`.

    `model` is loaded as given (profile, path, seed, dtype, device): the dataset build passes the
    policy's own params.yaml `model:` (dataset.rollout_model). One rollout per task, no reward
    goal (the base policy has never seen one), sampling seeded with `seed`. The split of each
    record comes from the committed split file. Raises ImportError (or the loader's error) when
    the engine or its model cannot be loaded; the caller decides whether that is an error
    (rollouts: "on") or a skip (rollouts: "auto"). max_total_tokens 0 = the profile's episode
    budget (a fixed small one would stop every full-docs prompt before its first token); 128
    tokens per message bound the base model's rambling (a cut message is no usable failure).
    """
    from rcgrpo.models.loading import load_policy
    from rcgrpo.rollout.engine import RolloutConfig
    from rcgrpo.rollout.execution import make_engine  # heavy: torch, transformers

    policy = load_policy(model)
    rollout_cfg = RolloutConfig(
        protocol=protocol, max_new_tokens=128, max_total_tokens=max_total_tokens
    )
    engine = make_engine(rollout_cfg, policy)
    if backend is not None:  # rcgrpo.rollout.execution: the same shards, local or on Ray workers
        from rcgrpo.rollout.execution import RolloutSpec

        engine = backend.engine(policy, RolloutSpec(model, None, rollout_cfg), local_engine=engine)
    report = RolloutReport(model={"profile": model.profile, "path": model.path, "seed": model.seed})
    for rollout in engine.rollout(list(tasks), reward_tokens=None, protocol=protocol, seed=seed):
        record = rollout.trajectory
        record.provenance.generator = "rollout"
        record.provenance.seed = seed
        report.add(record)
    return report

"""Failure trajectories (reward 0) from two sources, each recorded in provenance.generator.

(b) "perturbation:<kind>": an expert's calls changed the way real agents get them wrong, then
    re-executed and re-scored by the environment (`Environment.failures`; BFCL's kinds:
    rcgrpo.envs.bfcl.perturbations); only usable failures are kept (rcgrpo.data.generate).
(a) "rollout": rollouts of the base policy through the configured engine (`rollout_failures`:
    the `rollout:` section, engine and scheduler as configured, the profile's token budgets
    where it leaves them at 0), kept when `refusal` finds nothing wrong: reward 0, an
    assistant message, and at least one call the executor parsed and dispatched (a random
    policy's prose is noise, not a failure of tool calling). A first prompt over the episode
    budget is an error naming the budget (`RolloutBudgetError`), never a silent switch to
    perturbations; only an engine that is not installed (vLLM's venv cannot be had, or the
    engine's package is missing) is `EngineUnavailable` (the build's `rollouts: auto` skips on
    that alone, and the run's summary says so). A model that does not load, or a vLLM server
    that does not start, fails the stage. With vLLM the policy loads on the CPU: it is only
    exported for the servers. Optional: perturbations alone give a full balanced set.
The same rule screens perturbations and, in the dataset build, every rollout given to the low half.

    .venv/bin/pytest tests/test_failures.py -q
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rcgrpo.chat.record import Trajectory
from rcgrpo.config import ConfigError

if TYPE_CHECKING:
    from rcgrpo.models.profiles import ModelConfig


class RolloutBudgetError(ConfigError):
    """A base-policy rollout cannot start: its first prompt is over the episode budget."""


class EngineUnavailable(RuntimeError):
    """The rollout engine is not installed (`rollouts: auto` skips then, and says so)."""


def engine_missing(rollout) -> str | None:
    """Why the rollout section's engine cannot run here (not installed), or None."""
    import importlib.util

    if rollout.engine == "vllm":
        from rcgrpo.rollout.vllm_venv import vllm_missing

        return vllm_missing()
    if importlib.util.find_spec("transformers") is None:
        return "the transformers engine is not installed (no transformers package)"
    return None


# A call that ends an episode and acts on nothing (BFCL's combined protocol ends with it).
DONE = "done()"
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
      reward_1                 the reward is not 0: not a failure at all
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
    if record.reward != 0:
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
    settings: dict | None = None  # engine, scheduler, protocol and token budgets of the rollouts

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
        out = {
            "model": self.model,
            "tried": self.tried,
            "kept": len(self.records),
            "refused": dict(self.refused),
        }
        if self.settings is not None:
            out["settings"] = self.settings
        if self.tried and not self.records:
            out["note"] = (
                "the base policy produced no usable failure (every rollout refused: see "
                "refused); the low half is perturbations only"
            )
        return out


def rollout_failures(
    env,
    tasks: list,
    protocol: str,
    seed: int,
    model: ModelConfig,
    rollout=None,
    backend=None,
) -> RolloutReport:
    """Usable failures (`refusal` is None) among rollouts of the base policy of `model` on the
    tasks of `env` (the run's environment).

    `model` is loaded as given (profile, path, seed, dtype, device): the dataset build passes the
    policy's own params.yaml `model:` (dataset.rollout_model). `rollout`: the `rollout:` section
    (a RolloutConfig; None = its defaults), used as it is but for `protocol`: its engine and
    scheduler, and its token budgets, whose 0 means the profile's (`for_policy`). One rollout
    per task, no reward goal (the base policy has never seen one), sampling seeded with `seed`.
    Raises EngineUnavailable when the engine is not installed, RolloutBudgetError (naming the
    budget) when a first prompt leaves no room for a token; anything else (a model that does
    not load, a vLLM server that does not start) as it is.
    """
    from dataclasses import replace

    from rcgrpo.rollout.config import RolloutConfig

    rollout_cfg = replace(rollout or RolloutConfig(), protocol=protocol)
    if why := engine_missing(rollout_cfg):
        raise EngineUnavailable(why)
    from rcgrpo.models.device import for_engine
    from rcgrpo.models.loading import load_policy
    from rcgrpo.rollout.execution import make_engine  # heavy: torch, transformers

    policy = load_policy(for_engine(model, rollout_cfg.engine))
    engine = make_engine(rollout_cfg, policy, env)
    local = engine
    settings = {
        k: getattr(engine.cfg, k)
        for k in ("engine", "scheduler", "protocol", "max_new_tokens", "max_total_tokens")
    }
    report = RolloutReport(
        model={"profile": model.profile, "path": model.path, "seed": model.seed}, settings=settings
    )
    try:  # the engine (a vLLM server's GPU memory, tool workers) is released before training
        check_budget(engine, tasks, protocol, model.profile)
        if backend is not None:  # rcgrpo.rollout.execution: this process, or shards on Ray
            from rcgrpo.rollout.execution import RolloutSpec

            spec = RolloutSpec(model, None, rollout_cfg, env)
            engine = backend.engine(policy, spec, local_engine=engine)
        for rollout_ in engine.rollout(list(tasks), None, protocol, seed):
            record = rollout_.trajectory
            record.provenance.generator = "rollout"
            record.provenance.seed = seed
            report.add(record)
    finally:
        local.close()
    return report


def check_budget(engine, tasks: list, protocol: str, profile: str) -> None:
    """RolloutBudgetError when a task's first prompt (no reward goal) leaves no room for one
    sampled token in the engine's episode budget (rollout.max_total_tokens)."""
    budget = engine.cfg.max_total_tokens
    lengths = engine.prompt_lengths(tasks, None, protocol)
    over = [(n, t.id) for n, t in zip(lengths, tasks, strict=True) if n + 1 >= budget]
    if over:
        longest, task_id = max(over)
        raise RolloutBudgetError(
            f"dataset rollouts: {len(over)} of {len(tasks)} first prompts ({profile}, {protocol} "
            f"protocol) do not fit rollout.max_total_tokens = {budget} (longest: {task_id}, "
            f"{longest} tokens); raise it, or set it to 0 for the profile's budget"
        )

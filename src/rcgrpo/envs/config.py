"""The `env:` section of params.yaml: which environment the run trains and evaluates on
(`name`, rcgrpo.envs), and BFCL's sandbox limits: what one tool call, one model message and one
episode may cost in the tool sandbox (rcgrpo.bfcl.sandbox enforces them; rcgrpo.bfcl.environment
keeps the episode's account).

Why budgets per message and per episode on top of the per-call limit: one message may hold 64
calls, each just under the call limit (`[power(base=3, exponent=12000000)] x 20` took 103 s at
2.6 s a call), and an episode holds up to 20 messages a turn. Calls left when a budget runs out
are answered "not run: time budget" and never run; the call running at that moment is stopped.
The defaults are far above what a task needs: all 800 ground truths run in ~1 min in one process
(75 ms a task), and the slowest legitimate call is far under a second. All three are in the
worker's own time of the model's calls (rcgrpo.bfcl.progress.OwnClock: wall time less waits for
a CPU): a busy box, a worker's start and the replay that rebuilds a killed one spend none of it.

    rcgrpo config show env
"""

from __future__ import annotations

import importlib
from typing import Literal

from rcgrpo.bfcl.observations import DEFAULT_MAX_CHARS
from rcgrpo.fields import config_class, ranged, setting

# name -> "module:class" of every environment (rcgrpo.envs.get builds it from this section)
ENVIRONMENTS = {
    "bfcl": "rcgrpo.envs.bfcl.environment:BfclEnvironment",
    "calculator": "rcgrpo.envs.calculator:Calculator",
    "memory": "rcgrpo.envs.memory:Memory",
}


@config_class
class EnvConfig:
    """params.yaml `env:` — the environment, and BFCL's tool-call limits (rcgrpo.bfcl.sandbox)."""

    name: Literal[tuple(ENVIRONMENTS)] = setting(
        "bfcl", "the environment of the run's data, RL and evaluation (rcgrpo.envs)"
    )
    tool_timeout_s: float = ranged(
        5.0, "(0, inf)", "limit of one tool call's own time (wall less CPU waits); then SIGKILL"
    )
    tool_memory_mb: int = ranged(
        4096, "[256, inf)", "address-space limit (RLIMIT_AS) of the tool worker process"
    )
    max_observation_chars: int = ranged(
        DEFAULT_MAX_CHARS,
        "[256, inf)",
        "a tool observation is cut to this many characters in the worker (+ a marker)",
    )
    message_timeout_s: float = ranged(
        30.0, "(0, inf)", "tool time of one model message; calls left then are not run"
    )
    episode_timeout_s: float = ranged(
        300.0, "(0, inf)", "tool time of one episode; calls left then are not run"
    )

    def __post_init__(self):
        if (hard := hard_memory_mb()) is not None and self.tool_memory_mb > hard:
            raise ValueError(  # a worker cannot raise its limit above the hard one: every call failed
                f"env.tool_memory_mb={self.tool_memory_mb} is above this process's hard "
                f"address-space limit of {hard} MiB (ulimit -v); set env.tool_memory_mb <= {hard}"
            )


def hard_memory_mb() -> int | None:
    """The hard RLIMIT_AS in MiB, None when unlimited (or not on this platform)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return None if hard == resource.RLIM_INFINITY else hard // 2**20


def environment_class(name: str):
    """The class `ENVIRONMENTS[name]` names (imported; nothing built)."""
    module, attr = ENVIRONMENTS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def check_sections(sections: dict) -> None:
    """A run's sections against its environment, before anything starts (a ValueError in one
    line naming the field): the protocols it renders, its categories, failure kinds and checks.
    sections: {"env": EnvConfig, "rollout": .., "rl": .., "dataset": .., "eval": ..}."""
    env = environment_class(sections["env"].name)
    own = f"(env.name={sections['env'].name}: its {{}} are {{}})"
    wanted = [
        ("protocols", env.protocols, f"{s}.protocol", [sections[s].protocol])
        for s in ("rollout", "rl", "dataset")
    ]
    wanted += [
        ("protocols", ("trained", *env.protocols), "eval.protocol", [sections["eval"].protocol]),
        ("categories", env.categories, "dataset.categories", sections["dataset"].categories),
        (
            "categories",
            env.categories,
            "dataset.train_categories",
            sections["dataset"].train_categories,
        ),
        ("categories", env.categories, "eval.categories", sections["eval"].categories),
        ("failure kinds", ("all", *env.kinds), "dataset.kinds", sections["dataset"].kinds),
        ("checks", ("", *env.checks), "rl.reward", [sections["rl"].reward]),
    ]
    for what, allowed, field, values in wanted:
        if bad := [v for v in values if v not in allowed]:
            shown = ", ".join(repr(a) for a in allowed)
            raise ValueError(f"{field}={bad[0]!r}: not one of its " + own.format(what, shown))

"""The environments a run trains and evaluates on, by name: params.yaml `env.name` picks one
(`get`), and the data stage, fine-tuning, RL and the evaluation take it from the run. Each one
implements the protocols of rcgrpo.rollout.environment; adding one is a module and a line in
rcgrpo.envs.config.ENVIRONMENTS (docs/environments.md).

    from rcgrpo.envs import get
    env = get(rc.env)                 # the run's `env:` section -> an Environment

Imports: bfcl, chat, config, fields, rollout.
"""

from __future__ import annotations

import importlib

from rcgrpo.envs.config import ENVIRONMENTS, EnvConfig


def get(cfg: EnvConfig | None = None):
    """The environment `cfg.name` names, built from `cfg` (the run's `env:` section; None:
    params.yaml's)."""
    if cfg is None:
        from rcgrpo.config import load_section

        cfg = load_section("env", EnvConfig)
    if cfg.name not in ENVIRONMENTS:
        raise ValueError(f"env.name={cfg.name!r}: one of {', '.join(ENVIRONMENTS)}")
    module, name = ENVIRONMENTS[cfg.name].split(":")
    return getattr(importlib.import_module(module), name)(cfg)

"""The tool-call limits this process's sandbox workers run under: the run's `env:` section.

The run's environment hands its resolved `env:` section over once (`use`), before any worker
starts; everything that starts a worker without a run (a checker called from a script, a test)
takes params.yaml's `env:` of the checkout, or the defaults (`configured`). Kept apart from the
worker's process handling (rcgrpo.bfcl.sandbox), which takes the section it is given.

    from rcgrpo.bfcl.limits import configured; print(configured().tool_timeout_s)
"""

from __future__ import annotations

import functools

from rcgrpo.bfcl.observations import set_max_chars
from rcgrpo.config import section_class

_chosen: list = []  # the run's `env:` section, set once by the run's environment


def use(cfg) -> None:
    """Make `cfg` (a resolved run's `env:`) what this process's tool workers run under; call
    before the first sandbox starts (each thread keeps the one it started). Episodes run in
    this process (no worker) cut their observations at the same size."""
    _chosen[:] = [cfg]
    set_max_chars(cfg.max_observation_chars)


def configured():
    """The run's `env:` (`use`), else params.yaml `env:` of the checkout, else the defaults."""
    return _chosen[0] if _chosen else _from_params()


@functools.cache
def _from_params():
    """params.yaml `env:` (its class found by name, rcgrpo.config.SECTIONS: the section is the
    run's, above this package), or its defaults without a params.yaml."""
    from rcgrpo.config import ConfigError, load_section

    try:
        return load_section("env", section_class("env"))
    except ConfigError as e:
        if "not found" in str(e):
            return section_class("env")()
        raise

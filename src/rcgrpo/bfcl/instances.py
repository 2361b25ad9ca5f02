"""BFCL's API classes as an episode holds them: fresh instances loaded with a task's initial
config, their public methods (what a model may call), and their public state (what the state
checker compares).

Why instances are unpickled from a memoised blob rather than built: `_load_scenario`
deep-copies large default states, and a fresh instance per episode (thousands per RL step) from
pickled bytes is a fraction of that cost, in the same state, RNGs included.

    .venv/bin/pytest tests/test_sandbox.py -q
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pickle

from rcgrpo.bfcl.tasks import Task


@functools.cache
def backend():
    """bfcl-eval's class -> module map and stateless classes (imported once, read-only)."""
    from bfcl_eval.constants.executable_backend_config import (
        CLASS_FILE_PATH_MAPPING,
        STATELESS_CLASSES,
    )

    return CLASS_FILE_PATH_MAPPING, frozenset(STATELESS_CLASSES)


@functools.cache
def public_method_names(cls: type) -> tuple[str, ...]:
    """Public methods of an API class, as bfcl-eval lists them (no leading underscore)."""
    return tuple(
        name
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    )


@functools.lru_cache(maxsize=4096)
def _loaded_instance_blob(task: Task, class_name: str) -> bytes:
    """One instance of `class_name` loaded with the task's initial_config, pickled.

    Unpickling gives a fresh, independent instance in the same state as a new `cls()` +
    `_load_scenario(deepcopy(config))` (the API classes are plain objects, their RNGs included),
    at a fraction of the cost: `_load_scenario` deep-copies large default states. The task's
    own config dict is never handed to API code. Memoised: immutable bytes.
    """
    modules, stateless = backend()
    instance = getattr(importlib.import_module(modules[class_name]), class_name)()
    if class_name not in stateless:
        config = pickle.loads(pickle.dumps(task.initial_config.get(class_name, {})))
        instance._load_scenario(config, long_context=task.long_context)
    return pickle.dumps(instance, protocol=pickle.HIGHEST_PROTOCOL)


def new_instances(task: Task) -> dict[str, object]:
    """Fresh instances of the task's involved classes, loaded with its initial_config."""
    return {name: pickle.loads(_loaded_instance_blob(task, name)) for name in task.involved_classes}


def public_state(instance: object) -> dict:
    """The attributes bfcl-eval's state checker compares (all not starting with `_`)."""
    return {k: v for k, v in vars(instance).items() if not k.startswith("_")}

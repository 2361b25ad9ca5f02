"""One BFCL multi-turn episode: fresh API instances, turn bookkeeping, and safe execution.

An `Episode` owns fresh instances of the task's involved API classes, imported from bfcl-eval
(never copied) and loaded with the task's `initial_config` (`long_context=True` for the
long_context category), so state carries across turns and nothing is shared between episodes:
thousands of episodes can live at once, in several threads. There is no module-level mutable
state; the only memo is the per-class list of public method names.

In miss_func tasks a held-out function is unavailable (not in the tool docs, and a call to it is
an error observation) until the turn that reveals it; that turn's user message is BFCL's
"I have updated some more functions ..." prompt. A turn allows at most `step_limit` model steps
(BFCL: 20).

    from rcgrpo.bfcl.environment import Episode
    from rcgrpo.bfcl.tasks import get_task
    ep = Episode(get_task("multi_turn_base_0"))
    ep.begin_turn()                      # -> the user messages of turn 0
    ep.step("cd(folder='document')")     # -> Step(calls=[...], observations=[...])
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field

from rcgrpo.bfcl.executor import Call, Parsed, dispatch, parse_calls
from rcgrpo.bfcl.tasks import REVEAL_MESSAGE, Task

STEP_LIMIT = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT


@functools.cache
def _backend():
    """bfcl-eval's class -> module map and stateless classes (imported once, read-only)."""
    from bfcl_eval.constants.executable_backend_config import (
        CLASS_FILE_PATH_MAPPING,
        STATELESS_CLASSES,
    )

    return CLASS_FILE_PATH_MAPPING, frozenset(STATELESS_CLASSES)


@functools.cache
def _public_method_names(cls: type) -> tuple[str, ...]:
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
    modules, stateless = _backend()
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


@dataclass
class Step:
    """One model step: what was parsed and what each call returned."""

    calls: list[Call]
    observations: list[str]  # one per call, then one per parse error
    ok: list[bool]  # per call: dispatched and raised nothing
    parse_errors: list[str] = field(default_factory=list)

    @property
    def attempted(self) -> bool:
        return bool(self.calls or self.parse_errors)


class Episode:
    """Fresh API instances for one task plus the turn and step bookkeeping of the agent loop.

    hide_missed: hold back miss_func functions until their reveal turn (the interaction rule);
        the checkers replay with False, as bfcl-eval's executor does.
    """

    def __init__(self, task: Task, *, hide_missed: bool = True, step_limit: int = STEP_LIMIT):
        self.task = task
        self.hide_missed = hide_missed
        self.step_limit = step_limit
        self.instances = new_instances(task)
        # name -> bound method; a later class wins a name clash, as in bfcl-eval (none occur).
        self._all: dict[str, Callable] = {
            name: getattr(instance, name)
            for instance in self.instances.values()
            for name in _public_method_names(type(instance))
        }
        self._reveal_turn = task.hidden_before()
        self.turn = -1
        self.steps_in_turn = 0

    # -- turns ------------------------------------------------------------------------------
    @property
    def n_turns(self) -> int:
        return len(self.task.turns)

    def begin_turn(self, turn: int | None = None) -> list[dict]:
        """Advance to `turn` (default: the next one) and return its user messages."""
        self.turn = self.turn + 1 if turn is None else turn
        if not 0 <= self.turn < self.n_turns:
            raise IndexError(f"{self.task.id} has turns 0..{self.n_turns - 1}, not {self.turn}")
        self.steps_in_turn = 0
        messages = list(self.task.turns[self.turn])
        if not messages and self.turn in self._reveal_turn.values():
            messages = [{"role": "user", "content": REVEAL_MESSAGE}]
        return messages

    def revealed_now(self) -> list[str]:
        """Function names that become available at the current turn (miss_func)."""
        return sorted(n for n, t in self._reveal_turn.items() if t == self.turn)

    def available(self) -> dict[str, Callable]:
        """Functions callable now: everything, minus miss_func functions not yet revealed."""
        if not self.hide_missed:
            return self._all
        hidden = {n for n, t in self._reveal_turn.items() if self.turn < t}
        return {n: m for n, m in self._all.items() if n not in hidden}

    def tool_docs(self) -> list[dict]:
        """BFCL docs of the functions available now (the tool list shown to the model)."""
        names = self.available()
        return [doc for doc in self.task.function_docs if doc["name"] in names]

    @property
    def steps_left(self) -> int:
        return self.step_limit - self.steps_in_turn

    # -- acting -------------------------------------------------------------------------------
    def step(self, text_or_calls: str | list[Call]) -> Step:
        """Parse (if text) and execute one model step; counts against the turn's step limit."""
        parsed = (
            parse_calls(text_or_calls)
            if isinstance(text_or_calls, str)
            else Parsed(list(text_or_calls), [])
        )
        self.steps_in_turn += 1
        functions = self.available()
        observations, ok = [], []
        for call in parsed.calls:
            ran, observation = dispatch(call, functions)
            observations.append(observation)
            ok.append(ran)
        observations += [f"Error: could not parse tool call: {e}" for e in parsed.errors]
        return Step(parsed.calls, observations, ok, parsed.errors)

    def state(self) -> dict[str, dict]:
        """Public state of every involved instance (live objects: copy before keeping)."""
        return {name: public_state(inst) for name, inst in self.instances.items()}

"""One BFCL multi-turn episode: fresh API instances, turn bookkeeping, and safe execution.

An episode owns fresh instances of the task's involved API classes, imported from bfcl-eval
(never copied) and loaded with the task's `initial_config` (`long_context=True` for the
long_context category), so state carries across turns and nothing is shared between episodes:
thousands of episodes can live at once, in several threads. There is no module-level mutable
state; the only memo is the per-class list of public method names.

`Episode` (what everything outside the sandbox uses) keeps its instances in a sandbox worker
process (rcgrpo.bfcl.sandbox), where each call runs under a time and a memory limit;
`LocalEpisode` holds them in this process and is what that worker (and the checkers' replay in
it) runs.

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

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rcgrpo.bfcl.dispatch import dispatch
from rcgrpo.bfcl.executor import Call, Parsed, parse_calls
from rcgrpo.bfcl.instances import backend, new_instances, public_method_names, public_state
from rcgrpo.bfcl.observations import shown, valid_utf8
from rcgrpo.bfcl.progress import OUT_OF_TIME
from rcgrpo.bfcl.tasks import REVEAL_MESSAGE, Task

STEP_LIMIT = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
STEP_ENDED = "Error during execution: not run (an earlier call of this step overran its limit)"


@dataclass
class Step:
    """One model step: what was parsed and what each call returned."""

    calls: list[Call]
    observations: list[str]  # one per call, then one per parse error
    ok: list[bool]  # per call: dispatched and raised nothing
    parse_errors: list[str] = field(default_factory=list)
    overran: list[bool] = field(default_factory=list)  # per call: killed by a limit (no effect)
    # per call: handed to the tool and not killed (what ran, so what the checkers replay)
    executed: list[bool] = field(default_factory=list)
    # per call: wall seconds in the tool worker (guard + dispatch; 0.0 for one refused here)
    seconds: list[float] = field(default_factory=list)

    @property
    def attempted(self) -> bool:
        return bool(self.calls or self.parse_errors)


class _Turns:
    """The turn and step bookkeeping of the agent loop (shared by both episode kinds).

    hide_missed: hold back miss_func functions until their reveal turn (the interaction rule);
        the checkers replay with False, as bfcl-eval's executor does.
    """

    _all: dict[str, Callable]  # name -> callable of the involved classes

    def __init__(self, task: Task, *, hide_missed: bool = True, step_limit: int = STEP_LIMIT):
        self.task = task
        self.hide_missed = hide_missed
        self.step_limit = step_limit
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

    def _parse(self, text_or_calls: str | list[Call]) -> Parsed:
        self.steps_in_turn += 1  # every model step counts against the turn's step limit
        if isinstance(text_or_calls, str):
            return parse_calls(text_or_calls)
        return Parsed(list(text_or_calls), [])


class LocalEpisode(_Turns):
    """Fresh API instances in *this* process: what the sandbox worker runs (rcgrpo.bfcl.sandbox).

    `guard`, when set, is called before each dispatch and may answer the call itself (an
    observation string) instead of running it: the worker uses it to time calls and to skip
    the one that overran in a killed worker.
    """

    def __init__(self, task: Task, *, hide_missed: bool = True, step_limit: int = STEP_LIMIT):
        super().__init__(task, hide_missed=hide_missed, step_limit=step_limit)
        self.instances = new_instances(task)
        self.guard: Callable[[], str | None] | None = None
        # name -> bound method; a later class wins a name clash, as in bfcl-eval (none occur).
        self._all = {
            name: getattr(instance, name)
            for instance in self.instances.values()
            for name in public_method_names(type(instance))
        }

    def step(self, text_or_calls: str | list[Call]) -> Step:
        """Parse (if text) and execute one model step."""
        parsed = self._parse(text_or_calls)
        functions = self.available()
        observations, ok, overran, seconds = [], [], [], []
        for call in parsed.calls:
            started = time.perf_counter()
            answer = self.guard() if self.guard is not None else None
            if any(overran) and answer is None:  # one overrun ends the step: a message of 64
                answer = STEP_ENDED  # hostile calls must not cost 64 limits
            overran.append(answer is not None)
            try:
                ran, observation = (False, answer) if answer else dispatch(call, functions)
            except MemoryError:
                from rcgrpo.bfcl.progress import out_of_memory

                out_of_memory()  # in a worker: report and exit (the parent restores the state)
            observations.append(shown(observation))
            ok.append(ran)
            seconds.append(time.perf_counter() - started)
        observations += [shown(f"Error: could not parse tool call: {e}") for e in parsed.errors]
        executed = [
            c.name in functions and not o for c, o in zip(parsed.calls, overran, strict=True)
        ]
        return Step(parsed.calls, observations, ok, parsed.errors, overran, executed, seconds)

    def state(self) -> dict[str, dict]:
        """Public state of every involved instance (live objects: copy before keeping)."""
        return {name: public_state(inst) for name, inst in self.instances.items()}


class Episode(_Turns):
    """One episode whose calls run in a sandbox worker, under its time and memory limits.

    The API instances live in the worker; this object keeps the turn bookkeeping and the log of
    executed calls, from which a replacement worker rebuilds the state after a kill. A call that
    overruns gets "Error during execution: timed out after Xs" (or "... out of memory") and
    leaves the state as it was before it. `state()` and `instances` are copies from the worker.
    """

    def __init__(
        self,
        task: Task,
        *,
        hide_missed: bool = True,
        step_limit: int = STEP_LIMIT,
        sandbox=None,
    ):
        from rcgrpo.bfcl import sandbox as sandboxes

        super().__init__(task, hide_missed=hide_missed, step_limit=step_limit)
        modules, _ = backend()
        classes = [getattr(importlib.import_module(modules[n]), n) for n in task.involved_classes]
        # name -> the class's function (membership and signatures; nothing runs here)
        self._all = {n: getattr(c, n) for c in classes for n in public_method_names(c)}
        self.sandbox = sandbox or sandboxes.default()
        self._id = self.sandbox.register(self)
        self._log: list[Call] = []  # every call executed so far, replayed into a new worker
        self.tool_seconds = 0.0  # tool time spent by the model's messages (env.episode_timeout_s)

    def _run(self, calls: list[Call], want: str | None = None):
        if want is not None:  # a state or instances read: no model call, no budget
            return self.sandbox.run_step(self._id, self.task, self._log, calls, want)
        cfg = self.sandbox.config
        budget = min(cfg.message_timeout_s, cfg.episode_timeout_s - self.tool_seconds)
        if budget <= 0:  # the episode's tool time is spent: nothing more runs
            n = len(calls)
            return [OUT_OF_TIME] * n, [False] * n, None, [True] * n, [0.0] * n
        observations, ok, extra, overran, seconds, spent = self.sandbox.run_step(
            self._id, self.task, self._log, calls, None, budget
        )
        self.tool_seconds += spent
        self._log += [c for c, o in zip(calls, overran, strict=True) if not o]
        return observations, ok, extra, overran, seconds

    def step(self, text_or_calls: str | list[Call]) -> Step:
        """Parse (if text) and execute one model step in the worker."""
        parsed = self._parse(text_or_calls)
        functions = self.available()
        runnable = [c for c in parsed.calls if c.name in functions and not c.name.startswith("_")]
        observations, ok, _, overran, seconds = (
            self._run(runnable) if runnable else ([], [], None, [], [])
        )
        results = iter(zip(observations, ok, overran, seconds, strict=True))
        step = Step(parsed.calls, [], [], parsed.errors)
        for call in parsed.calls:
            if call.name in functions and not call.name.startswith("_"):
                observation, ran, overran, took = next(results)
            else:  # the same refusal as dispatch gives, without a round trip
                observation = f"Error during execution: function {call.name!r} is not available"
                ran, overran, took = False, False, 0.0
            step.observations.append(valid_utf8(observation))  # the worker cut it to size
            step.ok.append(ran)
            step.overran.append(overran)
            step.executed.append(call.name in functions and not overran)
            step.seconds.append(took)
        step.observations += [
            shown(f"Error: could not parse tool call: {e}") for e in parsed.errors
        ]
        return step

    def state(self) -> dict[str, dict]:
        """Public state of every involved instance (a copy from the worker)."""
        return self._run([], "state")[2]

    @property
    def instances(self) -> dict[str, object]:
        """Copies of the worker's API instances (for inspection)."""
        return self._run([], "instances")[2]

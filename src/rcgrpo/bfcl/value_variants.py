"""Templated value variants of a BFCL task: the same scenario with fresh literal values.

A held-out endpoint a small model can reach: train on a task's own values, evaluate on values it
never saw (a policy that copies the request's values passes, one that memorised them fails).

Which literals: a gold call's string argument (or list element) of >= 3 characters that also
appears in the user text as a whole word, i.e. a value the model must copy from the request
(ISO dates excepted: random digits make no date).
Each gets a fresh value of the same shape (a letter becomes a random letter of the same case, a
digit a random digit; other characters and a file extension stay), substituted consistently in
the user text, the gold calls and the initial state (dict keys and string values, also inside
longer strings: a file whose content quotes a name moves with it). Numbers stay as they are:
derived values (a share price times 10 in `fund_account`) would no longer follow them.

A substitution is kept only if the variant's gold calls replay with no error observation (a
travel class outside the API's set) and each call answers what it answered in the task, with
the same values replaced (a fresh city the travel API maps to no airport would leave the gold
`travel_from` unexplained): literals are tried one at a time and kept while that holds. A
variant with no literal kept is not made.
Variants are `Task`s with the id `<task id>_v<k>` (category and number of the task; an identifier,
as bfcl-eval's executor names instances after it), registered
with `rcgrpo.bfcl.tasks.register` so `get_task`, both checkers and the conformance check take
them as they take BFCL's own.

    .venv/bin/python -c "from rcgrpo.bfcl.value_variants import *; from rcgrpo.bfcl.tasks import get_task; print(variants(get_task('multi_turn_base_11'), 1)[0].turns)"
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
import string

from rcgrpo.bfcl.executor import Call
from rcgrpo.bfcl.replay import parse_call_string
from rcgrpo.bfcl.tasks import Task, register

MIN_CHARS = 3  # shorter literals ('a', 'c' of wc's mode) would match inside ordinary words
DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")  # left alone, like numbers: random digits are no date


def _strings(value) -> list[str]:
    """The string literals of an argument value (a list's elements too)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _word(value: str) -> re.Pattern:
    return re.compile(rf"(?<!\w){re.escape(value)}(?!\w)")


def _text(task: Task) -> str:
    return "\n".join(m["content"] for turn in task.turns for m in turn)


def shared_literals(task: Task) -> list[str]:
    """The gold calls' string literals (>= MIN_CHARS) that the user text holds as a whole word,
    in order of first use, each once."""
    text, found = _text(task), {}
    for turn in task.ground_truth:
        for text_call in turn:
            call = parse_call_string(text_call)
            for value in (*call.args, *call.kwargs.values()):
                for s in _strings(value):
                    if len(s) >= MIN_CHARS and not DATE.match(s) and _word(s).search(text):
                        found.setdefault(s, None)
    return list(found)


def fresh_value(value: str, rng: random.Random) -> str:
    """A random value of `value`'s shape: letters keep their case, digits stay digits, other
    characters and a short file extension (".txt") stay; never `value` itself."""
    stem, ext = value, ""
    if re.search(r"\.[A-Za-z0-9]{1,4}\Z", value) and not value.startswith("."):
        stem, ext = value.rsplit(".", 1)[0], "." + value.rsplit(".", 1)[1]
    for _ in range(100):
        out = "".join(
            rng.choice(string.ascii_uppercase)
            if c.isupper()
            else rng.choice(string.ascii_lowercase)
            if c.islower()
            else rng.choice(string.digits)
            if c.isdigit()
            else c
            for c in stem
        )
        if out + ext != value:
            return out + ext
    raise ValueError(f"no fresh value for {value!r}: it has no letter or digit to change")


def substitute(obj, mapping: dict[str, str]):
    """`obj` (str, list, tuple, dict: keys too) with every whole-word occurrence of a key of
    `mapping` replaced by its value, in one pass (a new value is never replaced again)."""
    if not mapping:
        return obj
    pattern = re.compile(
        "|".join(rf"(?<!\w){re.escape(k)}(?!\w)" for k in sorted(mapping, key=len, reverse=True))
    )

    def go(x):
        if isinstance(x, str):
            return pattern.sub(lambda m: mapping[m.group(0)], x)
        if isinstance(x, dict):
            return {go(k): go(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return type(x)(go(v) for v in x)
        return x

    return go(obj)


def _call(text: str, mapping: dict[str, str]) -> str:
    call = parse_call_string(text)
    return str(Call(call.name, substitute(call.args, mapping), substitute(call.kwargs, mapping)))


def with_values(task: Task, mapping: dict[str, str], variant_id: str) -> Task:
    """`task` with `mapping` applied to its user text, gold calls and initial state."""
    turns = tuple(
        [{**m, "content": substitute(m["content"], mapping)} for m in turn] for turn in task.turns
    )
    truth = tuple([_call(c, mapping) for c in turn] for turn in task.ground_truth)
    config = substitute(json.loads(json.dumps(task.initial_config)), mapping)
    return dataclasses.replace(
        task, id=variant_id, turns=turns, ground_truth=truth, initial_config=config
    )


def is_error(ok: bool, observation: str) -> bool:
    """A tool answer that reports a failure: a raised error, or BFCL's {"error": ...} dict."""
    if not ok or observation.startswith("Error"):
        return True
    try:
        answer = json.loads(observation)
    except ValueError:
        return False
    return isinstance(answer, dict) and "error" in answer


def replay(task: Task) -> list[str] | None:
    """The observations of the task's gold calls, turn by turn in fresh instances; None if one
    of them is an error."""
    from rcgrpo.bfcl.environment import LocalEpisode

    episode = LocalEpisode(task, hide_missed=False, step_limit=10_000)
    seen: list[str] = []
    for turn, calls in enumerate(task.ground_truth):
        episode.begin_turn(turn)
        if not calls:
            continue
        step = episode.step([parse_call_string(c) for c in calls])
        if any(is_error(ok, o) for ok, o in zip(step.ok, step.observations, strict=True)):
            return None
        seen += step.observations
    return seen


def replays_clean(task: Task) -> bool:
    """Do the task's gold calls get no error observation?"""
    return replay(task) is not None


def variant(task: Task, k: int, seed: int = 0) -> Task | None:
    """Variant k (1, 2, ...) of `task` (its literals' fresh values drawn from (seed, task, k)),
    or None when no shared literal can take a fresh value: one whose gold calls replay with no
    error and answer what the task's answer, with the same values replaced (a fresh city the
    travel API maps to another airport, or to none, is refused)."""
    rng = random.Random(f"{seed}:{task.id}:{k}")
    original = replay(task)
    if original is None:
        return None
    kept: dict[str, str] = {}
    for literal in sorted(shared_literals(task), key=len):  # a sentence after the names in it
        inner = substitute(literal, kept)  # "price of XTC is ..." keeps XTC's fresh value
        trial = {**kept, literal: inner if inner != literal else fresh_value(literal, rng)}
        if replay(with_values(task, trial, f"{task.id}_v{k}")) == substitute(original, trial):
            kept = trial
    return with_values(task, kept, f"{task.id}_v{k}") if kept else None


@functools.cache
def variants(task: Task, n: int, seed: int = 0, first: int = 1) -> tuple[Task, ...]:
    """Variants first .. first + n - 1 of `task` that could be made, registered as tasks."""
    made = [variant(task, k, seed) for k in range(first, first + n)]
    return register([v for v in made if v is not None])

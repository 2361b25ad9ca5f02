"""Does the replay that scores an episode see what the live episode ran? And the hostile family.

`live_vs_replay` feeds each model step of a trajectory as one message text to a live `Episode`
(sandbox worker, the agent loop's path), keeps the call strings of the calls that ran (what the
agent loop stores), replays those strings as the checkers do (`replay.replay_step` in a fresh
`LocalEpisode`) and compares every call's observation and the final state. `hostile_family`
builds messages that a policy under RL pressure finds: JSON argument keys that spell code
(quotes, `)`, `#`, `**`, `=`), non-ASCII and surrogate keys, names that spell calls, NaN/inf
anywhere in the arguments, unhashable literals. Run over the conformance trajectories too:

    .venv/bin/python scripts/conformance.py --perturbations 3
"""

from __future__ import annotations

import json
from collections import Counter

from rcgrpo.bfcl.environment import Episode, LocalEpisode
from rcgrpo.bfcl.replay import parse_call_string, replay_step
from rcgrpo.bfcl.tasks import Task


def _injected(call: str) -> str:
    """`mv(source='a', destination='b')` as a JSON call whose one key spells those arguments:
    before canonical call strings, the stored string re-parsed as the real call."""
    parsed = parse_call_string(call)
    inner = ", ".join(f"{k}={v!r}" for k, v in parsed.kwargs.items())
    key = f"{inner}) #" if inner else "x) #"
    return json.dumps({"name": parsed.name, "arguments": {key: 0}})


def hostile_texts(call: str) -> list[str]:
    """Hostile relatives of one well-formed ground-truth call string (each one model message)."""
    parsed = parse_call_string(call)
    name, kwargs = parsed.name, dict(parsed.kwargs)
    first = next(iter(kwargs), "x")

    def as_json(arguments, fn=name) -> str:
        return json.dumps({"name": fn, "arguments": arguments}, allow_nan=True)

    return [
        _injected(call),
        as_json({f"{first}'": kwargs.get(first, 0)}),  # a quote in the key
        as_json({f"**{first}": kwargs.get(first, 0)}),  # `**` in the key
        as_json({f"{first}=1, {first}": kwargs.get(first, 0)}),  # `=` in the key
        as_json({f"{first}é": 1}),  # non-ASCII key
        as_json({"\ud800": 1}),  # lone surrogate key
        as_json({"ﬁle_name": 1}),  # NFKC folds it to file_name in Python syntax
        as_json({first: float("nan")}),
        as_json({first: [1, float("inf")]}),
        as_json({first: {"a": [float("-inf")]}}),
        as_json(kwargs, fn=f"{name}({first}=1) #"),  # a name that spells a call
        f"{name}({first}=1e999)",
        f"{name}({first}={{[1]}})",
        f"{name}({first}={{[1]: 2}})",
        f"{name}({first}={{{{}}: 2}})",
    ]


def hostile_family(tasks: list[Task]) -> list[tuple[Task, str, list[list[list[str]]]]]:
    """(task, "hostile", messages per turn per step): every ground-truth call of each task
    replaced by each hostile relative in turn, one message per step."""
    out = []
    for task in tasks:
        for variant in range(15):
            turns = [[[hostile_texts(c)[variant]] for c in turn] for turn in task.ground_truth]
            out.append((task, "hostile", turns))
    return out


def live_vs_replay(task: Task, messages: list[list[list[str]]], sandbox=None) -> str:
    """'' when the live episode and the scoring replay agree on every call's observation and
    on the final state; else what differs. `messages`: per turn, per step, texts joined into
    one message (a python list of calls, or one JSON call)."""
    live = Episode(task, hide_missed=False, sandbox=sandbox)
    replay = LocalEpisode(task, hide_missed=False)
    results: Counter[str] = Counter()
    for turn, steps in enumerate(messages):
        live.begin_turn(turn)
        replay.begin_turn(turn)
        for texts in steps:
            text = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
            step = live.step(text)
            ran = [i for i, e in enumerate(step.executed) if e]
            stored = [str(step.calls[i]) for i in ran]
            parsed_texts, again = replay_step(replay, stored, results)
            seen = [step.observations[i] for i in ran]
            if parsed_texts != stored or again.observations != seen:
                return f"turn {turn}: live {seen!r} but replay {again.observations!r}"
    if live.state() != replay.state():
        return "final states differ"
    return ""

"""Hostile call texts execute nothing: each yields an error observation and changes no state.

The canary file is what each attack would create if any text reached eval/exec, the os module,
a private method or a class the task does not involve.
"""

import copy
import os
import threading

import pytest

from rcgrpo.bfcl.environment import Episode
from rcgrpo.bfcl.tasks import get_task

CANARY = "/tmp/rcgrpo_canary_{}"

HOSTILE = [
    # imports and builtins
    "__import__('os').system('touch {canary}')",
    "import os; os.system('touch {canary}')",
    "exec(\"open('{canary}', 'w')\")",
    "eval(\"__import__('os').system('touch {canary}')\")",
    "open('{canary}', 'w')",
    "compile('1', 'x', 'exec')",
    "breakpoint()",
    "exit()",
    "globals()",
    # dunder attribute chains
    "ls.__globals__['os'].system('touch {canary}')",
    "().__class__.__bases__[0].__subclasses__()",
    "cd.__self__._load_scenario({{}})",
    "ls.__func__.__code__",
    "cd(folder=ls.__globals__)",
    # lambdas, comprehensions, f-strings, operators, starred, walrus
    "cd(folder=(lambda: __import__('os').system('touch {canary}'))())",
    "cd(folder=[x for x in 'abc'])",
    "[ls() for _ in range(3)]",
    "cd(folder=f\"{{__import__('os').system('touch {canary}')}}\")",
    "cd(folder='a' * 10**9)",
    "mean(numbers=[9**9**9])",
    "cd(*['document'])",
    "cd(**{{'folder': 'document'}})",
    "cd(folder=(x := 'document'))",
    "cd(folder=os.getcwd())",
    # private methods, unknown functions, classes the task does not involve
    "_load_scenario({{}}, long_context=False)",
    '{{"name": "_load_scenario", "arguments": {{"scenario": {{}}}}}}',
    '{{"name": "__init__", "arguments": {{}}}}',
    "GorillaFileSystem.ls()",
    "send_message(receiver_id='USR002', message='hi')",
    "get_stock_info(symbol='AAPL')",
    "rm_rf(path='/')",
    # huge or deeply nested literals
    "cd(folder='" + "a" * 40_000 + "')",
    "mean(numbers=" + "[" * 500 + "]" * 500 + ")",
    "mean(numbers=" + "[" * 30 + "1" + "]" * 30 + ")",
    "mean(numbers=[" + ", ".join(["1"] * 5000) + "])",
    '{{"name": "mean", "arguments": {{"numbers": ' + "[" * 3000 + "]" * 3000 + "}}}}",
    "<tool_call>" + '{{"name": "ls", "arguments": {{}}}}' * 100 + "</tool_call>",
]


@pytest.fixture
def episode():
    ep = Episode(get_task("multi_turn_base_0"))  # GorillaFileSystem + TwitterAPI
    ep.begin_turn()
    return ep


@pytest.mark.parametrize("template", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_hostile_text_executes_nothing(episode, template):
    canary = CANARY.format(os.getpid())
    text = template.format(canary=canary)
    before = copy.deepcopy(episode.state())
    cwd, threads = os.getcwd(), threading.active_count()

    step = episode.step(text)

    assert step.observations, f"no error observation for {text[:80]!r}"
    assert all(o.startswith("Error") for o in step.observations), step.observations[:3]
    assert not any(step.ok)
    assert not os.path.exists(canary)
    assert episode.state() == before  # episode state intact
    assert os.getcwd() == cwd and threading.active_count() == threads
    # ... and the episode still works afterwards
    assert episode.step("pwd()").observations == ['{"current_working_directory": "/workspace"}']

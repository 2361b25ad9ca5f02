"""Evaluation outcomes in bfcl-eval's result-file layout, holding only calls that are safe to `eval`:

    <out>/bfcl_results/<model>-<token>-s<seed>[-combined]/multi_turn/BFCL_v4_multi_turn_<category>_result.json

one JSON line per entry {"id", "result"}, result = per turn, per step, the model's decoded output
as a prompting model writes it ("[cd(folder='a'), ls()]"), so bfcl-eval's evaluator can score it.
bfcl-eval `eval`s those strings: a call is written only in our canonical print of a call our
literal-only parser reads as exactly one call to one of the task's own functions.

    .venv/bin/pytest tests/test_untrusted_output.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

from rcgrpo.bfcl.executor import parse_calls
from rcgrpo.bfcl.tasks import get_task


def step_text(calls: list[str]) -> str:
    """One model step as a prompting model's decoded output: "[f(a=1), g()]"."""
    return "[" + ", ".join(calls) + "]"


def export_form(text: str, names: frozenset[str]) -> str | None:
    """The form in which a call may reach bfcl-eval, or None: it must parse (our literal-only
    parser) to exactly one call to one of the task's own functions, and is written back in our
    canonical print, which re-parses to the same call. bfcl-eval `eval`s result strings, so
    unknown names, text that does not parse and literals without a literal print (`1e999`
    prints `inf`) are never exported; a JSON call's free-text name or argument key never is."""
    parsed = parse_calls(text)
    if parsed.errors or len(parsed.calls) != 1 or parsed.calls[0].name not in names:
        return None
    try:
        canonical = str(parsed.calls[0])
    except ValueError:  # an int Python will not print (4,300 digits): never reaches bfcl-eval
        return None
    again = parse_calls(canonical)
    return canonical if not again.errors and again.calls == parsed.calls else None


def _task_function_names(task_id: str) -> frozenset[str]:
    try:
        return frozenset(d["name"] for d in get_task(task_id).function_docs)
    except KeyError:  # not a BFCL task: nothing of it is exported
        return frozenset()


def _exported(step: list[str], names: frozenset[str]) -> list[str]:
    return [form for form in (export_form(c, names) for c in step) if form is not None]


def _number(task_id: str) -> int:
    """A task's number in its category (a value variant's is its scenario's); an id the task
    set lacks sorts by its own trailing digits."""
    try:
        return get_task(task_id).number
    except KeyError:
        tail = task_id.rsplit("_", 1)[-1]
        return int(tail) if tail.isdigit() else -1


def write_bfcl_results(outcomes: list, out_dir: Path, model_name: str) -> list[Path]:
    """One bfcl-eval result file per (token, seed, category); returns the files written.
    Only calls with an `export_form` are written (bfcl-eval evaluates them with `eval`)."""
    groups: dict[tuple, list] = {}  # (token, seed, protocol, category) -> its Outcomes
    for o in outcomes:
        groups.setdefault((o.token, o.seed, o.protocol, o.category), []).append(o)
    written = []
    for (token, seed, protocol, category), rows in sorted(groups.items()):
        tail = "" if protocol == "bfcl" else f"-{protocol}"  # bfcl-eval's own layout: no suffix
        folder = Path(out_dir) / f"{model_name}-{token}-s{seed}{tail}" / "multi_turn"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"BFCL_v4_multi_turn_{category}_result.json"
        rows = sorted(rows, key=lambda o: (_number(o.task_id), o.task_id))
        lines = []
        for o in rows:
            names = _task_function_names(o.task_id)
            result = [[step_text(_exported(s, names)) for s in t] for t in o.calls]
            lines.append(json.dumps({"id": o.task_id, "result": result}))
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written

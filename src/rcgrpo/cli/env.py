"""`rcgrpo env ...`: look at BFCL tasks and execute calls against a fresh episode.

rcgrpo env show multi_turn_miss_func_0
rcgrpo env run multi_turn_base_0 --calls calls.json   # calls.json: [["cd(folder='x')"], []]
rcgrpo env split --seed 0                              # rewrite (and check) the split file
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, help="Inspect BFCL tasks and run tool calls.")


def _task(task_id: str):
    from rcgrpo.bfcl.tasks import get_task

    try:
        return get_task(task_id)
    except KeyError as e:
        raise typer.BadParameter(str(e.args[0]), param_hint="TASK_ID") from None


@app.command()
def show(task_id: str) -> None:
    """Print a task: turns, involved classes, held-out functions and ground truth."""
    from rcgrpo.bfcl.tasks import load_split

    task = _task(task_id)
    typer.echo(
        json.dumps(
            {
                "id": task.id,
                "category": task.category,
                "split": load_split()[task.id],
                "involved_classes": list(task.involved_classes),
                "missed_functions": task.missed_functions,
                "excluded_functions": list(task.excluded_functions),
                "turns": [[m["content"] for m in turn] for turn in task.turns],
                "ground_truth": [list(t) for t in task.ground_truth],
                "functions": [d["name"] for d in task.function_docs],
            },
            indent=2,
        )
    )


def _read_calls_file(path: Path) -> list[list[str]]:
    if not path.exists():
        raise typer.BadParameter(f"{path} does not exist", param_hint="--calls")
    if not path.is_file():
        raise typer.BadParameter(f"{path} is a directory, not a JSON file", param_hint="--calls")
    try:
        turns = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise typer.BadParameter(
            f"{path} is not a UTF-8 text file (byte {e.start}): expected JSON", param_hint="--calls"
        ) from None
    except json.JSONDecodeError as e:
        raise typer.BadParameter(
            f"{path} is not valid JSON: {e.msg} (line {e.lineno})", param_hint="--calls"
        ) from None
    except ValueError as e:  # a number of over 4,300 digits
        raise typer.BadParameter(
            f"{path}: {' '.join(str(e).split())[:120]}", param_hint="--calls"
        ) from None
    if not (
        isinstance(turns, list)
        and all(isinstance(t, list) and all(isinstance(c, str) for c in t) for t in turns)
    ):
        raise typer.BadParameter(
            f"{path} must hold a list of turns, each a list of call strings", param_hint="--calls"
        )
    return turns


@app.command()
def run(
    task_id: str,
    calls: Path = typer.Option(
        ...,
        "--calls",
        help="JSON file: list of turns, each a list of call strings (one model step each)",
    ),
) -> None:
    """Execute calls turn by turn in a fresh episode; print observations and both verdicts."""
    from rcgrpo.bfcl.checkers import score
    from rcgrpo.bfcl.environment import Episode

    task = _task(task_id)
    turns = _read_calls_file(calls)
    episode = Episode(task)
    out_turns, executed = [], []
    for index, turn_calls in enumerate(turns):
        user = episode.begin_turn(index) if index < episode.n_turns else []
        steps, turn_executed = [], []
        for text in turn_calls:
            step = episode.step(text)
            steps.append(
                {
                    "call": text,
                    "parsed": [str(c) for c in step.calls],
                    "observations": step.observations,
                }
            )
            # what ran, as the agent loop records it: a call refused live (a function this
            # episode does not offer) or killed by a limit had no effect, so it is not scored
            kept = [str(c) for c, ran in zip(step.calls, step.executed, strict=True) if ran]
            if kept:  # a step where nothing ran is no step of the trajectory (agent loop)
                turn_executed.append(kept)
        out_turns.append({"user": [m["content"] for m in user], "steps": steps})
        executed.append(turn_executed)
    paper, bfcl = score(task, executed)
    typer.echo(
        json.dumps(
            {
                "task_id": task.id,
                "turns": out_turns,
                "paper_reward": paper.to_dict(),
                "bfcl_check": bfcl.to_dict(),
            },
            indent=2,
        )
    )


@app.command()
def split(seed: int = typer.Option(0, help="seed of the test-number draw")) -> None:
    """Write the 90/10 split file and print the per-category counts."""
    from rcgrpo.bfcl.tasks import SPLIT_FILE, load_split, split_counts, write_split

    before = SPLIT_FILE.read_text() if SPLIT_FILE.exists() else None
    write_split(seed)
    load_split.cache_clear()
    changed = before is not None and before != SPLIT_FILE.read_text()
    typer.echo(
        json.dumps({"file": str(SPLIT_FILE), "changed": changed, **split_counts()}, indent=1)
    )

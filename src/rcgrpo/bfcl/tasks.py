"""BFCL v4 multi-turn tasks and the committed 90/10 train/test split.

The four multi-turn categories (base, miss_func, miss_param, long_context; 200 entries each) and
their ground truth are read from the data that ships inside the installed `bfcl-eval` wheel, never
copied into this repo. A task id is BFCL's entry id, e.g. `multi_turn_miss_func_17`; its numeric
part (17) is the *task number* shared by the four variants of one scenario.

The split is by task number, so all four variants of a scenario fall on the same side (a
per-category split would put, say, `base_17` in train and `miss_param_17` in test: the same
scenario and nearly the same ground truth on both sides). 20 numbers of 200 are test, which gives
80 test entries, 20 per category. The paper reports 18/17/22/23 per category, i.e. a per-category
split; its id list is unpublished. Our list is seeded and committed in `split.json`; regenerate
it (it must not change) with:

    rcgrpo env split --seed 0
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
SPLIT_FILE = Path(__file__).with_name("split.json")
SPLIT_SEED = 0
N_TEST_NUMBERS = 20  # of 200 task numbers -> 80 of 800 entries

# BFCL's user message for a turn that reveals held-out functions (bfcl_eval constants,
# DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC); copied as data so loading needs no bfcl import.
REVEAL_MESSAGE = "I have updated some more functions you can choose from. What about now?"
FUNC_DOC_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}


@dataclass(frozen=True, eq=False)  # identity hash: tasks key caches
class Task:
    """One BFCL multi-turn entry with its ground truth. Read-only: share it freely."""

    id: str  # "multi_turn_base_0"
    category: str  # one of CATEGORIES
    number: int  # numeric part of the id, shared by the four category variants
    turns: tuple  # per turn, the list of user messages ({"role", "content"}); [] on reveal turns
    initial_config: dict  # class name -> scenario passed to _load_scenario
    involved_classes: tuple[str, ...]
    ground_truth: tuple  # per turn, a list of BFCL python-call strings
    missed_functions: dict = field(default_factory=dict)  # turn index -> [function names]
    excluded_functions: tuple[str, ...] = ()  # BFCL metadata; bfcl-eval uses it nowhere
    path: tuple[str, ...] = ()  # BFCL metadata: the "Class.method" calls the scenario exercises

    @property
    def long_context(self) -> bool:
        return self.category == "long_context"

    @property
    def function_docs(self) -> list[dict]:
        """The JSON docs of every function of the involved classes (held-out ones included)."""
        return [doc for cls in self.involved_classes for doc in class_docs(cls)]

    def hidden_before(self) -> dict[str, int]:
        """Function name -> the turn index from which it is available (miss_func only)."""
        return {name: turn for turn, names in self.missed_functions.items() for name in names}


def bfcl_data_dir() -> Path:
    """The `data/` folder of the installed bfcl-eval, found without importing the package."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("bfcl-eval is not installed: run `make test` or `pip install -e .`")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@functools.cache
def class_docs(class_name: str) -> tuple[dict, ...]:
    """BFCL's function docs for one API class (memoised: immutable data read from the wheel)."""
    if class_name not in FUNC_DOC_FILES:
        raise KeyError(f"unknown BFCL API class {class_name!r}; known: {sorted(FUNC_DOC_FILES)}")
    path = bfcl_data_dir() / "multi_turn_func_doc" / FUNC_DOC_FILES[class_name]
    return tuple(json.loads(line) for line in path.read_text().splitlines() if line.strip())


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.cache
def load_tasks() -> dict[str, Task]:
    """All 800 multi-turn tasks by id (memoised; Task is frozen)."""
    data = bfcl_data_dir()
    tasks: dict[str, Task] = {}
    for category in CATEGORIES:
        questions = _read_jsonl(data / f"BFCL_v4_multi_turn_{category}.json")
        answers = {
            row["id"]: row["ground_truth"]
            for row in _read_jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")
        }
        for entry in questions:
            ground_truth = answers[entry["id"]]
            if len(ground_truth) != len(entry["question"]):
                raise ValueError(
                    f"{entry['id']}: {len(entry['question'])} turns but "
                    f"{len(ground_truth)} ground-truth turns in bfcl-eval's data"
                )
            tasks[entry["id"]] = Task(
                id=entry["id"],
                category=category,
                number=int(entry["id"].rsplit("_", 1)[1]),
                turns=tuple(entry["question"]),
                initial_config=entry["initial_config"],
                involved_classes=tuple(entry["involved_classes"]),
                ground_truth=tuple(ground_truth),
                missed_functions={
                    int(k): list(v) for k, v in entry.get("missed_function", {}).items()
                },
                excluded_functions=tuple(entry.get("excluded_function", ())),
                path=tuple(entry.get("path", ())),
            )
    return tasks


_REGISTERED: dict[str, Task] = {}  # tasks made here (value variants), by id


def register(tasks: list[Task]) -> tuple[Task, ...]:
    """Make `tasks` (made from BFCL's, e.g. rcgrpo.bfcl.value_variants) known to `get_task` in
    this process; an id already taken by a different task is an error. Returns them."""
    for task in tasks:
        known = _REGISTERED.get(task.id) or load_tasks().get(task.id)
        if known is not None and known is not task and known.ground_truth != task.ground_truth:
            raise ValueError(f"task id {task.id!r} is taken by a different task")
        _REGISTERED[task.id] = task
    return tuple(tasks)


def get_task(task_id: str) -> Task:
    """One task by id (BFCL's or a registered one); a clear error for an unknown id."""
    tasks = load_tasks()
    if task_id in _REGISTERED:
        return _REGISTERED[task_id]
    if task_id not in tasks:
        hint = ", ".join(f"multi_turn_{c}_0" for c in CATEGORIES)
        raise KeyError(f"unknown task id {task_id!r}: ids look like {hint} (numbers 0-199)")
    return tasks[task_id]


def make_split(seed: int = SPLIT_SEED, n_test_numbers: int = N_TEST_NUMBERS) -> dict:
    """Draw the test task numbers; every category variant of a number goes to the same side."""
    numbers = sorted({task.number for task in load_tasks().values()})
    test_numbers = sorted(random.Random(seed).sample(numbers, n_test_numbers))
    ids = sorted(load_tasks(), key=lambda i: (load_tasks()[i].category, load_tasks()[i].number))
    test = [i for i in ids if load_tasks()[i].number in test_numbers]
    train = [i for i in ids if load_tasks()[i].number not in test_numbers]
    return {"seed": seed, "test_numbers": test_numbers, "train": train, "test": test}


def write_split(seed: int = SPLIT_SEED, path: Path = SPLIT_FILE) -> dict:
    split = make_split(seed)
    path.write_text(json.dumps(split, indent=1) + "\n")
    return split


@functools.cache
def load_split(path: Path = SPLIT_FILE) -> dict[str, str]:
    """Task id -> "train" | "test", from the committed split file."""
    if not path.exists():
        raise FileNotFoundError(
            f"split file {path} is missing: regenerate it with `rcgrpo env split --seed 0`"
        )
    split = json.loads(path.read_text())
    return {**{i: "train" for i in split["train"]}, **{i: "test" for i in split["test"]}}


def split_of(task: Task) -> str:
    """The side of the split a task is on, "train" or "test": BFCL's from the split file; a
    registered task made from one (a value variant) is on its scenario's side."""
    sides = load_split()
    return sides.get(task.id) or sides[f"multi_turn_{task.category}_{task.number}"]


def tasks_in(split: str, categories: tuple[str, ...] = CATEGORIES) -> list[Task]:
    """The tasks of one side of the split, in (category, number) order."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    sides = load_split()
    return [t for i, t in load_tasks().items() if sides[i] == split and t.category in categories]


def split_counts() -> dict[str, dict[str, int]]:
    """{"train": {category: n}, "test": {category: n}} for reports."""
    counts: dict[str, dict[str, int]] = {"train": {}, "test": {}}
    for task_id, side in load_split().items():
        category = load_tasks()[task_id].category
        counts[side][category] = counts[side].get(category, 0) + 1
    return counts

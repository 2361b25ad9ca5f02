"""Tasks load from the installed bfcl-eval data; the committed split is the seeded one."""

import json

import pytest

from rcgrpo.bfcl.tasks import (
    CATEGORIES,
    SPLIT_FILE,
    get_task,
    load_split,
    load_tasks,
    make_split,
    split_counts,
    tasks_in,
)


def test_all_four_categories_with_200_entries_each():
    tasks = load_tasks()
    assert len(tasks) == 800
    for category in CATEGORIES:
        assert sum(t.category == category for t in tasks.values()) == 200


def test_task_fields_come_from_bfcl_data():
    task = get_task("multi_turn_miss_func_0")
    assert task.number == 0 and task.category == "miss_func"
    assert task.missed_functions == {3: ["sort"]}
    assert task.hidden_before() == {"sort": 3}
    assert task.turns[3] == []  # the reveal turn has no user message in BFCL's data
    assert task.ground_truth[0][0] == "cd(folder='document')"
    assert set(task.involved_classes) == {"TwitterAPI", "GorillaFileSystem"}
    assert "cp" in task.excluded_functions
    assert {"ls", "cd", "post_tweet", "sort"} <= {d["name"] for d in task.function_docs}
    assert get_task("multi_turn_long_context_0").long_context


def test_unknown_task_id_says_what_ids_look_like():
    with pytest.raises(KeyError, match="multi_turn_base_0"):
        get_task("multi_turn_base_999")


def test_committed_split_is_the_seeded_one_and_keeps_variants_together():
    committed = json.loads(SPLIT_FILE.read_text())
    assert committed == make_split(committed["seed"])
    sides = load_split()
    assert len(sides) == 800
    by_number = {}
    for task_id, side in sides.items():
        by_number.setdefault(load_tasks()[task_id].number, set()).add(side)
    assert all(len(s) == 1 for s in by_number.values())  # all 4 variants on one side


def test_split_is_720_train_80_test_with_20_per_category():
    counts = split_counts()
    assert sum(counts["train"].values()) == 720 and sum(counts["test"].values()) == 80
    assert counts["test"] == {c: 20 for c in CATEGORIES}
    assert len(tasks_in("test")) == 80
    assert all(t.category == "base" for t in tasks_in("train", ("base",)))

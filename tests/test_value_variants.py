"""Value variants of BFCL tasks (rcgrpo.bfcl.value_variants): the shared literals, the fresh
values, the consistent substitution, the clean-replay rule, and the variants as tasks: both
checkers and bfcl-eval's own checker agree on them (the conformance check), get_task finds them.

    .venv/bin/pytest tests/test_value_variants.py -q
"""

from __future__ import annotations

import random
import re

import pytest

from rcgrpo.bfcl.checkers import ground_truth_calls, score
from rcgrpo.bfcl.conformance import cases, compare
from rcgrpo.bfcl.tasks import get_task, split_of, tasks_in
from rcgrpo.bfcl.value_variants import (
    fresh_value,
    replays_clean,
    shared_literals,
    substitute,
    variant,
    variants,
)

POOL = [t for t in tasks_in("train", ("base",)) if sum(map(len, t.ground_truth)) <= 3]


def test_shared_literals_are_the_gold_values_the_request_spells_out():
    # base_11: "include the hashtag '#fileshowcase'"; 'file1.txt, file2.txt' is not in the text
    assert shared_literals(get_task("multi_turn_base_11")) == ["#fileshowcase"]
    # base_101: the ticker, the receiver and the message are all in the text; 'USR001' is not
    # a gold argument, view_messages_sent() has none
    assert shared_literals(get_task("multi_turn_base_101")) == [
        "XTC",
        "USR003",
        "The latest stock price of XTC is $150.75.",
    ]
    # base_169's travel date is in the text but left alone (random digits make no date)
    assert "2026-11-10" not in shared_literals(get_task("multi_turn_base_169"))


def test_fresh_values_keep_the_shape():
    rng = random.Random(0)
    for value in ("report.txt", "NVDA", "card_6789", "#TechBoom", "2278-9812-3456-4567"):
        new = fresh_value(value, rng)
        assert new != value and len(new) == len(value)
        shape = [("A" if c.isupper() else "a" if c.islower() else "9" if c.isdigit() else c) for c in value]  # fmt: skip
        assert [("A" if c.isupper() else "a" if c.islower() else "9" if c.isdigit() else c) for c in new] == shape  # fmt: skip
    assert fresh_value("notes.txt", rng).endswith(".txt")


def test_substitute_is_one_pass_over_whole_words_keys_included():
    mapping = {"XTC": "QRS", "abc123": "zz"}
    obj = {"XTC": {"note": "buy XTC, not XTCA or abc1234"}, "list": ["abc123", ("XTC",)]}
    assert substitute(obj, mapping) == {
        "QRS": {"note": "buy QRS, not XTCA or abc1234"},
        "list": ["zz", ("QRS",)],
    }
    assert substitute("a b", {"a": "b", "b": "a"}) == "b a"  # never replaced twice


def test_a_variant_moves_each_value_through_text_calls_and_state_consistently():
    task = get_task("multi_turn_base_101")
    v = variant(task, 1)
    new_ticker = re.search(r"symbol='(\w+)'", v.ground_truth[0][0]).group(1)
    assert new_ticker != "XTC" and new_ticker in v.initial_config["TradingBot"]["stocks"]
    assert "XTC" not in v.initial_config["TradingBot"]["stocks"]
    text = " ".join(m["content"] for turn in v.turns for m in turn)
    assert new_ticker in text and "XTC" not in text
    assert f"price of {new_ticker} is $150.75." in v.ground_truth[1][0]  # the sentence follows
    assert v.id == "multi_turn_base_101_v1" and (v.category, v.number) == ("base", 101)
    assert split_of(v) == "train"  # the side of the scenario it was made from


def test_a_substitution_that_breaks_the_replay_is_not_kept():
    task = get_task("multi_turn_base_157")  # 'Crescent Hollow' and 'business' are in the text
    assert {"Crescent Hollow", "business"} <= set(shared_literals(task))
    # neither survives: a fresh travel class is an error; a fresh city replays without one, but
    # the API answers it with another airport than the gold calls go on to use
    assert variant(task, 1) is None
    assert all(replays_clean(x) for t in POOL for x in variants(t, 2, 7))


def test_variants_are_tasks_both_checkers_and_bfcl_eval_take():
    made = [v for t in POOL for v in variants(t, 2, 7)]
    assert len(made) >= 40 and len({v.id for v in made}) == len(made)
    assert get_task(made[0].id) is made[0]
    for v in made[:12]:  # the gold calls earn both rewards on the variant
        paper, bfcl = score(v, ground_truth_calls(v), "bfcl")
        assert paper.passed and bfcl.passed, v.id
    sample = random.Random(0).sample(made, 10)
    rows = compare(cases(sample, per_task=3, seed=1), tag="variants")
    assert not [r for r in rows if r["ours"] != r["theirs"]], rows
    assert {r["ours"] for r in rows if r["kind"] != "ground_truth"} == {True, False}


def test_a_taken_id_is_refused():
    from dataclasses import replace

    from rcgrpo.bfcl.tasks import register

    other = replace(get_task("multi_turn_base_11"), id="multi_turn_base_13")
    with pytest.raises(ValueError, match="taken by a different task"):
        register([other])

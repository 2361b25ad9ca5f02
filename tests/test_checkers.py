"""Both checkers on hand-made trajectories, and agreement with bfcl-eval on a sample."""

import random
import re
import warnings

import pytest

from rcgrpo.bfcl.checkers import bfcl_check, ground_truth_calls, paper_reward, score
from rcgrpo.bfcl.conformance import cases, compare
from rcgrpo.bfcl.replay import _matched
from rcgrpo.bfcl.tasks import CATEGORIES, get_task, load_tasks

TASK = "multi_turn_base_1"  # ls(a=True) | cd, mv | cd, grep | tail(lines=20)


def steps(*turns):
    return [[list(t)] if t else [] for t in turns]


GT = (
    ["ls(a=True)"],
    ["cd(folder='workspace')", "mv(source='log.txt',destination='archive')"],
    ["cd(folder='archive')", "grep(file_name='log.txt',pattern='Error')"],
    ["tail(file_name='log.txt',lines=20)"],
)


@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_scores_one_on_both(category):
    task = get_task(f"multi_turn_{category}_7")
    paper, bfcl = score(task, ground_truth_calls(task))
    assert paper.passed and bfcl.passed and paper.reward == bfcl.reward == 1


def test_positional_and_keyword_forms_are_the_same_call():
    task = get_task(TASK)
    trajectory = steps(["ls(True)"], *GT[1:])
    assert paper_reward(task, trajectory).passed and bfcl_check(task, trajectory).passed


def test_missing_read_only_call_fails_r_action_and_the_turn_response_check():
    task = get_task(TASK)
    trajectory = steps(*GT[:2], ["cd(folder='archive')"], GT[3])  # grep dropped: state unchanged
    paper, bfcl = score(task, trajectory)
    assert not paper.passed and "R_action = 0: 1 of 6" in paper.reason
    assert not bfcl.passed and bfcl.failing_turn == 2 and "miss ground-truth results" in bfcl.reason


def test_wrong_state_fails_r_state_and_the_state_check_at_that_turn():
    task = get_task(TASK)
    trajectory = steps(
        GT[0],
        [
            "cd(folder='workspace')",
            "mkdir(dir_name='x')",
            "mv(source='log.txt',destination='archive')",
        ],
        *GT[2:],
    )
    paper, bfcl = score(task, trajectory)
    assert not paper.passed and paper.reason.startswith("R_state = 0")
    assert not bfcl.passed and bfcl.failing_turn == 1 and "GorillaFileSystem" in bfcl.reason


def test_empty_turn_and_turn_count_mismatch_fail_the_bfcl_check_only():
    task = get_task(TASK)
    bfcl = bfcl_check(task, steps([], *GT[1:]))
    assert not bfcl.passed and bfcl.failing_turn == 0 and "empty" in bfcl.reason
    all_in_one = [[[c for turn in GT for c in turn]]]
    paper, bfcl = score(task, all_in_one)
    assert paper.passed  # order free over the whole trajectory
    assert not bfcl.passed and "force terminated: 1 model turns for 4" in bfcl.reason


def test_combined_protocol_collapses_the_ground_truth_and_ignores_done():
    task = get_task(TASK)
    trajectory = [[[c for turn in GT for c in turn], ["done()"]]]
    paper, bfcl = score(task, trajectory, protocol="combined")
    assert paper.passed and bfcl.passed
    with pytest.raises(ValueError, match="protocol"):
        score(task, trajectory, protocol="paper")


def test_r_action_matching_is_one_to_one_and_allows_extra_arguments():
    gt = [("post", {"content": "a"}), ("post", {"content": "a"})]
    assert _matched(gt, [("post", {"content": "a", "tags": []})]) == 1
    assert _matched(gt, [("post", {"content": "a"}), ("post", {"content": "a", "x": 1})]) == 2
    # a greedy matcher would give g0 the only model call g1 can use
    gt = [("f", {}), ("f", {"a": 1})]
    assert _matched(gt, [("f", {"a": 1}), ("f", {"b": 2})]) == 2


def test_agrees_with_bfcl_eval_on_a_sample_of_ground_truth_and_perturbations():
    tasks = random.Random(0).sample(list(load_tasks().values()), 120)
    rows = compare(cases(tasks, per_task=3, seed=1), tag="test")
    disagreements = [r for r in rows if r["ours"] != r["theirs"]]
    assert not disagreements, [
        f"{r['task_id']} {r['kind']}: {r['reason']} (worker replaced: {r['worker_replaced']})"
        for r in disagreements
    ]
    assert len(rows) == 480
    if replaced := [
        f"{r['task_id']} {r['kind']}: {r['worker_replaced']}" for r in rows if r["worker_replaced"]
    ]:
        # replayed again and agreed: the kill or death is kept in the run's warnings summary
        warnings.warn(
            f"conformance replays whose tool worker was replaced: {replaced}", stacklevel=1
        )
    assert {r["ours"] for r in rows if r["kind"] != "ground_truth"} == {True, False}


def test_a_replay_whose_worker_is_killed_mid_call_is_replayed_again(monkeypatch):
    """An outside kill of the comparison's worker during a model call (a real SIGKILL) gives
    that call an error observation; the replay runs once more in a fresh worker, so the verdict
    is the checkers' rules, and the row names the kill."""
    import dataclasses
    import os
    import signal
    import threading
    import time

    from rcgrpo.bfcl import conformance
    from rcgrpo.bfcl.progress import read
    from rcgrpo.bfcl.sandbox import Sandbox

    boxes = []

    class Watched(Sandbox):  # the real sandbox; the test only needs to find its worker
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            boxes.append(self)

    monkeypatch.setattr(conformance, "Sandbox", Watched)
    base = get_task("multi_turn_base_15")  # MathAPI: power() is a needed result, ~0.2 s here
    turns = [list(base.ground_truth[0]) + ["power(base=3, exponent=1000000)"]]
    task = dataclasses.replace(base, ground_truth=turns + [list(t) for t in base.ground_truth[1:]])

    def killed_during_the_models_power() -> tuple[list, list]:
        """One comparison with a thread that SIGKILLs the worker once power() is marked."""
        boxes.clear()
        killed: list = []

        def kill():
            while not killed:
                worker = getattr(boxes[0], "_worker", None) if boxes else None  # once it started
                if worker is not None:
                    record = read(worker.progress)
                    if record is not None and record[0] == len(turns[0]) - 1:  # power()
                        os.kill(worker.proc.pid, signal.SIGKILL)
                        killed.append(worker.proc.pid)
                time.sleep(0.001)

        killer = threading.Thread(target=kill)
        killer.start()
        try:
            rows = compare([(task, "ground_truth", ground_truth_calls(task))], tag="killed")
        finally:
            killed.append(None)
            killer.join()
        return rows, killed[:-1]

    for _ in range(3):  # on a busy box the killer can miss power()'s ~0.2 s (or the request): again
        [row], killed = killed_during_the_models_power()
        if killed and row["worker_replaced"]:
            break
    assert killed and len(row["worker_replaced"]) == 1, (killed, row)
    assert row["ours"] and row["theirs"], row  # replayed again in the fresh worker: agreed
    # power(), or a later call of the replay when the killer thread was descheduled in between
    assert re.fullmatch(
        r"in model call \d+: the tool process died \(exit status -9\)", row["worker_replaced"][0]
    ), row

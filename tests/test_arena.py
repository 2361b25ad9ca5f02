"""The arena's smoke run (bench/arena.py) end to end on the CPU: a real RCTP-FT start (cached),
one RL step of two arms, the evaluation on the pool, its held-out value variants and unseen
scenarios, every arm-run an MLflow run of the `arena` experiment inside a Prefect flow, and the
report reprinted from the MLflow store alone.

    .venv/bin/pytest tests/test_arena.py -q
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
def test_smoke_arena_is_in_mlflow_and_its_report_comes_from_the_store(
    tmp_path, prefect_server, mlflow_store, capsys, monkeypatch
):
    from mlflow.tracking import MlflowClient

    monkeypatch.syspath_prepend(str(BENCH))
    import arena
    import arena_report

    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["arena.py", "--seeds", "0", "--steps", "1", "--arms", "rc-grpo", "grpo", "--tasks",
            "4", "--starts", "1", "--out", str(out), "--cache", str(cache),
            "--set", "rctp.epochs=20"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    arena.main()
    printed = capsys.readouterr().out

    client = MlflowClient(f"sqlite:///{mlflow_store}/mlflow.db")
    exp = client.get_experiment_by_name("arena")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(
        (r.data.tags["arm"], r.data.tags["start"], r.data.tags["seed"]) for r in runs
    ) == [
        ("grpo", "0", "0"),
        ("rc-grpo", "0", "0"),
    ]
    for r in runs:
        assert r.data.tags["git.commit"] and len(r.data.tags["start.key"]) == 16
        assert r.data.tags["arena.id"] == runs[0].data.tags["arena.id"]
        names = {a.path for a in client.list_artifacts(r.info.run_id)}
        assert {"config.json", "analysis_plan.json", "per_task_point0.json"} <= names
        assert r.data.params["rl.seed"] == "0" and r.data.params["rollout.max_new_tokens"] == "128"
        m = r.data.metrics
        assert m["arena/steps"] == 1 and m["arena/generated_tokens"] > 0
        for name in ("in_sample/sampled", "in_sample/greedy", "in_sample/greedy_low",
                     "heldout_values/greedy", "unseen/greedy"):  # fmt: skip
            assert 0.0 <= m[f"arena/{name}"] <= 1.0
        assert "reward/mean" in m and "rollout/zero_variance_all_fail_frac" in m
    assert any(p.name == "done" for p in cache.rglob("done"))  # the start is cached

    shutil.rmtree(out)  # nothing but the MLflow store is left to read from
    table = arena_report.report()
    assert table in printed and "| rc-grpo | 1 | 1.0 |" in table
    assert f"id {exp.experiment_id}" in table


def test_a_budget_point_gets_the_weights_from_before_the_step_that_crossed_it(monkeypatch):
    """Points (bench/arena.py): point B is evaluated with the weights of the last step whose
    sampled-token total is <= B; a step that jumps over two points serves both; points the run
    never reached get its last weights."""
    import torch

    monkeypatch.syspath_prepend(str(BENCH))
    import arena

    model = torch.nn.Linear(1, 1, bias=False)
    seen = []

    def evaluate(j, budget, state, tokens, step):
        seen.append((j, budget, float(state["weight"]), tokens, step))
        return {"arena/point_step": step}

    points = arena.Points(SimpleNamespace(model=model), [100, 200, 300, 400, 900], evaluate)
    for step, total in enumerate([60, 120, 200, 260, 450], start=1):
        model.weight.data.fill_(float(step))  # the weights after `step`
        points({"rollout/generated_tokens_total": total}, step)
    points.finish()
    assert seen == [
        (0, 100, 1.0, 60, 1),  # step 2 crossed 100: step 1's weights
        (1, 200, 3.0, 200, 3),  # step 3 ended on 200 exactly; step 4 crossed it
        (2, 300, 4.0, 260, 4),  # step 5 jumped over 300 and 400
        (3, 400, 4.0, 260, 4),
        (4, 900, 5.0, 450, 5),  # never reached: the run's last weights
    ]

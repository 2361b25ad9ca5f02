"""Evaluation statistics and the BFCL result files (rcgrpo.evaluation.stats, rcgrpo.evaluation.evaluate)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rcgrpo.bfcl.checkers import ground_truth_calls
from rcgrpo.chat.record import HIGH
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.evaluation.config import EvalConfig
from rcgrpo.evaluation.evaluate import evaluate, flat_metrics
from rcgrpo.evaluation.stats import accuracy, summarise, wilson


def test_wilson_hand_computed():
    # k=0, n=10: upper = z^2 / (n + z^2) = 3.8415 / 13.8415
    assert wilson(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson(5, 10) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    assert wilson(10, 10) == pytest.approx((0.722467, 1.0), abs=1e-6)
    # the paper's best number, 68/80 = 85.00%
    assert wilson(68, 80) == pytest.approx((0.755868, 0.912060), abs=1e-6)


def test_summary_pooled_vs_unweighted_category_mean():
    # base 2/2, miss_func 0/2, miss_param 1/4: pooled 3/8, category mean (1 + 0 + .25)/3
    outcomes = [("base", 1)] * 2 + [("miss_func", 0)] * 2 + [("miss_param", 1)]
    outcomes += [("miss_param", 0)] * 3
    s = summarise(outcomes)
    assert s["pooled"].value == 3 / 8 and s["pooled"] == accuracy(3, 8)
    assert s["per_category"]["miss_param"].value == 0.25
    assert s["category_mean"].value == pytest.approx(1.25 / 3)
    # effective size K^2 / sum(1/n_c) = 9 / (1/2 + 1/2 + 1/4)
    assert s["category_mean"].n == pytest.approx(9 / 1.25)
    # equal category sizes: the category-mean interval is the pooled one
    eq = summarise([("a", 1), ("a", 0), ("b", 1), ("b", 1)])
    assert (eq["category_mean"].low, eq["category_mean"].high) == pytest.approx(
        (eq["pooled"].low, eq["pooled"].high)
    )


class OracleEngine:
    """Ground truth under <|high_reward|>, an empty answer under any other token."""

    def __init__(self):
        self.calls = []

    def rollout(self, tasks, reward_tokens, protocol, seed):
        self.calls.append((len(tasks), protocol, seed))
        return [
            SimpleNamespace(calls=ground_truth_calls(t) if tok == HIGH else [[] for _ in t.turns])
            for t, tok in zip(tasks, reward_tokens, strict=True)
        ]


def test_evaluate_reports_gap_and_writes_bfcl_result_files(tmp_path):
    from bfcl_eval.model_handler.utils import default_decode_execute_prompting

    from rcgrpo.bfcl.conformance import official_verdict
    from rcgrpo.bfcl.tasks import get_task

    engine, logged = OracleEngine(), []
    cfg = EvalConfig(protocol="bfcl", tokens=("high", "low"), seeds=(0, 1), limit=1,
                     out_dir=str(tmp_path))  # fmt: skip
    report = evaluate(engine, cfg, log_metrics=lambda m, s: logged.append((m, s)), environment=BFCL)
    # per seed: both tokens in the headline protocol, then the first token in the other one
    assert engine.calls == [(4, "bfcl", 0), (4, "bfcl", 0), (4, "combined", 0),
                            (4, "bfcl", 1), (4, "bfcl", 1), (4, "combined", 1)]  # fmt: skip
    assert report["n_tasks"] == 4 and report["protocol"] == "bfcl"
    beside = report["other_protocols"]["combined"]
    assert beside["protocol"] == "combined" and list(beside["runs"]) == ["high"]
    for checker in ("paper", "bfcl"):
        assert report["runs"]["high"][0][checker]["pooled"]["value"] == 1.0
        assert report["runs"]["low"][1][checker]["pooled"]["value"] == 0.0
        assert report["gap"][checker] == {"per_seed": [1.0, 1.0], "mean": 1.0}
    metrics = logged[0][0]
    assert metrics["eval/bfcl/high/pooled"] == 1.0 and metrics["eval/paper/gap"] == 1.0
    assert "eval/combined_protocol/paper/high/pooled" in metrics
    assert not any(k.startswith("eval/combined_protocol/paper/low") for k in metrics)
    assert metrics == flat_metrics(json.loads((tmp_path / "report.json").read_text()))

    # bfcl-eval's own decoder + checker accept the result files we wrote
    folder = tmp_path / "bfcl_results" / "rcgrpo-high-s0" / "multi_turn"
    files = sorted(p.name for p in folder.iterdir())
    assert files == [
        f"BFCL_v4_multi_turn_{c}_result.json"
        for c in sorted(("base", "miss_func", "miss_param", "long_context"))
    ]
    for path in folder.iterdir():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            decoded = [[default_decode_execute_prompting(s) for s in t] for t in row["result"]]
            assert official_verdict(get_task(row["id"]), decoded, f"t5_{row['id']}")


def test_compare_table_and_chart(tmp_path):
    from typer.testing import CliRunner

    from rcgrpo.cli import app
    from rcgrpo.evaluation.compare import load_report, rows

    for name, tokens in (("oracle", ("high", "low")), ("empty", ("low",))):
        cfg = EvalConfig(protocol="bfcl", other_protocol=False, tokens=tokens, limit=1,
                         out_dir=str(tmp_path / name))  # fmt: skip
        evaluate(OracleEngine(), cfg, environment=BFCL)
    table = rows({"oracle": load_report(tmp_path / "oracle")}, "bfcl", "high")
    assert table[0]["pooled"]["value"] == 1.0 and table[0]["gap"] == 1.0
    png = tmp_path / "cmp.png"
    result = CliRunner().invoke(
        app, ["compare", str(tmp_path / "oracle"), str(tmp_path / "empty"), "--token", "low",
              "--png", str(png)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "oracle" in result.output and "empty" in result.output and "0.0 [" in result.output
    assert png.stat().st_size > 1000
    # a run evaluated without the requested token is an error that says so
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "empty"), "--png", str(png)])
    assert result.exit_code != 0 and "not evaluated with token 'high'" in result.output


def test_headline_protocol_is_the_one_the_model_was_trained_with(tmp_path):
    from rcgrpo.evaluation.evaluate import resolve_protocol
    from rcgrpo.models.profiles import POLICY_FILE

    assert EvalConfig().protocol == "trained" and EvalConfig().temperature == 0.0  # greedy
    (tmp_path / POLICY_FILE).write_text(json.dumps({"training": {"protocol": "combined"}}))
    assert resolve_protocol(EvalConfig(), BFCL, tmp_path).protocol == "combined"
    assert (
        resolve_protocol(EvalConfig(), BFCL, tmp_path / "base").protocol == "bfcl"
    )  # nothing saved
    assert resolve_protocol(EvalConfig(protocol="bfcl"), BFCL, tmp_path).protocol == "bfcl"
    with pytest.raises(ValueError, match="resolve it first"):
        evaluate(OracleEngine(), EvalConfig(limit=1, out_dir=str(tmp_path)), environment=BFCL)


def test_task_file_restricts_the_tasks_and_refuses_the_other_split(tmp_path):
    from rcgrpo.bfcl.tasks import get_task
    from rcgrpo.chat.record import write_jsonl
    from rcgrpo.envs.bfcl.experts import expert
    from rcgrpo.evaluation.evaluate import eval_tasks

    ids = ["multi_turn_base_11", "multi_turn_miss_param_42"]
    path = write_jsonl(tmp_path / "rl.jsonl", [expert(get_task(i), "combined") for i in ids])
    cfg = EvalConfig(split="train", task_file=str(path))
    assert sorted(t.id for t in eval_tasks(cfg, BFCL)) == sorted(ids)
    with pytest.raises(ValueError, match="are not test tasks"):
        eval_tasks(EvalConfig(split="test", task_file=str(path)), BFCL)


def test_run_eval_decodes_greedily_whatever_the_rollout_temperature(tmp_path, monkeypatch):
    import rcgrpo.rollout.execution as engines
    from rcgrpo.evaluation.evaluate import run_eval
    from rcgrpo.models.loading import load_policy, save_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig

    folder = save_policy(load_policy(ModelConfig()), tmp_path / "policy", {"protocol": "bfcl"})
    built, real = [], engines.make_engine
    monkeypatch.setattr(
        engines, "make_engine", lambda cfg, p, env: built.append(cfg) or real(cfg, p, env)
    )
    sampled = RolloutConfig(temperature=1.0, max_new_tokens=8, max_total_tokens=1024, max_steps=1)
    texts = []
    for seed in (0, 1):
        cfg = EvalConfig(other_protocol=False, tokens=("none",), seeds=(seed,), limit=1,
                         out_dir=str(tmp_path / f"s{seed}"))  # fmt: skip
        report = run_eval(cfg, ModelConfig(), folder, BFCL, sampled)
        files = sorted((tmp_path / f"s{seed}" / "bfcl_results").rglob("*.json"))
        texts.append([f.read_text() for f in files])
    assert [(c.temperature, c.protocol) for c in built] == [(0.0, "bfcl")] * 2  # trained: bfcl
    assert report["protocol"] == "bfcl" and report["config"]["temperature"] == 0.0
    assert texts[0] == texts[1]  # greedy: the seed changes nothing

"""The environment seam (rcgrpo.rollout.environment) and its implementations: BFCL and the
calculator (rcgrpo.envs.calculator) go through the same agent loop, engine, Trainer and
evaluation; the run picks one by `env.name`; BFCL's names (metrics, outcomes.jsonl, the
bfcl-eval export) stay what they were. docs/environments.md walks through it.

    .venv/bin/pytest tests/test_environment_seam.py -q
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from rcgrpo.chat.prompts import Renderer
from rcgrpo.chat.record import HIGH
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.envs.calculator import Calculator
from rcgrpo.rollout.agent_loop import AgentLoop, Limits, results
from rcgrpo.rollout.environment import Environment, Episode, Rewards, Scorer

CALC = Calculator()
SMALL = dict(max_new_tokens=8, max_total_tokens=512, max_steps=3, max_batch=16)


@pytest.fixture(scope="module")
def policy():
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    return load_policy(ModelConfig(profile="tiny"))


def say(loop: AgentLoop, text: str) -> None:
    ids = loop.renderer.encode(text) + [loop.renderer.stop_id]
    loop.feed(ids, [-1.0] * len(ids))


def test_the_run_picks_the_environment_by_name(monkeypatch):
    from rcgrpo.bfcl import limits
    from rcgrpo.config import ConfigError, build
    from rcgrpo.envs import get
    from rcgrpo.envs.config import EnvConfig

    monkeypatch.setattr(limits, "_chosen", [])  # get() sets BFCL's limits: back after the test
    assert (
        get(EnvConfig()).name == "bfcl" and get(EnvConfig(name="calculator")).name == "calculator"
    )
    with pytest.raises(ConfigError, match=r"env.name=gsm8k: must be one of bfcl, calculator"):
        build(EnvConfig, {"name": "gsm8k"}, "env")


def test_bfcl_and_the_calculator_satisfy_the_protocols():
    for env in (BFCL, CALC):
        assert isinstance(env, Environment)
        task = env.tasks("test")[0]
        assert env.task(task.id) is task and {t.category for t in env.tasks("train")} <= set(
            env.categories
        )
        episode = env.episode(task, env.protocols[-1])
        assert isinstance(episode, Episode) and isinstance(env.scorer(env.protocols[0]), Scorer)
        messages, docs = episode.opening()
        assert messages[-1]["role"] == "user"
        assert {d["name"] for d in episode.tool_docs()} <= {d["name"] for d in docs}
        assert episode.steps_left > 0


def test_a_calculator_episode_in_the_agent_loop_scores_what_it_saw(policy):
    """Token-exact like BFCL's: the call's result comes back as a tool message (mask 0), the
    answer ends the episode, and the scorer's checks say what happened."""
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    task = CALC.task("calc_add_0")
    loops = []
    for call, shown, answer in (
        (task.ground_truth[0][0], str(task.answer), str(task.answer)),
        ("mul(a=2, b=3)", "6", "6"),
    ):
        loop = AgentLoop(CALC.episode(task, "combined"), renderer, HIGH, Limits(16, 512, 3))
        say(loop, f"[{call}]")
        assert loop.messages[-1] == {"role": "tool", "content": shown}
        say(loop, answer)
        loops.append(loop)
    right, wrong = results(loops, CALC.scorer("combined"))
    assert (right.stop_reason, right.trajectory.checks) == (
        "finished",
        {"correct": 1, "used_tool": 1},
    )
    assert wrong.trajectory.checks == {"correct": int(task.answer == 6), "used_tool": 0}
    assert right.trajectory.reward == 1 and right.trajectory.split == "test"
    sampled = [t for t, m in zip(right.ids, right.mask, strict=True) if m]
    assert renderer.decode(sampled).count("<|im_end|>") == 2  # the two messages, nothing else
    # the record renders for SFT exactly as it was rolled out
    from rcgrpo.rollout.sft_render import render_example

    assert render_example(right.trajectory, policy, CALC).ids == right.ids


def test_one_rl_step_on_the_calculator_through_the_engine(policy, tmp_path):
    """The real HF engine, the real Trainer, the calculator's scorer: one step's rewards are its
    checks by group, its advantages their GRPO normalisation; no BFCL name in its metrics."""
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.core_algos import group_advantages
    from rcgrpo.training.grpo.trainer import Trainer

    cfg = RLConfig(out_dir=str(tmp_path), tasks_per_step=3, group_size=4, steps=1, save_every=0,
                   micro_batch_size=6, mini_batch_size=0, kl_coef=0.0)  # fmt: skip
    engine = make_engine(RolloutConfig(**SMALL), policy, CALC)
    seen = []
    trainer = Trainer(policy, engine, CALC.tasks("train"), cfg, CALC.scorer(cfg.protocol),
                      on_rollouts=lambda s, o: seen.append((o, list(o.records))))  # fmt: skip
    m = trainer.train_step(1)
    ((out, records),) = seen
    rescored = [CALC.scorer()(t, SimpleNamespace(messages=r.messages, calls=r.calls))
                for t, r in zip([t for t in out.tasks for _ in range(4)], records, strict=True)]  # fmt: skip
    assert [s.checks for s in out.scores] == [r.checks for r in rescored]
    correct = torch.tensor([s.checks["correct"] for s in out.scores], dtype=torch.float32)
    assert torch.equal(out.rewards, correct.view(3, 4))  # (n, G): Rewards.train by group
    assert torch.allclose(out.advantages, group_advantages(out.rewards, "grpo").flatten())
    assert m["reward/mean"] == float(correct.mean()) and "reward/other_checker_mean" in m
    assert all(r.trajectory.protocol == "combined" for r in records)
    assert not any("bfcl" in k or "paper" in k for k in m)


def test_one_evaluation_reports_the_calculator_checks_by_name(policy, tmp_path):
    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import evaluate, flat_metrics
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine

    tasks = CALC.tasks("test")
    cfg = EvalConfig(protocol="combined", tokens=("high", "low"), out_dir=str(tmp_path))
    engine = make_engine(RolloutConfig(temperature=0.0, **SMALL), policy, CALC)
    report = evaluate(engine, cfg, tasks=tasks, environment=CALC)
    rows = [json.loads(x) for x in (tmp_path / "outcomes.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * len(tasks) and all(set(r) >= {"correct", "used_tool"} for r in rows)
    flat = flat_metrics(report)
    for token in ("high", "low"):
        mine = [r for r in rows if r["token"] == token]
        for check in ("correct", "used_tool"):
            assert flat[f"eval/{check}/{token}/pooled"] == sum(r[check] for r in mine) / len(mine)
            adds = [r[check] for r in mine if r["category"] == "add"]
            assert flat[f"eval/{check}/{token}/add"] == sum(adds) / len(adds)
    assert report["other_protocols"] == {}  # one protocol: nothing to report beside it
    assert report["categories"] == ["add", "mul"] and set(report["gap"]) == {"correct", "used_tool"}
    assert not any("bfcl" in k or "paper" in k for k in flat)
    assert not (tmp_path / "bfcl_results").exists()  # bfcl-eval's files are BFCL's alone


def test_bfcl_scorer_names_its_checks_and_trains_on_rl_reward():
    from rcgrpo.bfcl.checkers import ground_truth_calls
    from rcgrpo.bfcl.tasks import get_task
    from rcgrpo.training.grpo.metrics import other_check

    task = get_task("multi_turn_base_0")
    replayed = BFCL.scorer("bfcl")(task, SimpleNamespace(calls=ground_truth_calls(task)))
    assert (replayed.train, dict(replayed.checks)) == (1.0, {"paper": 1, "bfcl": 1})
    record = SimpleNamespace(checks={"paper": 1, "bfcl": 0}, reward_reason={})
    carried = SimpleNamespace(trajectory=record)
    assert BFCL.scorer("bfcl", "paper")(task, carried).train == 1.0
    assert BFCL.scorer("bfcl", "bfcl")(task, carried).train == 0.0
    assert BFCL.scorer("bfcl").reward == "paper"  # rl.reward "": BFCL trains on the paper's R
    # reward/other_checker_mean: trained on paper, the bfcl check's mean, (0 + 1 + 1) / 3
    scores = [Rewards(1.0, {"paper": 1, "bfcl": 0}), Rewards(0.0, {"paper": 0, "bfcl": 1})]
    scores.append(Rewards(1.0, {"paper": 1, "bfcl": 1}))
    assert other_check(scores, "paper") == pytest.approx(2 / 3)  # a float32 mean, as before
    assert other_check(scores, "bfcl") == pytest.approx(2 / 3)  # the paper check's, (1+0+1)/3
    assert other_check([Rewards(1.0, {"correct": 1})], "paper") is None


def test_a_bfcl_outcome_line_keeps_its_layout():
    """outcomes.jsonl: the named checks are written flat, where the paper/bfcl fields were."""
    from rcgrpo.evaluation.evaluate import Outcome

    row = Outcome("multi_turn_base_0", "base", "high", 0, "bfcl", {"paper": 1, "bfcl": 0}).row()
    keys = ["task_id", "category", "token", "seed", "protocol", "paper", "bfcl", "calls", "reasons"]
    assert list(row) == keys and (row["paper"], row["bfcl"]) == (1, 0)


def test_bfcl_metric_names_outcomes_and_export_stay(tmp_path):
    """The names a BFCL evaluation logs and writes, pinned: every eval/ metric of a pass with
    both goals and the other protocol, the fields of an outcomes.jsonl line with its reasons,
    and the bfcl-eval result files, as before the environment seam reached the agent loop."""
    from rcgrpo.bfcl.tasks import get_task
    from rcgrpo.envs.bfcl.experts import expert
    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import evaluate, flat_metrics

    class Replay:  # the expert's messages as the model's, through the real agent loop
        def rollout(self, tasks, reward_tokens, protocol, seed):
            from rcgrpo.data.ceiling import replay

            out = [replay(t, renderer, protocol, Limits(256, 8192), True, tok)[0]
                   for t, tok in zip(tasks, reward_tokens, strict=True)]  # fmt: skip
            return out

    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    tiny = load_policy(ModelConfig(profile="tiny"))
    renderer = Renderer(tiny.tokenizer, tiny.stop_id)
    tasks = [get_task("multi_turn_base_0"), get_task("multi_turn_miss_func_3")]
    assert all(expert(t, "bfcl").reward == 1 for t in tasks)
    cfg = EvalConfig(protocol="bfcl", tokens=("high", "low"), out_dir=str(tmp_path))
    report = evaluate(Replay(), cfg, tasks=tasks, environment=BFCL)
    names = set(flat_metrics(report))
    cells = (
        "pooled",
        "pooled_low",
        "pooled_high",
        "category_mean",
        "seed_mean",
        "base",
        "miss_func",
    )
    want = {f"eval/{c}/{t}/{x}" for c in ("paper", "bfcl") for t in ("high", "low") for x in cells}
    want |= {"eval/paper/gap", "eval/bfcl/gap"}
    want |= {f"eval/combined_protocol/{c}/high/{x}" for c in ("paper", "bfcl") for x in cells}
    assert names == want and report["runs"]["high"][0]["paper"]["pooled"]["value"] == 1.0
    line = json.loads((tmp_path / "outcomes.jsonl").read_text().splitlines()[0])
    assert list(line) == ["task_id", "category", "token", "seed", "protocol", "paper", "bfcl",
                          "calls", "reasons"]  # fmt: skip
    assert set(line["reasons"]) == {"paper", "bfcl", "stop"}
    assert set(line["reasons"]["paper"]) == {"passed", "failing_turn", "reason"}
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*_result.json"))
    assert files == sorted(
        f"bfcl_results/rcgrpo-{t}-s0{p}/multi_turn/BFCL_v4_multi_turn_{c}_result.json"
        for t, p in (("high", ""), ("high", "-combined"), ("low", ""))
        for c in ("base", "miss_func")
    )


def test_the_environment_travels_to_a_worker_with_its_limits(tmp_path, monkeypatch):
    """A Ray rollout worker gets the run's environment pickled in its RolloutSpec (nothing in
    an env var): unpickled in a fresh process, BFCL's sandbox limits are that process's."""
    import pickle
    import subprocess
    import sys

    from rcgrpo.bfcl import limits
    from rcgrpo.envs import get
    from rcgrpo.envs.config import EnvConfig
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import RolloutSpec

    monkeypatch.setattr(limits, "_chosen", [])  # this process's limits back after the test
    env = get(EnvConfig(tool_timeout_s=1.5, message_timeout_s=7.0))
    spec = RolloutSpec(ModelConfig(profile="tiny"), None, RolloutConfig(), env)
    (tmp_path / "spec.pkl").write_bytes(pickle.dumps(spec))
    code = (
        "import pickle, sys; from rcgrpo.bfcl import limits; "
        "spec = pickle.loads(open(sys.argv[1], 'rb').read()); c = limits.configured(); "
        "print(spec.env.name, spec.env.task('multi_turn_base_0').id, c.tool_timeout_s, c.message_timeout_s)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "spec.pkl")],
                         capture_output=True, text=True, check=True, timeout=600)  # fmt: skip
    assert out.stdout.split() == ["bfcl", "multi_turn_base_0", "1.5", "7.0"]

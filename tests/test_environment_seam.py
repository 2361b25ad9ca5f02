"""A second environment through the seam (rcgrpo.rollout.environment): a calculator task set
runs one RL step through the same Trainer and one evaluation through the same `evaluate`, and
BFCL satisfies the same protocols. docs/environments.md walks through it.

    .venv/bin/pytest tests/test_environment_seam.py -q
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from test_trainer import tiny_policy

from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.rollout.environment import Environment, Episode, Rewards, Scorer

# -- the toy environment: "a + b = ?", one tool add(a, b); ~50 lines --------------------------
CHARS = "0123456789+     "  # token id -> character (the tiny model's 16 ids)
ADD_DOC = {"name": "add", "description": "a + b", "parameters": {"a": "int", "b": "int"}}


@dataclass(frozen=True)
class CalcTask:
    id: str
    a: int
    b: int
    category: str = "add"


@dataclass
class CalcEpisode:
    """One turn; a message "x+y" calls add(x, y), any other message answers (its last digit)."""

    task: CalcTask
    step_limit: int = 2
    steps: int = 0
    answer: int | None = None
    calls: list = field(default_factory=list)

    def begin_turn(self, turn=None) -> list[dict]:
        return [{"role": "user", "content": f"{self.task.a} + {self.task.b} = ?"}]

    def tool_docs(self) -> list[dict]:
        return [ADD_DOC]

    @property
    def steps_left(self) -> int:
        return self.step_limit - self.steps

    def step(self, text: str):
        self.steps += 1
        if m := re.search(r"(\d)\+(\d)", text):
            self.calls.append(f"add({m[1]}, {m[2]})")
            return SimpleNamespace(
                calls=[self.calls[-1]], observations=[str(int(m[1]) + int(m[2]))]
            )
        digits = re.findall(r"\d", text)
        self.answer = int(digits[-1]) if digits else None
        return SimpleNamespace(calls=[], observations=[])


def calc_score(task: CalcTask, rollout) -> Rewards:
    correct = int(rollout.answer == task.a + task.b)
    used = int(bool(rollout.calls[0]))  # calls: per turn, per step, call strings
    return Rewards(float(correct), {"correct": correct, "used_add": used})


class Calculator:
    name = "calculator"

    def tasks(self, split: str) -> list[CalcTask]:
        return [CalcTask(f"calc_{i}", i % 3, i // 3) for i in range(6)]

    def episode(self, task: CalcTask, protocol: str = "") -> CalcEpisode:
        return CalcEpisode(task)

    def scorer(self, protocol: str = "", reward: str | None = None) -> Scorer:
        return calc_score


TOY = Calculator()


class CalcEngine:
    """Drives toy episodes with the live tiny policy: 3 sampled tokens per message, the tool's
    answer appended as unsampled tokens; seeded per episode like Engine.rollout."""

    def __init__(self, policy, env: Environment):
        self.policy, self.env, self.synced = policy, env, 0

    def sync(self, policy):
        self.synced += 1

    @torch.no_grad()
    def rollout(self, tasks, reward_tokens, protocol, seed, first_index=0):
        out = []
        for i, (task, tok) in enumerate(zip(tasks, reward_tokens, strict=True)):
            g = torch.Generator().manual_seed(seed * 10_007 + first_index + i)
            ep = self.env.episode(task, protocol)
            ep.begin_turn()
            ids = [task.a, 10, task.b] + {HIGH: [14], LOW: [15]}.get(tok, [])
            mask, logps = [0] * len(ids), [0.0] * len(ids)
            while ep.steps_left > 0:
                for _ in range(3):
                    p = torch.softmax(
                        self.policy.model(input_ids=torch.tensor([ids])).logits[0, -1], -1
                    )
                    nxt = int(torch.multinomial(p, 1, generator=g))
                    ids, mask, logps = ids + [nxt], mask + [1], logps + [float(p[nxt].log())]
                result = ep.step("".join(CHARS[t] for t in ids[-3:]))
                if not result.calls:
                    break
                shown = [CHARS.index(c) for c in result.observations[0][-1]]
                ids, mask, logps = ids + shown, mask + [0], logps + [0.0]
            calls = [[[c] for c in ep.calls]]  # one turn; one call per step
            out.append(
                SimpleNamespace(
                    ids=ids,
                    loss_mask=mask,
                    logprobs=logps,
                    calls=calls,
                    answer=ep.answer,
                    stop_reason="done",
                    reward_token=tok,
                )
            )
        return out


# -- the seam, tested --------------------------------------------------------------------------
def test_bfcl_and_the_toy_satisfy_the_protocols():
    from rcgrpo.bfcl.tasks import get_task
    from rcgrpo.rollout.bfcl_environment import BFCL

    for env in (BFCL, TOY):
        assert isinstance(env, Environment)
        task = env.tasks("test")[0] if env is TOY else get_task("multi_turn_base_0")
        episode = env.episode(task, "bfcl")
        assert isinstance(episode, Episode) and isinstance(env.scorer("bfcl"), Scorer)
        assert episode.begin_turn() and episode.tool_docs() and episode.steps_left > 0


def test_one_rl_step_trains_on_the_toy_scorer(tmp_path):
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.core_algos import group_advantages
    from rcgrpo.training.grpo.trainer import Trainer

    policy = tiny_policy()
    cfg = RLConfig(
        out_dir=str(tmp_path),
        tasks_per_step=3,
        group_size=4,
        lr=5e-3,
        steps=1,
        save_every=0,
        micro_batch_size=6,
    )
    seen = []
    trainer = Trainer(
        policy,
        CalcEngine(policy, TOY),
        TOY.tasks("train"),
        cfg,
        score_fn=TOY.scorer(cfg.protocol),
        on_rollouts=lambda s, o: seen.append((o, list(o.records))),
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    m = trainer.train_step(1)
    ((out, records),) = seen
    # each rollout scored by the toy scorer: checked against what its episode saw
    flat_tasks = [t for t in out.tasks for _ in range(4)]
    assert [s.checks for s in out.scores] == [
        {"correct": int(r.answer == t.a + t.b), "used_add": int(r.calls != [[]])}
        for t, r in zip(flat_tasks, records, strict=True)
    ]
    correct = torch.tensor([s.checks["correct"] for s in out.scores], dtype=torch.float32)
    assert torch.equal(out.rewards, correct.view(3, 4))  # (n, G): Rewards.train by group
    assert torch.allclose(out.advantages, group_advantages(out.rewards, "grpo").flatten())
    assert 0 < correct.sum() < 12  # the groups carry a signal: the update has something to do
    assert 0 < sum(s.checks["used_add"] for s in out.scores) < 12  # the tool path ran too
    assert m["reward/mean"] == float(correct.mean())
    assert "reward/other_checker_mean" not in m  # rl.reward ("paper") is no toy check
    assert m["loss/optimizer_steps"] == 1 and trainer.engine.synced == 1
    assert any(
        not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True)
    )


def test_one_evaluation_reports_the_toy_checks_by_name(tmp_path):
    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import evaluate, flat_metrics

    policy, tasks = tiny_policy(), TOY.tasks("test")
    cfg = EvalConfig(
        protocol="bfcl",
        other_protocol=False,
        tokens=("high", "low"),
        seeds=(0,),
        out_dir=str(tmp_path),
    )
    report = evaluate(CalcEngine(policy, TOY), cfg, tasks=tasks, environment=TOY)
    rows = [json.loads(x) for x in (tmp_path / "outcomes.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(set(r) >= {"correct", "used_add"} for r in rows)
    flat = flat_metrics(report)
    for token in ("high", "low"):
        mine = [r for r in rows if r["token"] == token]
        for check in ("correct", "used_add"):
            assert flat[f"eval/{check}/{token}/pooled"] == sum(r[check] for r in mine) / 6
            assert flat[f"eval/{check}/{token}/add"] == sum(r[check] for r in mine) / 6
    assert not any(k.startswith(("eval/paper", "eval/bfcl")) for k in flat)
    assert set(report["gap"]) == {"correct", "used_add"}
    assert not (tmp_path / "bfcl_results").exists()  # bfcl-eval's files are BFCL's alone


def test_bfcl_scorer_names_its_checks_and_trains_on_rl_reward():
    from rcgrpo.bfcl.checkers import ground_truth_calls
    from rcgrpo.bfcl.tasks import get_task
    from rcgrpo.rollout.bfcl_environment import BFCL
    from rcgrpo.training.grpo.metrics import other_check

    task = get_task("multi_turn_base_0")
    replayed = BFCL.scorer("bfcl")(task, SimpleNamespace(calls=ground_truth_calls(task)))
    assert (replayed.train, dict(replayed.checks)) == (1.0, {"paper": 1, "bfcl": 1})
    carried = SimpleNamespace(trajectory=SimpleNamespace(paper_reward=1, bfcl_reward=0))
    assert BFCL.scorer("bfcl", "paper")(task, carried).train == 1.0
    assert BFCL.scorer("bfcl", "bfcl")(task, carried).train == 0.0
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

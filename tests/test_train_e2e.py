"""End to end on the tiny profile: RCTP-FT from a JSONL file, then RC-GRPO through the real
transformers engine, killed after a checkpoint and resumed (slow: ~1 min on 2 cores)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_rctp_then_rcgrpo_with_exact_resume(tmp_path):
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import write_jsonl
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.envs.bfcl.experts import expert
    from rcgrpo.envs.bfcl.perturbations import perturbations
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer
    from rcgrpo.training.sft import run_sft
    from rcgrpo.training.sft_config import SFTConfig

    tasks = [t for t in tasks_in("train") if t.category == "base"][:2]
    records = [expert(t, "combined") for t in tasks] + [perturbations(tasks[0], "combined")[0]]
    write_jsonl(tmp_path / "rctp.jsonl", records)
    sft_cfg = SFTConfig(data=str(tmp_path / "rctp.jsonl"), out_dir=str(tmp_path / "rctp"),
                        batch_size=3, micro_batch_size=3, epochs=1, lr=1e-3)  # fmt: skip
    final = run_sft(sft_cfg, ModelConfig(), BFCL)
    assert (final / "rcgrpo_policy.json").exists()
    assert json.loads((tmp_path / "rctp" / "metrics.json").read_text())["sft/loss"] > 0

    rollout_cfg = RolloutConfig(max_new_tokens=12, max_total_tokens=1024, max_steps=2)
    cfg = RLConfig(steps=2, tasks_per_step=2, group_size=2, lr=1e-4, save_every=1,
                   token_sampling="stratified", micro_batch_size=2)  # fmt: skip

    def trainer(out):
        from rcgrpo.envs.bfcl.environment import BFCL

        policy = load_policy(ModelConfig(), adapter_path=final)
        run = RLConfig(**{**cfg.__dict__, "out_dir": str(out)})
        return Trainer(
            policy, make_engine(rollout_cfg, policy, BFCL), tasks, run, BFCL.scorer(run.protocol)
        )

    def same(m):
        return {k: v for k, v in m.items() if not k.startswith("perf/")}

    full = trainer(tmp_path / "full").train()
    cut = trainer(tmp_path / "cut").train(stop_after=1)  # checkpoint at 1, then "killed"
    assert [same(m) for m in cut] == [same(m) for m in full[:1]]
    resumed = trainer(tmp_path / "cut").train(resume=True)  # a fresh process: reload, resume
    assert len(resumed) == 1 and same(resumed[0]) == same(full[1])
    assert full[0]["rollout/logprob_gap"] < 1e-3  # the engine serves the weights we train
    assert {"reward/mean_high", "reward/mean_low"} <= set(full[0])

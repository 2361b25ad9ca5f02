"""Defaults a GPU user can trust: the learning rate per training mode (LoRA vs full fine-tune)
in the paper preset, one trainable set in RL whatever the engine (the reward-token rows frozen,
written in the run's tags), and a served base that carries the LM head's reward-token rows too.

    .venv/bin/pytest tests/test_gpu_defaults.py -q
"""

from __future__ import annotations

import torch

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig


def test_the_paper_preset_trains_lora_at_ten_times_the_full_fine_tune_rate():
    from rcgrpo.cli.plan import resolve

    cfg = resolve("paper", [], "qwen2.5-7b-instruct")
    assert cfg["model"].lora is None  # the profile's: LoRA
    assert (cfg["rl"].lr, cfg["rl"].lr_lora) == (1e-6, 1e-5)
    assert (cfg["finetune"].lr, cfg["finetune"].lr_lora) == (1e-5, 1e-4)


def _trainer(policy, rl):
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo.trainer import Trainer

    engine = make_engine(RolloutConfig(max_new_tokens=8, max_total_tokens=1400), policy, BFCL)
    return Trainer(policy, engine, tasks_in("train")[:2], rl, BFCL.scorer(rl.protocol)), engine


def test_the_optimizer_takes_the_rate_of_the_policys_training_mode_and_rl_freezes_the_rows(
    tmp_path,
):
    from rcgrpo.models.lora import freeze_reward_rows
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.run import rl_tags

    rl = RLConfig(lr=1e-3, lr_lora=7e-3, out_dir=str(tmp_path / "rl"))
    full = ModelConfig(profile="tiny")
    trainer, engine = _trainer(load_policy(full), rl)
    with engine:
        assert trainer.optimizer.param_groups[0]["lr"] == 1e-3
    lora = ModelConfig(profile="tiny", lora=True, lora_r=4)
    policy = load_policy(lora)
    assert any(
        "trainable_tokens" in n for n, p in policy.model.named_parameters() if p.requires_grad
    )
    assert freeze_reward_rows(policy) > 0  # run_rl does this under every engine, before the Trainer
    trainer, engine = _trainer(policy, rl)  # its reference adapter must not unfreeze them
    with engine:
        assert trainer.optimizer.param_groups[0]["lr"] == 7e-3
        names = {id(p): n for n, p in policy.model.named_parameters()}
        assert not [names[id(p)] for p in trainer.params if "trainable_tokens" in names[id(p)]]
    assert rl_tags(rl, lora) == {
        "rl.training_mode": "lora",
        "rl.reward_rows": "frozen",
        "rl.lr_used": "0.007",
    }
    assert rl_tags(rl, full)["rl.lr_used"] == "0.001"


def test_the_served_base_carries_the_lm_head_reward_rows(tmp_path):
    """qwen-shape has an untied head (as Qwen2.5-7B): both rows reach the served folder."""
    from transformers import AutoModelForCausalLM

    from rcgrpo.models.export import export_for_serving, head_rows, reward_rows

    policy = load_policy(ModelConfig(profile="qwen-shape", lora=True, lora_r=4))
    ids = list(policy.reward_token_ids.values())
    with torch.no_grad():  # as a full fine-tune of the rows would leave them: not the mean init
        policy.model.get_output_embeddings().weight[ids] = torch.randn(2, 64)
    folder = export_for_serving(policy, tmp_path / "base")
    served = AutoModelForCausalLM.from_pretrained(folder)
    torch.testing.assert_close(served.get_output_embeddings().weight[ids], head_rows(policy))
    torch.testing.assert_close(served.get_input_embeddings().weight[ids], reward_rows(policy))


def test_a_tied_head_is_seen_as_tied_every_time_so_one_run_exports_one_served_base():
    """peft rebuilds a wrapped embedding's weight on each read: the tie check must not compare
    the addresses of two fresh tensors (it then flipped between calls and a run exported the
    same ~15 GB base twice under two keys)."""
    from rcgrpo.models.export import head_rows
    from rcgrpo.models.serving import base_key

    tied = load_policy(ModelConfig(profile="tiny", lora=True, lora_r=8))
    assert [head_rows(tied) for _ in range(20)] == [None] * 20
    assert len({base_key(tied) for _ in range(20)}) == 1
    untied = load_policy(ModelConfig(profile="qwen-shape", lora=True, lora_r=4))
    assert head_rows(untied).shape == (2, 64)

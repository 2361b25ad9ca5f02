"""RCTP-FT / SFT training loop on a tiny random model (rcgrpo.training.sft)."""

from __future__ import annotations

import torch
from toy_models import tiny_llama

from rcgrpo.chat.record import HIGH, LOW, Provenance, Trajectory
from rcgrpo.training.sft import batch_schedule, goal_for, select, summed_ce, train_sft
from rcgrpo.training.sft_config import SFTConfig


def tiny_model(seed=0):
    return tiny_llama(32, seed)


def examples(n=8):
    """Prompt tokens (mask 0) then an 'assistant' answer (mask 1) that depends on the prompt."""
    out = []
    for i in range(n):
        prompt = torch.tensor([1, 2 + i % 4, 3])
        answer = torch.tensor([10 + i % 4, 20, 2])
        out.append((torch.cat([prompt, answer]), torch.tensor([0, 0, 0, 1, 1, 1])))
    return out


def record(reward, token=None):
    return Trajectory(
        "multi_turn_base_0",
        "base",
        "train",
        "bfcl",
        [],
        [],
        reward,
        reward,
        Provenance("expert" if reward else "perturbation:drop_call"),
        token,
    )


def test_modes_pick_records_and_goals():
    good, bad = record(1), record(0)
    assert select([good, bad], "sft") == [good] and select([good, bad], "rctp") == [good, bad]
    assert goal_for(good, "sft") is None
    assert (goal_for(good, "rctp"), goal_for(bad, "rctp")) == (HIGH, LOW)
    assert goal_for(record(0, HIGH), "rctp") == HIGH  # an explicit label wins


def test_loss_is_only_on_assistant_tokens():
    model = tiny_model()
    ids, mask = examples(1)[0]
    ids, mask = ids[None], mask[None]
    attn = torch.ones_like(ids)
    assert summed_ce(model, ids, torch.zeros_like(mask), attn).item() == 0.0
    # the last token is only ever a target: with mask 0 its value cannot matter, with mask 1 it does
    other = ids.clone()
    other[0, -1] = 5
    m0 = mask.clone()
    m0[0, -1] = 0
    assert summed_ce(model, other, m0, attn).item() == summed_ce(model, ids, m0, attn).item()
    assert summed_ce(model, other, mask, attn).item() != summed_ce(model, ids, mask, attn).item()


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    a, b = tiny_model(), tiny_model()
    data = examples(8)
    # uneven answer lengths so a per-micro-batch mean would weigh tokens differently
    data[0] = (
        torch.cat([data[0][0], torch.tensor([20, 20])]),
        torch.cat([data[0][1], torch.ones(2, dtype=torch.long)]),
    )
    common = dict(batch_size=8, epochs=1, lr=1e-2, warmup_ratio=0.0, out_dir=str(tmp_path))
    train_sft(a, data, SFTConfig(micro_batch_size=8, **common))
    train_sft(b, data, SFTConfig(micro_batch_size=2, **common))
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_training_learns_the_answers_and_resumes_exactly(tmp_path):
    data = examples(8)
    cfg = SFTConfig(
        batch_size=4,
        micro_batch_size=2,
        epochs=6,
        lr=3e-2,
        save_every=4,
        out_dir=str(tmp_path / "a"),
    )
    logged = []
    model = tiny_model()
    history = train_sft(model, data, cfg, log_metrics=lambda m, s: logged.append(s))
    assert len(history) == len(batch_schedule(8, cfg)) == 12 and logged == list(range(1, 13))
    assert history[-1]["sft/loss"] < 0.5 * history[0]["sft/loss"]
    assert {"sft/loss", "sft/lr", "sft/tokens_per_s", "sft/grad_norm"} <= set(history[0])

    # stop after step 6 (checkpoint at 4), resume: steps 5..12 match the uninterrupted run
    cut = SFTConfig(**{**cfg.__dict__, "out_dir": str(tmp_path / "b"), "epochs": 6})
    partial = tiny_model()
    train_sft(partial, data, cut)  # writes checkpoints at 4, 8, 12
    import shutil

    for step in (8, 12):  # pretend the run was killed after step 6
        shutil.rmtree(tmp_path / "b" / "checkpoints" / f"step_{step:06d}")
    resumed = train_sft(tiny_model(), data, cut, resume=True)
    assert len(resumed) == 8
    assert [m["sft/loss"] for m in resumed] == [m["sft/loss"] for m in history[4:]]


def test_masked_logits_equal_the_full_forward_and_lora_reaches_them():
    from peft import LoraConfig, get_peft_model

    from rcgrpo.training.forward import masked_logits

    ids = torch.tensor([[1, 5, 9, 3, 7, 2], [4, 4, 8, 1, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    targets = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])  # aligned with ids[:, 1:]
    base = tiny_model()
    lora = get_peft_model(tiny_model(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # B != 0: the adapter changes the output
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_()
    for model in (base, lora):
        full = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (B, T-1, V)
        logits, where = masked_logits(model, ids, attn, targets)
        assert logits.shape == (5, 32) and where.sum() == 5
        torch.testing.assert_close(logits, full[where], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(masked_logits(base, ids, attn, targets)[0], logits)  # LoRA acts

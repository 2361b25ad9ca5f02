"""Token-budget micro-batches: hand-computed groupings, the forward layouts (no
dense mask; packed rows), and the same loss and gradients as the padded micro-batches of
today's path, for RL (PPO mini-batches, KL) and SFT, over a length mix.

    .venv/bin/pytest tests/test_batching.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from toy_models import tiny_llama

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.training import forward
from rcgrpo.training.batching import (
    computed_tokens,
    fixed_micro_batches,
    micro_batches,
    pad_frac,
)
from rcgrpo.training.grpo.core_algos import minibatch_indices

L = [10, 40, 25, 40, 5, 12]  # 132 real tokens; longest first: 1, 3, 2, 5, 0, 4


def test_micro_batches_by_tokens_hand_computed():
    # padded: [1, 3] = 2 x 40 = 80; [2, 5, 0] = 3 x 25 = 75 (a 4th would cost 100); [4] = 5
    assert micro_batches(L, 80) == [[1, 3], [2, 5, 0], [4]]
    assert [computed_tokens(L, g) for g in micro_batches(L, 80)] == [80, 75, 5]
    assert pad_frac(L, micro_batches(L, 80)) == pytest.approx(1 - 132 / 160)
    # packed, first-fit decreasing: 40 + 40 fill the first bin, the rest share the second
    assert micro_batches(L, 80, packed=True) == [[1, 3], [2, 5, 0, 4]]
    assert pad_frac(L, micro_batches(L, 80, packed=True), packed=True) == 0.0
    # by count (today's split, in order): 3 x 40 + 3 x 40 computed for 132 real
    assert fixed_micro_batches(6, 3) == [[0, 1, 2], [3, 4, 5]]
    assert pad_frac(L, fixed_micro_batches(6, 3)) == pytest.approx(1 - 132 / 240)
    # a sequence longer than the budget is never cut: it runs alone
    assert micro_batches([100, 10, 10], 50) == [[0], [1, 2]]
    assert micro_batches([100, 10, 10], 50, packed=True) == [[0], [1, 2]]
    assert micro_batches([], 50) == [] and pad_frac([], []) == 0.0
    with pytest.raises(ValueError, match="max_tokens"):
        micro_batches(L, 0)


def test_micro_batches_capped_by_sampled_positions_hand_computed():
    """L (longest first: 1, 3, 2, 5, 0, 4) with S sampled positions each: a cap of 30 splits
    what the token budget alone keeps together (the LM head's work grows with the sampled share)."""
    S = [10, 30, 5, 10, 1, 1]
    # padded, budget 80: 1 holds 30 sampled, alone; [3, 2] = 2 x 40 tokens, 15 sampled; 5 starts
    # a run (3 x 40 > 80): [5, 0, 4] = 3 x 12 tokens, 1 + 10 + 1 sampled
    assert micro_batches(L, 80, sampled=S, max_sampled=30) == [[1], [3, 2], [5, 0, 4]]
    # packed (bins of 80 tokens, 30 sampled; first fit decreasing): bin 0 = [1] is full of
    # sampled positions; [3, 2, 5] = 77 tokens, 16 sampled; 0 (10 tokens) fits neither
    assert micro_batches(L, 80, True, S, 30) == [[1], [3, 2, 5], [0, 4]]
    # no cap (0) or no counts: the token budget alone
    assert micro_batches(L, 80, sampled=S) == micro_batches(L, 80) == [[1, 3], [2, 5, 0], [4]]
    # a sequence over the cap runs alone
    assert micro_batches([10, 10], 100, sampled=[50, 1], max_sampled=20) == [[0], [1]]


def test_minibatch_indices_by_tokens_keeps_the_mini_batches():
    lengths = [7, 30, 12, 12, 50, 3, 8, 21, 40, 9, 16, 5]
    args = (12, 6, 3, 2)  # n, mini-batch, micro-batch, passes
    count = minibatch_indices(*args, torch.Generator().manual_seed(1))
    tokens = minibatch_indices(*args, torch.Generator().manual_seed(1), lengths, 60)
    for a_pass, b_pass in zip(count, tokens, strict=True):
        for a, b in zip(a_pass, b_pass, strict=True):  # the same rollouts per optimizer step
            assert sorted(torch.cat(a).tolist()) == sorted(torch.cat(b).tolist())
            for c in b:  # within the budget, or a single rollout
                assert len(c) == 1 or len(c) * max(lengths[i] for i in c.tolist()) <= 60
    with pytest.raises(ValueError, match="lengths"):
        minibatch_indices(12, 6, 3, 1, None, None, 60)


def right_padded_batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (3, 12), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 7:], attn[2, 9:] = 0, 0  # lengths 12, 7, 9
    mask = torch.zeros(3, 11)
    mask[0, 4:9], mask[1, 3:6], mask[2, 5:8] = 1, 1, 1
    return ids, attn, mask


def padded_logits(model, ids, attn, mask):
    """Today's forward: the padded rows with their attention mask, full logits."""
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
    return logits[mask.bool()]


def test_sdpa_layout_runs_causal_kernels_without_a_mask(monkeypatch):
    model = tiny_llama(16, seed=3)
    assert model.config._attn_implementation == "sdpa" and not forward.packs(model)
    ids, attn, mask = right_padded_batch()
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):  # records what transformers hands the kernel, then calls it
        seen.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    logits, where = forward.masked_logits(model, ids, attn, mask)
    assert seen and all(m is None and causal for m, causal in seen)  # no (B, 1, T, T) mask
    seen.clear()
    reference = padded_logits(model, ids, attn, mask)
    assert seen and all(m is not None for m, _ in seen)  # today's path: a dense mask
    torch.testing.assert_close(logits, reference, rtol=0, atol=1e-6)
    # left padding (generation's) keeps its mask
    left = torch.flip(attn, [1])
    assert "attention_mask" in forward.decoder_inputs(model, ids, left)[0]


def test_packed_layout_gives_the_padded_logits(monkeypatch):
    """The flash-attention layout: one padding-free row, positions restarting per sequence.
    flash-attn has no CPU build, so the layout is switched to packed over SDPA (forward._impl
    says flash); transformers reads the restarting position ids as packed sequences (a
    block-causal mask on SDPA, the varlen kernel on flash)."""
    model = tiny_llama(16, seed=3)
    ids, attn, mask = right_padded_batch()
    monkeypatch.setattr(forward, "_impl", lambda m: "flash_attention_2")
    kwargs, index = forward.decoder_inputs(model, ids, attn)
    assert kwargs["input_ids"].shape == (1, 28) and "attention_mask" not in kwargs
    assert kwargs["position_ids"][0].tolist() == [*range(12), *range(7), *range(9)]
    logits, _ = forward.masked_logits(model, ids, attn, mask)
    torch.testing.assert_close(logits, padded_logits(model, ids, attn, mask), rtol=0, atol=1e-6)


class MixEngine:
    """Rollouts of a length mix (prompts of 3-45 tokens by task, 4 sampled tokens each) from the
    live policy, seeded per call, as test_trainer.ToyEngine."""

    def __init__(self, policy):
        self.policy = policy

    def sync(self, policy):
        pass

    @torch.no_grad()
    def rollout(self, tasks, reward_tokens, protocol, seed, first_index=0):  # one process: 0
        g = torch.Generator().manual_seed(seed)
        out = []
        for task, _tok in zip(tasks, reward_tokens, strict=True):
            prompt = [1 + (task.number + k) % 13 for k in range(3 + 7 * task.number)]
            ids, logps = list(prompt), [0.0] * len(prompt)
            for _ in range(4):
                p = torch.softmax(
                    self.policy.model(input_ids=torch.tensor([ids])).logits[0, -1], -1
                )
                nxt = int(torch.multinomial(p, 1, generator=g))
                ids.append(nxt)
                logps.append(float(p[nxt].log()))
            r = int(7 in ids[len(prompt) :])
            out.append(SimpleNamespace(
                ids=ids, loss_mask=[0] * len(prompt) + [1] * 4, logprobs=logps, calls=[],
                stop_reason="done", trajectory=SimpleNamespace(reward=r, checks={"paper": r, "bfcl": r}, reward_reason={}),
            ))  # fmt: skip
        return out


def rl_run(tmp_path, **over):
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    policy = SimpleNamespace(model=tiny_llama(16, seed=0), tokenizer=None)
    tasks = [SimpleNamespace(id=f"mix_{i}", number=i) for i in range(6)]
    cfg = RLConfig(
        out_dir=str(tmp_path), tasks_per_step=6, group_size=2, steps=2, lr=5e-3, save_every=0,
        mini_batch_size=6, micro_batch_size=3, inner_epochs=2, **over,
    )  # fmt: skip
    history = Trainer(policy, MixEngine(policy), tasks, cfg, BFCL.scorer(cfg.protocol)).train()
    return policy.model, history


def test_rl_token_budget_equals_padded_micro_batches(tmp_path):
    """2 RL steps x 2 PPO passes x 2 mini-batches, KL on: micro-batches of 3 rollouts padded
    to their longest vs micro-batches of <= 64 tokens sorted by length: same metrics, same
    weights to 1e-6, far less padding (the padded forward: a shared-prefix one pads nothing)."""
    count_model, count = rl_run(tmp_path / "count", shared_prefix=False)
    budget_model, budget = rl_run(
        tmp_path / "budget", max_tokens_per_micro_batch=64, shared_prefix=False
    )
    for a, b in zip(count, budget, strict=True):
        for key in a:
            if not key.startswith(("perf/", "train/")):
                assert a[key] == pytest.approx(b[key], abs=1e-6), key
    assert count[-1]["loss/grad_norm"] > 0 and count[-1]["loss/optimizer_steps"] == 4
    for p, q in zip(count_model.parameters(), budget_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    assert all(
        b["train/pad_frac"] < 0.5 * a["train/pad_frac"] for a, b in zip(count, budget, strict=True)
    )


def test_rl_sampled_cap_splits_micro_batches_and_keeps_the_update(tmp_path):
    """The same 2 RL steps under the token budget, with and without a cap of 8 sampled
    positions per micro-batch: more micro-batches, the same weights to 1e-6."""
    free_model, free = rl_run(tmp_path / "free", max_tokens_per_micro_batch=64)
    cap_model, cap = rl_run(
        tmp_path / "cap", max_tokens_per_micro_batch=64, max_sampled_per_micro_batch=8
    )
    for a, b in zip(free, cap, strict=True):
        for key in a:
            if not key.startswith(("perf/", "train/")):
                assert a[key] == pytest.approx(b[key], abs=1e-6), key
    for p, q in zip(free_model.parameters(), cap_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    assert free[-1]["loss/grad_norm"] > 0
    assert all(
        b["train/micro_batches"] > a["train/micro_batches"] for a, b in zip(free, cap, strict=True)
    )


def test_ppo_update_gradient_equals_todays_padded_path():
    """One optimizer step's gradient through update.ppo_updates with token-budget micro-batches
    equals today's formulation written out: micro-batches of 4 rollouts sliced from the batch
    padded to its longest rollout, attention mask on, full logits."""
    from rcgrpo.training import distributed
    from rcgrpo.training.grpo import update
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.core_algos import policy_loss, token_logprobs

    model = tiny_llama(16, seed=2).train()
    engine = MixEngine(SimpleNamespace(model=model))
    rollouts = engine.rollout([SimpleNamespace(number=i % 6) for i in range(8)], [None] * 8, "", 0)
    batch = update.to_batch(rollouts)
    adv = torch.linspace(-1, 1, 8)
    old = (-torch.rand(batch.mask.shape, generator=torch.Generator().manual_seed(1))) * batch.mask
    ref = old - 0.1 * batch.mask
    cfg = RLConfig(max_tokens_per_micro_batch=64)
    lengths = [len(r.ids) for r in rollouts]
    passes = minibatch_indices(8, 0, 4, 1, None, lengths, 64)
    assert len(passes[0][0]) > 2  # the budget really regroups the 8 rollouts

    def logprob_fn(m, ids, attn, mask):
        return update.logprobs(m, ids, attn, mask)

    ranks = distributed.Single(model, list(model.parameters()))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # a step that leaves the weights
    stats = update.ppo_updates(model, opt, ranks, batch, old, ref, adv, passes, cfg, logprob_fn)
    new = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    total, mask = batch.mask.sum(), batch.mask
    loss_sum = 0.0
    for c in torch.arange(8).split(4):  # today's path
        logits = model(input_ids=batch.ids[c], attention_mask=batch.attn[c]).logits[:, :-1]
        logp = token_logprobs(logits.float(), batch.ids[c, 1:]) * mask[c]
        loss, _ = policy_loss(logp, old[c], adv[c], mask[c], ref[c])
        (loss * mask[c].sum() / total).backward()
        loss_sum += float(loss.detach() * mask[c].sum() / total)
    assert stats[0]["total"] == pytest.approx(loss_sum, abs=1e-6)
    for g, p in zip(new, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=1e-6)


def sft_examples():
    out = []
    for i in range(12):  # prompts of 3-36 tokens, answers of 3-5: a length mix
        prompt = torch.tensor([1 + (i + k) % 9 for k in range(3 + 3 * i)])
        answer = torch.tensor([10 + i % 4, 11] + [12] * (i % 3) + [2])
        out.append(
            (torch.cat([prompt, answer]), torch.tensor([0] * len(prompt) + [1] * len(answer)))
        )
    return out


def test_sft_token_budget_equals_padded_micro_batches(tmp_path):
    from rcgrpo.training.sft import train_sft
    from rcgrpo.training.sft_config import SFTConfig

    runs = {}
    for name, over in (("count", {}), ("budget", {"max_tokens_per_micro_batch": 48})):
        model = tiny_llama(16, seed=0)
        cfg = SFTConfig(batch_size=6, micro_batch_size=2, epochs=2, lr=1e-2, out_dir=str(tmp_path),
                        warmup_ratio=0.0, **over)  # fmt: skip
        runs[name] = (model, train_sft(model, sft_examples(), cfg))
    (a_model, a), (b_model, b) = runs["count"], runs["budget"]
    assert [m["sft/loss"] for m in a] == pytest.approx([m["sft/loss"] for m in b], abs=1e-6)
    assert [m["sft/grad_norm"] for m in a] == pytest.approx(
        [m["sft/grad_norm"] for m in b], abs=1e-6
    )
    for p, q in zip(a_model.parameters(), b_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    assert sum(m["train/pad_frac"] for m in b) < 0.5 * sum(m["train/pad_frac"] for m in a)


def test_attention_is_chosen_per_device(monkeypatch):
    import importlib.util

    from rcgrpo.models.device import attention_implementation
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    assert attention_implementation(ModelConfig()) == "sdpa"  # the CPU
    assert attention_implementation(ModelConfig(attention="eager")) == "eager"
    with pytest.raises(ValueError, match="ModelConfig.attention=flash: must be one of auto"):
        ModelConfig(attention="flash")
    real = importlib.util.find_spec  # flash-attn has no CPU build: say it is installed
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "flash_attn" else real(name, *a))  # fmt: skip
    gpu = ModelConfig(device="cuda", dtype="bfloat16")
    assert attention_implementation(gpu) == "flash_attention_2"
    assert attention_implementation(ModelConfig(device="cuda")) == "sdpa"  # float32: no kernels
    monkeypatch.undo()
    assert attention_implementation(gpu) == "sdpa"  # not installed
    policy = load_policy(ModelConfig(profile="tiny", lora=True))  # the trainers read it here
    assert policy.model.training_attention == "sdpa"
    assert policy.model.config._attn_implementation == "sdpa"


def test_training_attention_holds_over_the_update_and_switches_back():
    """The updates run with `training_attention` (flash on a GPU; eager stands in here), the
    engines keep the loaded implementation: switched for forward and backward, then back."""
    from rcgrpo.training.grpo import update

    model = tiny_llama(16, seed=3)
    model.training_attention = "eager"
    seen = []
    with forward.training_attention(model):
        seen.append(model.config._attn_implementation)
    assert seen == ["eager"] and model.config._attn_implementation == "sdpa"

    @forward.with_training_attention
    def probe(m):
        return m.config._attn_implementation

    assert probe(model) == "eager" and model.config._attn_implementation == "sdpa"
    assert update.ppo_updates.__wrapped__ and update.behaviour_logprobs.__wrapped__
    model.training_attention = "flash_attention_2"
    assert forward.packs(model)  # formation counts packed rows; the forward packs under flash
    assert "attention_mask" not in forward.decoder_inputs(model, *right_padded_batch()[:2])[0]

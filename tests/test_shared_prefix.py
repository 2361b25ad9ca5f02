"""The shared-prefix update: prefixes found from the ids and clusters weighed with attention
(hand-computed), the suffix kernels against a masked SDPA (values, gradients, and no mask kept
for the backward), and log-probs, loss and gradients equal to the unshared path for GRPO and
RC-GRPO groups, LoRA and full fine-tuning, with and without gradient checkpointing, on each
suffix kernel, and through a whole trainer step.

    .venv/bin/pytest tests/test_shared_prefix.py -q
"""

from __future__ import annotations

import pytest
import torch
from test_trainer import make

from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.training import shared_forward, suffix_attention
from rcgrpo.training.forward import training_attention
from rcgrpo.training.grpo import update
from rcgrpo.training.grpo.core_algos import policy_loss
from rcgrpo.training.shared_prefix import (
    cluster_cost,
    common_prefix,
    computed_tokens,
    pack,
    share_groups,
)
from rcgrpo.training.shared_prefix import micro_batches as shared_micro_batches


def test_common_prefix_by_hand():
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2, 3, 5]]) == 2
    assert common_prefix([[1, 2], [1, 2, 3]]) == 2  # one row is a prefix of the other
    assert common_prefix([[5, 1], [5, 2], [5, 3]]) == 1  # only the first token
    assert common_prefix([[4, 1], [5, 1]]) == 0
    assert common_prefix([[7, 8, 9]]) == 3 and common_prefix([]) == 0


def test_share_groups_computes_the_fewest_tokens():
    a, b, c = [1, 2, 3, 4], [1, 2, 3, 5, 6], [9, 9]
    # a and b share [1, 2, 3]: 3 + 1 + 2 = 6 tokens instead of 9; c stays alone (2)
    assert share_groups([c, a, b]) == [([1, 2], 3), ([0], 2)]
    assert computed_tokens([c, a, b]) == 8
    # two tasks sharing a 1-token system prompt: two clusters (3 + 1 + 1 each) beat one (1 + 12)
    rows = [[0, 1, 1, 1, 2], [0, 1, 1, 1, 3], [0, 4, 4, 4, 2], [0, 4, 4, 4, 3]]
    assert share_groups(rows) == [([0, 1], 4), ([2, 3], 4)]
    assert computed_tokens(rows) == 12
    # but one shared token over 3 rows is still worth sharing: 1 + 3 x 1
    assert share_groups([[5, 1], [5, 2], [5, 3]]) == [([0, 1, 2], 1)]


def test_attention_in_the_clusters_prefers_the_longer_prefix_by_hand():
    r0, r1 = [1] * 10 + [2, 2], [1] * 10 + [3, 3]  # 12 tokens each, sharing 10
    r2 = [1] * 6 + [4] * 6  # shares 6 with both
    # tokens only: all three (6 + 3 x 6 = 24) beat {r0, r1} + {r2} (10 + 2 + 2 + 12 = 26)
    assert share_groups([r0, r1, r2]) == [([0, 1, 2], 6)]
    # attention at 1 token per square: a cluster saves (k - 1)(P + P^2): 2 x 42 = 84 for all
    # three, 110 for {r0, r1}: 3 x (12 + 144) - 110 = 358 < 468 - 84 = 384
    assert share_groups([r0, r1, r2], attn=1.0) == [([0, 1], 10), ([2], 12)]
    assert cluster_cost([12, 12], 10, 1.0) == 14 + (100 + 2 * 44)  # tokens + squares
    assert cluster_cost([12], 12, 1.0) == 12 + 144  # a row alone


BLOCKS = [(0, 7, [(7, 5), (12, 3), (15, 6)]), (21, 4, []), (25, 3, [(28, 2)])]  # L = 30


def row_inputs(g, h=4, h_kv=2, d=8, length=30):
    """q (1, h, L, d), k and v (1, h_kv, L, d) of a packed row, as transformers passes them."""
    q = torch.randn(1, length, h, d, generator=g).transpose(1, 2).requires_grad_()
    k, v = (torch.randn(1, h_kv, length, d, generator=g).requires_grad_() for _ in "kv")
    return q, k, v


def masked_row(q, k, v, blocks):
    """The packed row's attention with explicit masks: a prefix causal, each suffix over
    [prefix; itself] with a bottom-right causal mask -> (1, L, h, d)."""
    parts = []
    for start, p, suffixes in blocks:
        pre = slice(start, start + p)
        kp, vp = k[:, :, pre], v[:, :, pre]
        sdpa = torch.nn.functional.scaled_dot_product_attention
        parts.append(sdpa(q[:, :, pre], kp, vp, is_causal=True, enable_gqa=True))
        for s, n in suffixes:
            mask = torch.arange(p + n)[None] <= p + torch.arange(n)[:, None]  # (n, P+n)
            keys, values = (
                torch.cat([kp, k[:, :, s : s + n]], 2),
                torch.cat([vp, v[:, :, s : s + n]], 2),
            )
            parts.append(sdpa(q[:, :, s : s + n], keys, values, attn_mask=mask, enable_gqa=True))
    return torch.cat(parts, 2).transpose(1, 2)


@pytest.mark.parametrize("kernel", ["merge", "lower_right"])
def test_suffix_kernels_equal_a_masked_attention_in_value_and_gradient(monkeypatch, kernel):
    assert suffix_attention.kernel("cpu") == "merge"  # what the CPU runs
    monkeypatch.setattr(suffix_attention, "kernel", lambda device: kernel)
    inputs = row_inputs(torch.Generator().manual_seed(0))
    grad = torch.randn(1, 30, 4, 8, generator=torch.Generator().manual_seed(1))
    results = []
    for fn in (masked_row, lambda *a: suffix_attention.packed(*a, None)):
        for t in inputs:
            t.grad = None
        out = fn(*inputs, BLOCKS)
        out.backward(grad)
        results.append([out.detach()] + [t.grad.clone() for t in inputs])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_merge_kernel_keeps_what_causal_attention_keeps():
    """The bytes autograd keeps for a packed row: the merge kernel keeps q, k, v, one output
    buffer (the one o_proj reads) and the log-sum-exp, like causal SDPA on a row, and no
    (n, P+n) mask; the masked calls keep a float32 mask per suffix, as big as the rest."""
    q, k, v = row_inputs(torch.Generator().manual_seed(0), length=330)
    blocks = [(0, 200, [(200, 40), (240, 50), (290, 40)])]
    kept = {}
    for name, fn in (
        ("masked", masked_row),
        ("merge", lambda *a: suffix_attention.packed(*a, None)),
    ):
        saved = {}

        def pack_hook(t, saved=saved):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
            fn(q, k, v, blocks)
        kept[name] = sum(saved.values())
    qkv = sum(t.numel() * 4 for t in (q, k, v))
    assert kept["merge"] == qkv + q.numel() * 4 + q[..., 0].numel() * 4  # + output, lse
    assert kept["masked"] > 1.5 * kept["merge"]


def test_the_shared_path_replaces_flash_attention_too_and_gives_it_back():
    """With flash-attn installed (CUDA) the update's training attention is flash_attention_2:
    sharing takes over (its kernels are PyTorch's own) and `enable(False)` restores it; eager
    attention is not shared."""
    from types import SimpleNamespace

    model = SimpleNamespace(
        training_attention="flash_attention_2", config=SimpleNamespace(_attn_implementation="sdpa")
    )
    assert shared_forward.enable(model, True)
    assert model.training_attention == shared_forward.NAME
    assert not shared_forward.enable(model, False)
    assert model.training_attention == "flash_attention_2"
    eager = SimpleNamespace(training_attention="eager", config=SimpleNamespace())
    assert not shared_forward.enable(eager, True) and eager.training_attention == "eager"


def test_pack_lays_out_prefix_then_suffixes_by_hand():
    rows = [[1, 2, 3, 4], [1, 2, 5], [8]]
    p = pack(rows, share_groups(rows), width=5)
    assert p.ids.tolist() == [1, 2, 3, 4, 5, 8]
    assert p.positions.tolist() == [0, 1, 2, 3, 2, 0]
    assert p.blocks == [(0, 2, [(2, 2), (4, 1)]), (5, 1, [])]
    assert p.index.tolist() == [[0, 1, 2, 3, -1], [0, 1, 4, -1, -1], [5, -1, -1, -1, -1]]


def test_micro_batches_count_computed_tokens_and_keep_groups_whole():
    g1 = [[1, 1, 1, 1, 2], [1, 1, 1, 1, 3], [1, 1, 1, 1, 4]]  # prefix 4, suffixes 1: 7 tokens
    g2 = [[2, 2, 2, 5, 6], [2, 2, 2, 7, 8]]  # prefix 3, suffixes 2: 7 tokens
    rows = g1 + g2
    # budget 14: both groups in one micro-batch (padded it would be 5 x 5 = 25 tokens)
    assert shared_micro_batches(rows, 14) == [[0, 1, 2, 3, 4]]
    # budget 7: one group each
    assert shared_micro_batches(rows, 7) == [[0, 1, 2], [3, 4]]
    # budget 6: g1 cut into runs that each recompute the prefix (4 + 1 + 1 = 6, 4 + 1 = 5); g2
    # (3 + 2 + 2 = 7 > 6) into two runs of 5; largest first, no two 5s fit in 6
    assert shared_micro_batches(rows, 6) == [[0, 1], [2], [3], [4]]
    # a cap of 2 sampled positions per micro-batch, 1 per row: g2 (7 tokens) first, g1 cut 2 + 1
    assert shared_micro_batches(rows, 14, [1] * 5, 2) == [[3, 4], [0, 1], [2]]
    with pytest.raises(ValueError, match="max_tokens"):
        shared_micro_batches(rows, 0)


def groups(kind: str, g: torch.Generator, vocab: int):
    """Rows (token lists) and loss masks of two groups of 5 plus one row of another task.
    grpo: a shared prompt, then different responses (sampled) and a tool result (not sampled);
    rc: a shared system prompt, then a goal token that differs inside the group (the prefix ends
    before it), then the rest of the prompt; first: rows sharing only their first token."""

    def rand(n):
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    rows, masks = [], []
    for task in range(2):
        head, tail = rand(9 + task), rand(6)
        for i in range(5):
            if kind == "grpo":
                prompt = head + tail
            elif kind == "rc":
                prompt = head + [1 + (i % 2)] + tail  # the goal token: two values in the group
            else:
                prompt = [0] + rand(4)
            out, tool, out2 = rand(3 + i), rand(2), rand(2 + task)
            rows.append(prompt + out + tool + out2)
            masks.append([0] * len(prompt) + [1] * len(out) + [0] * len(tool) + [1] * len(out2))
    rows.append(rand(7))
    masks.append([0] * 4 + [1] * 3)
    return rows, masks


def tensors(rows, masks):
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    attn, mask = torch.zeros_like(ids), torch.zeros(len(rows), T)
    for i, (r, m) in enumerate(zip(rows, masks, strict=True)):
        ids[i, : len(r)], attn[i, : len(r)], mask[i, : len(m)] = torch.tensor(r), 1, torch.tensor(m)
    return ids, attn, mask[:, 1:]


def loss_and_grads(model, ids, attn, mask, old, adv, shared: bool):
    """Log-probs (B, T-1), loss and gradients of the trained parameters, through update.logprobs
    (what the trainer's pi_old, reference and PPO forwards call)."""
    assert shared_forward.enable(model, shared) == shared
    model.zero_grad()
    with training_attention(model):  # over forward and backward, as ppo_updates
        logp, _, _ = update.logprobs(model, ids, attn, mask, temperature=0.7)
        loss, _ = policy_loss(logp, old, adv, mask, old * 0.9)
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    return logp.detach(), loss.item(), grads


@pytest.mark.parametrize("kind", ["grpo", "rc", "first"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_shared_update_equals_the_unshared_one(kind, lora, checkpointing):
    cfg = ModelConfig(
        profile="tiny", lora=lora, lora_r=4, lora_alpha=8, gradient_checkpointing=checkpointing
    )
    model = load_policy(cfg).model.train()
    if lora:  # a non-zero adapter, so that LoRA changes the forward
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(0)
    rows, masks = groups(kind, g, model.config.vocab_size)
    ids, attn, mask = tensors(rows, masks)
    old = -torch.rand(mask.shape, generator=g) * mask
    adv = torch.randn(len(rows), generator=g)
    base = loss_and_grads(model, ids, attn, mask, old, adv, shared=False)
    mine = loss_and_grads(model, ids, attn, mask, old, adv, shared=True)
    torch.testing.assert_close(mine[0], base[0], rtol=0, atol=1e-5)
    assert abs(mine[1] - base[1]) < 1e-5
    assert len(base[2]) > 0
    for a, b in zip(mine[2], base[2], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # sharing computed fewer tokens: the groups' prefixes once
    lengths = attn.sum(1).tolist()
    assert computed_tokens(rows) < sum(lengths) if kind != "first" else True


def test_a_trainer_step_with_token_budget_micro_batches_equals_the_unshared_one(tmp_path):
    out = {}
    for shared in (False, True):
        budget = dict(max_tokens_per_micro_batch=24, steps=1, kl_coef=0.1)
        trainer = make(tmp_path / str(shared), shared_prefix=shared, **budget)
        assert trainer.shared == shared
        metrics = trainer.train_step(1)
        weights = [p.detach().clone() for p in trainer.model.parameters()]
        out[shared] = metrics, weights
    (m0, w0), (m1, w1) = out[False], out[True]
    for k, v in m0.items():
        if not k.startswith("perf/"):
            assert m1[k] == pytest.approx(v, abs=1e-5), k
    for a, b in zip(w0, w1, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert m0["perf/update_tokens"] == m0["perf/update_tokens_unshared"]
    assert m1["perf/update_tokens"] < m1["perf/update_tokens_unshared"] == m0["perf/update_tokens"]


def test_plan_counts_the_shared_update_by_hand():
    from types import SimpleNamespace

    from rcgrpo.training.plan.sharing import shared_ratio

    # non-embedding params 1,000, one layer of q_dim 1: a forward is 2,000 x tokens + 2 x T^2
    arch = SimpleNamespace(params=lambda: 1040, vocab=10, hidden=2, tied=False, layers=1, q_dim=1)
    groups = [[[(100, 10)], [(100, 20)]]]  # one task, G = 2: 110 and 120 tokens
    out = shared_ratio(arch, groups, [[0, 1]], 0)
    # shared: prefix 100 - 64 = 36 once, suffixes 74 and 84; padded: 2 x 120
    assert (out["tokens"], out["unshared_tokens"]) == (194, 240)
    squares = 36**2 + (110**2 - 36**2) + (120**2 - 36**2)  # 25,204 against 2 x 120^2
    assert out["ratio"] == pytest.approx((2000 * 194 + 2 * squares) / (2000 * 240 + 2 * 28800))

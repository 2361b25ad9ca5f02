"""The pure RC-GRPO functions against hand-computed values (rcgrpo.training.grpo.core_algos)."""

from __future__ import annotations

import math

import pytest
import torch

from rcgrpo.training.grpo.core_algos import (
    group_advantages,
    group_reward_stats,
    kl_penalty,
    minibatch_indices,
    policy_loss,
    sample_reward_tokens,
    token_entropy,
    token_logprobs,
)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# -- reward-token sampling ---------------------------------------------------------------------
def test_iid_tokens_are_seeded_and_have_rate_p():
    a = sample_reward_tokens(2000, 5, 0.5, "iid", gen(1))
    b = sample_reward_tokens(2000, 5, 0.5, "iid", gen(1))
    assert a.shape == (2000, 5) and a.dtype == torch.bool
    assert torch.equal(a, b)
    assert abs(a.float().mean().item() - 0.5) < 0.02
    # all-high or all-low groups happen at 2 * 0.5^5 = 6.25%
    single = (a.all(1) | (~a).all(1)).float().mean().item()
    assert abs(single - 0.0625) < 0.015
    assert sample_reward_tokens(3, 4, 0.0, "iid", gen()).sum() == 0
    assert sample_reward_tokens(3, 4, 1.0, "iid", gen()).all()


def test_stratified_tokens_put_both_in_every_group():
    t = sample_reward_tokens(4000, 5, 0.5, "stratified", gen(2))
    assert (t.any(1) & (~t).any(1)).all()
    assert abs(t.float().mean().item() - 0.5) < 0.02  # symmetric at p = 0.5
    # conditioned binomial: P(k=1) = C(5,1) / (2^5 - 2) = 5/30
    k1 = (t.sum(1) == 1).float().mean().item()
    assert abs(k1 - 5 / 30) < 0.02
    assert (sample_reward_tokens(50, 2, 0.3, "stratified", gen()).sum(1) == 1).all()
    with pytest.raises(ValueError, match="group_size >= 2"):
        sample_reward_tokens(1, 1, 0.5, "stratified", gen())


# -- advantages --------------------------------------------------------------------------------
def test_grpo_advantage_hand_computed():
    # mean 0.2, population std sqrt(0.2 * 0.8) = 0.4 -> (1 - 0.2)/0.4 = 2, (0 - 0.2)/0.4 = -0.5
    adv = group_advantages(torch.tensor([[1.0, 0, 0, 0, 0], [1, 1, 0, 0, 0.5]]), "grpo", eps=0)
    assert torch.allclose(adv[0], torch.tensor([2.0, -0.5, -0.5, -0.5, -0.5]))
    # second: mean 0.5, std sqrt((4 * 0.25)/5) = sqrt(0.2)
    assert torch.allclose(adv[1], torch.tensor([0.5, 0.5, -0.5, -0.5, 0]) / math.sqrt(0.2))


def test_zero_variance_groups_give_zeros_never_nan():
    rewards = torch.tensor([[1.0, 1, 1], [0, 0, 0], [0.3, 0.3, 0.3]])
    for kind in ("grpo", "mean"):
        adv = group_advantages(rewards, kind, eps=0.0)  # eps 0: a naive division would be NaN
        assert torch.equal(adv, torch.zeros_like(adv))
    stats = group_reward_stats(torch.tensor([[1.0, 1, 1], [1, 0, 0]]))
    assert stats["zero_variance_frac"] == 0.5
    assert stats["within_group_std"] == pytest.approx(math.sqrt(2 / 9) / 2)


def test_mean_and_sign_advantages():
    r = torch.tensor([[1.0, 0, 0, 0, 0]])
    assert torch.allclose(
        group_advantages(r, "mean"), torch.tensor([[0.8, -0.2, -0.2, -0.2, -0.2]])
    )
    assert torch.equal(group_advantages(r, "sign"), torch.tensor([[1.0, -1, -1, -1, -1]]))
    # sign keeps a signal in an all-success group: the point of the baseline
    assert torch.equal(group_advantages(torch.ones(1, 3), "sign"), torch.ones(1, 3))


def test_max_norm_advantage_by_hand():
    # group 1: mean 0.2, centred [0.8, -0.2 x4], max |.| 0.8 -> [1, -0.25 x4]
    # group 2: [1, 1, 0, 0, 0.5]: mean 0.5, centred [0.5, 0.5, -0.5, -0.5, 0] -> [1, 1, -1, -1, 0]
    # group 3: all equal -> exact zeros (no division by zero)
    r = torch.tensor([[1.0, 0, 0, 0, 0], [1, 1, 0, 0, 0.5], [0.7, 0.7, 0.7, 0.7, 0.7]])
    expected = torch.tensor([[1.0, -0.25, -0.25, -0.25, -0.25], [1, 1, -1, -1, 0], [0, 0, 0, 0, 0]])
    assert torch.allclose(group_advantages(r, "max_norm"), expected)
    # unlike grpo (1 success of 5: +2.0), the largest magnitude is 1 in every group
    assert group_advantages(r[:1], "grpo")[0, 0] == pytest.approx(2.0, abs=1e-4)


# -- KL and the loss ---------------------------------------------------------------------------
def test_kl_estimators_hand_computed():
    logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    # log r = ref - logp = log 0.5
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + math.log(2))
    assert kl_penalty(logp, logp, "k3").item() == 0.0


def test_k3_is_clamped_as_verl_does():
    # log r = ref - logp; k3 = exp(log r) - 1 - log r, then clamped to [-10, 10] (verl low_var_kl)
    log_r = torch.tensor([math.log(0.5), 2.0, 3.0, 15.0, -15.0, 25.0])
    logp = torch.zeros(6, requires_grad=True)
    k3 = kl_penalty(logp, log_r, "k3")
    expected = [
        0.5 - 1 + math.log(2),  # 0.19315: far from the clamp
        math.exp(2) - 3,  # 4.38906: still below 10
        10.0,  # exp(3) - 4 = 16.0855 -> 10
        10.0,  # exp(15) - 16 = 3269001.37 -> 10
        10.0,  # exp(-15) + 14 = 14.0000003 -> 10
        10.0,  # log r clamped to 20 first: exp(20) - 21 -> 10
    ]
    assert k3.tolist() == pytest.approx(expected, rel=1e-6)
    k3.sum().backward()
    # d k3 / d logp = 1 - exp(log r) where not clamped (0.5 and 1 - e^2 = -6.38906), else 0
    assert logp.grad.tolist() == pytest.approx([0.5, 1 - math.exp(2), 0, 0, 0, 0], rel=1e-6)


def test_clip_on_positive_advantage_gives_zero_gradient():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_(True)  # ratios 1.5 and 0.5
    mask = torch.ones(1, 2)
    # A = +1: token 0 has ratio 1.5 > 1 + eps, so its term is the constant -1.2: gradient 0;
    # token 1 (ratio 0.5) is unclipped: d(-ratio)/d logp / 2 tokens = -0.5 / 2 = -0.25
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.25])
    assert stats["clip_frac"] == 0.5 and stats["ratio_mean"] == pytest.approx(1.0)
    # A = -1: mirrored: ratio 0.5 < 1 - eps is clipped (gradient 0), ratio 1.5 gives 1.5 / 2
    logp.grad = None
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0]), mask)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.75, 0.0])


def test_clipped_loss_hand_computed():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]]))  # ratios 1.5 and 0.5
    mask = torch.ones(1, 2)
    # A = +1: max(-1.5, -1.2) = -1.2 (clipped), max(-0.5, -0.8) = -0.5 -> mean -0.85
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask)
    assert loss.item() == pytest.approx(-0.85)
    assert stats["clip_frac"] == 0.5 and stats["kl"] == 0.0
    # A = -1: max(1.5, 1.2) = 1.5, max(0.5, 0.8) = 0.8 (clipped) -> 1.15
    loss, stats = policy_loss(logp, old, torch.tensor([-1.0]), mask)
    assert loss.item() == pytest.approx(1.15) and stats["clip_frac"] == 0.5
    # with the KL term: ref = old, k3 per token = r - 1 - log r with r = 1/ratio
    k3 = [(1 / 1.5) - 1 + math.log(1.5), 2 - 1 - math.log(2)]
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask, old, kl_coef=0.1)
    assert loss.item() == pytest.approx(-0.85 + 0.1 * sum(k3) / 2, rel=1e-5)
    assert stats["kl"] == pytest.approx(sum(k3) / 2, rel=1e-5)


def test_token_mean_vs_seq_mean():
    # ratio 1 everywhere: per-token loss = -A. Seq 0 has 1 token with A=1, seq 1 has 3 with A=0.
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, 0.0])
    tok, _ = policy_loss(logp, logp, adv, mask, aggregation="token-mean")
    seq, _ = policy_loss(logp, logp, adv, mask, aggregation="seq-mean")
    assert tok.item() == pytest.approx(-0.25) and seq.item() == pytest.approx(-0.5)


def test_masked_tokens_get_zero_gradient_even_with_inf_logprobs():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7, requires_grad=True)
    ids = torch.randint(0, 7, (2, 4))
    mask = torch.tensor([[0.0, 1, 1, 0], [1, 1, 0, 0]])
    logp = token_logprobs(logits, ids)
    old = logp.detach().clone()
    old[mask == 0] = -float("inf")  # padding in a real batch
    ref = old.clone()
    loss, stats = policy_loss(
        logp, old, torch.tensor([1.0, -2.0]), mask, ref, entropy=token_entropy(logits.detach())
    )
    loss.backward()
    grad = logits.grad
    assert torch.isfinite(grad).all()
    assert (grad[mask == 0] == 0).all()
    assert (grad[mask == 1].abs().sum(-1) > 0).all()
    assert stats["entropy"] > 0


def test_one_update_raises_logprob_of_positive_advantage_rollout():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 16), torch.nn.Linear(16, 11))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    seqs = torch.randint(0, 11, (2, 6))  # two rollouts; inputs seqs[:, :-1], targets seqs[:, 1:]
    mask = torch.ones(2, 5)

    def logprobs():
        return token_logprobs(model(seqs[:, :-1]), seqs[:, 1:])

    before = logprobs().detach()
    loss, _ = policy_loss(logprobs(), before, torch.tensor([1.0, -1.0]), mask, before)
    opt.zero_grad()
    loss.backward()
    opt.step()
    after = logprobs().detach()
    assert after[0].sum() > before[0].sum()  # positive advantage: more likely
    assert after[1].sum() < before[1].sum()  # negative advantage: less likely


# -- the PPO schedule --------------------------------------------------------------------------
def test_minibatch_indices():
    # one mini-batch (0 = whole batch): a single pass in order, micro-batches of 4 then 2
    (only,) = minibatch_indices(6, 0, 4)
    assert [c.tolist() for c in only[0]] == [[0, 1, 2, 3], [4, 5]] and len(only) == 1
    # 2 passes x 2 mini-batches of 3, micro-batches of 2 + 1; each pass a seeded permutation
    passes = minibatch_indices(6, 3, 2, epochs=2, generator=gen(0))
    assert [[len(c) for c in mini] for p in passes for mini in p] == [[2, 1]] * 4
    flat = [torch.cat([c for mini in p for c in mini]).tolist() for p in passes]
    assert all(sorted(f) == list(range(6)) for f in flat) and flat[0] != flat[1]
    again = minibatch_indices(6, 3, 2, epochs=2, generator=gen(0))
    assert [torch.cat([c for m in p for c in m]).tolist() for p in again] == flat

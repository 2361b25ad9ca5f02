"""rcgrpo.training.balance: micro-batch costs and their partition between ranks, by hand."""

from rcgrpo.training import balance


def test_cost_is_tokens_plus_attention():
    # rows 3 and 2: 5 tokens + 0.5 x (9 + 4) = 11.5
    assert balance.cost([3, 2], 0.5) == 11.5
    # padded rows: a group of lengths 3 and 2 computes two rows of 3: 6 + 0.5 x 18 = 15
    assert balance.group_cost([3, 2, 7], [0, 1], packed=False, attn=0.5) == 15.0
    assert balance.group_cost([3, 2, 7], [0, 1], packed=True, attn=0.5) == 11.5
    # 28 layers x 3584 q_dim / 6.5e9 params
    assert abs(balance.attention_coef(28, 3584, 6_500_000_000) - 1.5438e-5) < 1e-8


def test_partition_longest_processing_time():
    # costs 8 7 6 5 4 on 2 ranks: 8->r0, 7->r1, 6->r1 (7<8), 5->r0 (8<13), 4->r0 (13=13, fewer)
    # -> r0 {0, 3, 4} = 17, r1 {1, 2} = 13; contiguous would be {0,1,2}=21 vs {3,4}=9
    assert balance.partition([8, 7, 6, 5, 4], 2) == [[0, 3, 4], [1, 2]]
    assert balance.contiguous(5, 2) == [[0, 1, 2], [3, 4]]
    # the rank with 2 micro-batches pads with one zero-weight filler of cost 4
    assert balance.rank_loads([8, 7, 6, 5, 4], [[0, 3, 4], [1, 2]], filler=4) == [17, 17]


def test_partition_shapes():
    parts = balance.partition([1.0] * 5, 3)  # more ranks than ... equal costs: counts 2, 2, 1
    assert sorted(len(p) for p in parts) == [1, 2, 2]
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3, 4]
    assert balance.partition([], 2) == [[], []]


def test_ranks_share_deals_by_cost_and_pads_with_the_cheapest():
    from rcgrpo.training.distributed import Ranks

    shares = []
    for rank in (0, 1):
        r = Ranks.__new__(Ranks)  # the share arithmetic only: no process group needed
        r.rank, r.world = rank, 2
        # micro-batches "a".."e" of 8, 7, 6, 5, 4 tokens (one row each)
        shares.append(r.share(list("abcde"), [8.0, 7.0, 6.0, 5.0, 4.0]))
    assert shares[0] == [("a", 1.0), ("d", 1.0), ("e", 1.0)]
    assert shares[1] == [("b", 1.0), ("c", 1.0), ("e", 0.0)]  # filler: the cheapest, weight 0


def test_shared_cost_counts_each_prefix_once_by_hand():
    # rows of 100 and 100 sharing 90 + a row of 80 alone: (90 + 10 + 10) + 80 tokens; attention
    # 0.5 x (90^2 + 2 x (100^2 - 90^2) + 80^2) = 0.5 x 18,300
    clusters = [([0, 1], 90), ([2], 80)]
    assert balance.shared_cost(clusters, [100, 100, 80], 0.5) == 190 + 0.5 * 18_300
    assert balance.shared_cost(clusters, [100, 100, 80], 0.0) == 190


def test_update_deals_shared_micro_batches_by_what_they_compute():
    """Through dealing.deal (the RL update's pi_old / reference and PPO dealing) on 2 ranks:
    a = a group of 4 rows of 100 sharing 90 tokens (computes 130; as padded rows, 400),
    b = 2 rows of 100 sharing nothing (200), c = a row of 80. Shared, b is the costliest and
    goes alone; the rank with fewer micro-batches pads with the shortest row at weight 0."""
    from types import SimpleNamespace

    import torch

    from rcgrpo.training import shared_forward
    from rcgrpo.training.distributed import Ranks
    from rcgrpo.training.grpo import dealing, update

    g = torch.Generator().manual_seed(0)
    prefix = list(range(1, 91))
    rows = [prefix + torch.randint(100, 200, (10,), generator=g).tolist() for _ in range(4)]
    rows += [[300 + i] * 100 for i in range(2)] + [[400] * 80]
    batch = update.to_batch(
        [SimpleNamespace(ids=r, loss_mask=[1] * len(r), logprobs=[0.0] * len(r)) for r in rows]
    )
    a, b, c = torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6])
    dealt = {}
    for attention in (shared_forward.NAME, "sdpa"):
        model = SimpleNamespace(training_attention=attention)  # no config: attention weight 0
        for rank in (0, 1):
            r = Ranks.__new__(Ranks)  # the share arithmetic only: no process group needed
            r.rank, r.world = rank, 2
            dealt[attention, rank] = [
                (m.tolist(), w) for m, w in dealing.deal(r, model, batch, [a, b, c])
            ]
    assert dealt[shared_forward.NAME, 0] == [([4, 5], 1.0), ([6], 0.0)]
    assert dealt[shared_forward.NAME, 1] == [([0, 1, 2, 3], 1.0), ([6], 1.0)]
    # unshared: a is priced as 4 padded rows (400) and goes alone
    assert dealt["sdpa", 0] == [([0, 1, 2, 3], 1.0), ([6], 0.0)]
    assert dealt["sdpa", 1] == [([4, 5], 1.0), ([6], 1.0)]

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
        r.rank, r.world, r.attn_coef = rank, 2, 0.0
        # micro-batches "a".."e" of 8, 7, 6, 5, 4 tokens (one row each)
        shares.append(r.share(list("abcde"), [[8], [7], [6], [5], [4]]))
    assert shares[0] == [("a", 1.0), ("d", 1.0), ("e", 1.0)]
    assert shares[1] == [("b", 1.0), ("c", 1.0), ("e", 0.0)]  # filler: the cheapest, weight 0

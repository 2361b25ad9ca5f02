"""Micro-batches dealt to the ranks by estimated cost, so the slowest rank is not the one that
got every long episode.

Cost of a micro-batch (`cost`): computed tokens (the linear term: 2 x non-embedding params
FLOPs per token) + `attn` x the sum of its rows' squared lengths (causal attention's
2 x layers x q_dim x T^2), in token units, so `attn = layers x q_dim / non-embedding params`
(`attention_coef`): the same FLOP model as `rcgrpo plan` (rcgrpo.training.plan.timing).
A micro-batch of the shared-prefix forward (`rl.shared_prefix`) is priced by what it computes:
each cluster's prefix once and its suffixes against it (`shared_cost`, the
rcgrpo.training.shared_prefix.cluster_cost of its clusters), not as padded rows: a micro-batch
of five groups of five 7.6k-token rollouts sharing 5.8k tokens computes ~74k tokens where 25
padded rows would count 190k. `micro_costs` prices a step's micro-batches either way.
`partition` is greedy longest-processing-time: costliest first, each to the least-loaded rank
with the fewest micro-batches; its makespan is within 4/3 of the optimum. A rank with fewer
micro-batches than the most-loaded count pads with the cheapest one at weight 0 (see
rcgrpo.training.distributed.Ranks.share).

    .venv/bin/pytest tests/test_balance.py -q
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def attention_coef(layers: int, q_dim: int, non_embedding_params: int) -> float:
    """Token-equivalents per squared row length: (2 L q T^2) / (2 P) per T^2."""
    return layers * q_dim / max(1, non_embedding_params)


def model_coef(model) -> float:
    """`attention_coef` of a transformers decoder (its config and parameter count); 0 (cost =
    tokens) for a model without the usual config fields."""
    c = getattr(model, "config", None)
    layers, heads = getattr(c, "num_hidden_layers", 0), getattr(c, "num_attention_heads", 0)
    if not layers or not heads:
        return 0.0
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    mods = (model.get_input_embeddings(), model.get_output_embeddings())
    emb = sum(
        {id(m.weight): m.weight.numel() for m in mods if m is not None}.values()
    )  # tied: once
    return attention_coef(
        layers, heads * head_dim, sum(p.numel() for p in model.parameters()) - emb
    )


def cost(rows: Sequence[int], attn: float) -> float:
    """Estimated cost of one micro-batch whose rows compute `rows` tokens each (padded rows:
    every entry the longest; packed: each its own length)."""
    return float(sum(rows)) + attn * sum(t * t for t in rows)


def rows(lengths: Sequence[int], group: Sequence[int], packed: bool) -> list[int]:
    """The computed row lengths of the micro-batch `group` (indices into `lengths`): each its
    own when packed, else every row padded to the longest."""
    own = [lengths[i] for i in group]
    return own if packed else [max(own, default=0)] * len(own)


def padded_rows(attn, idx) -> list[int]:
    """`rows` of the micro-batch `idx` (B,) of an attention mask `attn` (N, T): B rows of its
    longest member's token count."""
    sub = attn[idx]
    return [int(sub.sum(1).max())] * int(sub.shape[0]) if sub.numel() else []


def shared_cost(clusters, lengths: Sequence[int], attn: float) -> float:
    """Cost of one shared-prefix micro-batch: its clusters [(rows, prefix length)] (indices into
    `lengths`), each cluster_cost'ed."""
    from rcgrpo.training.shared_prefix import cluster_cost

    return sum(cluster_cost([lengths[r] for r in rows], p, attn) for rows, p in clusters)


def micro_costs(ids, attn_mask, micro_batches, attn: float, shared: bool) -> list[float]:
    """Each micro-batch's cost (index tensors into the step's batch, ids and attn_mask (B, T)
    right-padded): shared, its own clusters (shared_prefix.share_groups at `attn`); else
    `padded_rows`."""
    if not shared:
        return [cost(padded_rows(attn_mask, c), attn) for c in micro_batches]
    from rcgrpo.training.shared_prefix import share_groups

    out = []
    for c in micro_batches:
        lengths = attn_mask[c].sum(1).tolist()
        rows = [ids[i, :n].tolist() for i, n in zip(c.tolist(), lengths, strict=True)]
        out.append(shared_cost(share_groups(rows, attn), lengths, attn))
    return out


def group_cost(lengths: Sequence[int], group: Sequence[int], packed: bool, attn: float) -> float:
    """`cost` of the micro-batch `group` (indices into `lengths`)."""
    return cost(rows(lengths, group, packed), attn)


def partition(costs: Sequence[float], world: int) -> list[list[int]]:
    """Indices of `costs` (M,) dealt to `world` ranks: list of `world` lists, each in ascending
    index order (the order they run in). Deterministic: ties go to the lower rank / index."""
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    heap = [(0.0, 0, r) for r in range(world)]  # (load, count, rank)
    out: list[list[int]] = [[] for _ in range(world)]
    for i in order:
        load, count, r = heapq.heappop(heap)
        out[r].append(i)
        heapq.heappush(heap, (load + costs[i], count + 1, r))
    return [sorted(p) for p in out]


def contiguous(m: int, world: int) -> list[list[int]]:
    """The split it replaces (accelerate's split_between_processes): contiguous runs, the first
    M % world ranks one longer. For the before/after figures."""
    base, extra = divmod(m, world)
    out, start = [], 0
    for r in range(world):
        n = base + (1 if r < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def rank_loads(costs: Sequence[float], parts: list[list[int]], filler: float) -> list[float]:
    """Each rank's cost (W,), `filler` for each zero-weight padding micro-batch it runs so every
    rank does as many backwards as the fullest, as the step waits for the slowest."""
    n = max(len(p) for p in parts)
    return [sum(costs[i] for i in p) + (n - len(p)) * filler for p in parts]

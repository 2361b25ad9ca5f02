"""Which rows of a micro-batch share a prompt prefix, and the packed row that computes it once.

The G rollouts of a group start with the same tokens (system prompt, tool docs, first user
message; under RC-GRPO up to the reward goal), and under a causal mask a token's hidden states
depend only on the tokens before it: rows that share a prefix have the same hidden states on it.
So a micro-batch can be computed as one packed row (1, L): for each cluster of rows, its shared
prefix once, then each row's remaining suffix; a suffix attends to [its prefix; itself]
(Prefix Grouper, arXiv 2506.05433; rcgrpo.training.shared_forward runs it). The clusters are
found from the token ids alone (no group ids needed), so rows of different tasks that happen to
share a system prompt can share it too, when that computes fewer tokens:

* `common_prefix(rows)`: the longest common prefix of token lists.
* `share_groups(rows, attn)`: rows sorted lexicographically (a shared prefix makes rows
  adjacent), then the split of that order into contiguous clusters that costs the least
  (dynamic programming over `cluster_cost`: the tokens computed, P + sum(len - P), plus `attn`
  x the causal attention's squares, P^2 + sum(len^2 - P^2), in the token units of
  rcgrpo.training.balance; attn = 0: the fewest tokens). A cluster of k rows saves
  (k - 1) x (P + attn x P^2) against its rows alone: the suffix attention runs at causal
  FLOPs (rcgrpo.training.suffix_attention), so any shared prefix pays for itself, and the
  attention term prefers the clusters with the longer prefixes.
* `pack(rows, clusters)`: the packed ids and positions (L,), each (row, t)'s place in the packed
  row, and the blocks (prefix start, prefix length, [(suffix start, suffix length)]) the
  attention reads.
* `computed_tokens(rows)`: what the shared forward computes, L.

    .venv/bin/pytest tests/test_shared_prefix.py -q -k "prefix or groups or pack"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

Block = tuple[int, int, list[tuple[int, int]]]  # (prefix start, prefix len, [(start, len)])


def common_prefix(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of `rows` (token lists); a single row: its length."""
    if not rows:
        return 0
    n = len(rows[0])
    for r in rows[1:]:
        # binary search on slice equality: C-speed comparisons, rows are up to 80k tokens
        lo, hi = 0, min(n, len(r))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if list(rows[0][:mid]) == list(r[:mid]):
                lo = mid
            else:
                hi = mid - 1
        n = lo
    return n


def cluster_cost(lengths: Sequence[int], p: int, attn: float = 0.0) -> float:
    """Cost of one cluster in token units: rows of `lengths` sharing a prefix of p tokens (a row
    alone: p = its length) compute P + sum(len - P) tokens through the linear layers, and
    causal attention of P^2 + sum(len^2 - P^2) squares at `attn` tokens per square
    (rcgrpo.training.balance.attention_coef)."""
    tokens = p + sum(n - p for n in lengths)
    return tokens + attn * (p * p + sum(n * n - p * p for n in lengths))


def share_groups(rows: Sequence[Sequence[int]], attn: float = 0.0) -> list[tuple[list[int], int]]:
    """Row indices split into clusters [(rows of the cluster, shared prefix length)] of the
    least total `cluster_cost` at `attn`. A row alone is its own prefix (P = its length, no
    suffix). Clusters are contiguous runs of the lexicographic order; inside a cluster, rows
    keep that order."""
    order = sorted(range(len(rows)), key=lambda i: list(rows[i]))
    n = len(order)
    # adjacent[j]: common prefix of order[j-1] and order[j] (lex order: the common prefix of a
    # run is the minimum of its adjacent ones)
    adjacent = [0] + [common_prefix([rows[order[j - 1]], rows[order[j]]]) for j in range(1, n)]
    best = [0.0] * (n + 1)  # best[b]: least cost of order[:b]
    cut = [0] * (n + 1)  # where the last cluster of order[:b] starts
    for b in range(1, n + 1):
        total, prefix, best[b] = 0.0, len(rows[order[b - 1]]), None
        for a in range(b - 1, -1, -1):  # last cluster order[a:b]: cluster_cost, incrementally
            length = len(rows[order[a]])
            total += length + attn * length * length
            if a < b - 1:
                prefix = min(prefix, adjacent[a + 1])
            cost = best[a] + total - (b - a - 1) * (prefix + attn * prefix * prefix)
            if best[b] is None or cost < best[b]:
                best[b], cut[b] = cost, a
    clusters, b = [], n
    while b > 0:
        a = cut[b]
        members = order[a:b]
        clusters.append((members, common_prefix([rows[i] for i in members])))
        b = a
    return clusters[::-1]


@dataclass
class Packed:
    """One micro-batch laid out as one row: prefixes once, then their suffixes."""

    ids: torch.Tensor  # (L,) token ids
    positions: torch.Tensor  # (L,) position of each token in its own sequence
    index: torch.Tensor  # (B, T) place of (row, t) in the packed row; -1 past the row's end
    blocks: list[Block]  # what the attention reads


def pack(rows: Sequence[Sequence[int]], clusters, width: int) -> Packed:
    """rows (B lists of token ids), clusters from `share_groups`, width T >= the longest row."""
    ids: list[int] = []
    positions: list[int] = []
    index = torch.full((len(rows), width), -1, dtype=torch.long)
    blocks: list[Block] = []
    for members, p in clusters:
        start = len(ids)
        ids += rows[members[0]][:p]
        positions += range(p)
        suffixes = []
        for r in members:
            n = len(rows[r])
            index[r, :p] = torch.arange(start, start + p)
            index[r, p:n] = torch.arange(len(ids), len(ids) + n - p)
            if n > p:
                suffixes.append((len(ids), n - p))
            ids += rows[r][p:]
            positions += range(p, n)
        blocks.append((start, p, suffixes))
    return Packed(torch.tensor(ids), torch.tensor(positions), index, blocks)


def computed_tokens(rows: Sequence[Sequence[int]], attn: float = 0.0) -> int:
    """Tokens the shared forward computes for these rows (L of their packed row)."""
    return sum(p + sum(len(rows[r]) - p for r in m) for m, p in share_groups(rows, attn))


def micro_batches(
    rows: Sequence[Sequence[int]],
    max_tokens: int,
    sampled: Sequence[int] | None = None,
    max_sampled: int = 0,
    attn: float = 0.0,
) -> list[list[int]]:
    """Indices of `rows` grouped into micro-batches whose shared forward computes at most
    `max_tokens` tokens (and holds at most `max_sampled` of the rows' `sampled` positions, when
    > 0): the token budget counts computed tokens, so whole groups go together and a
    micro-batch fits more rollouts than padded. The clusters of `share_groups` are the units,
    largest first, filled first-fit; a cluster over a cap is cut into runs that each recompute
    its prefix. A row over the budget alone runs alone. Every index appears exactly once.
    attn: the clusters' attention weight (`share_groups`)."""
    lengths = [len(r) for r in rows]
    return cluster_micro_batches(
        share_groups(rows, attn), lengths, max_tokens, sampled, max_sampled
    )


def cluster_micro_batches(
    clusters: Sequence[tuple[list[int], int]],
    lengths: Sequence[int],
    max_tokens: int,
    sampled: Sequence[int] | None = None,
    max_sampled: int = 0,
) -> list[list[int]]:
    """`micro_batches` from the clusters [(rows, prefix length)] and the rows' `lengths`: what
    it does once `share_groups` has found them (rcgrpo plan and bench/rank_balance.py give the
    clusters of episodes they know only by shape)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    cap = max_sampled if max_sampled > 0 and sampled is not None else 0
    units: list[tuple[int, int, list[int]]] = []  # (tokens, sampled, rows)
    for members, p in clusters:
        run: list[int] = []
        tokens = used = 0
        for r in sorted(members, key=lambda r: -lengths[r]):
            n, s = lengths[r] - p, sampled[r] if cap else 0
            if run and (p + tokens + n > max_tokens or (cap and used + s > cap)):
                units.append((p + tokens, used, run))
                run, tokens, used = [], 0, 0
            run, tokens, used = run + [r], tokens + n, used + s
        units.append((p + tokens, used, run))
    bins: list[list] = []  # [tokens, sampled, rows]
    for tokens, used, run in sorted(units, key=lambda u: (-u[0], u[2])):
        fit = next(
            (b for b in bins if b[0] + tokens <= max_tokens and (not cap or b[1] + used <= cap)),
            None,
        )
        if fit is None:
            bins.append([tokens, used, list(run)])
        else:
            fit[0], fit[1], fit[2] = fit[0] + tokens, fit[1] + used, fit[2] + run
    return [b[2] for b in bins]


def forward_metrics(
    ids: torch.Tensor, lengths, passes, packed: bool, shared: bool, attn: float = 0.0
) -> dict:
    """The update's forwards over `passes` (of mini-batches of micro-batch index tensors into
    ids (B, T)): train/pad_frac, train/micro_batches, and the tokens they compute through the
    decoder, perf/update_tokens (with sharing where on, clustered at `attn`) and
    perf/update_tokens_unshared."""
    from rcgrpo.training import batching

    groups = [c.tolist() for one_pass in passes for mini in one_pass for c in mini]

    unshared = sum(batching.computed_tokens(lengths, g, packed) for g in groups)
    tokens = unshared
    if shared:
        rows = [[ids[i, : lengths[i]].tolist() for i in g] for g in groups]
        tokens = sum(computed_tokens(r, attn) for r in rows)
    return {
        "train/pad_frac": batching.pad_frac(lengths, groups, packed or shared),  # shared: none
        "train/micro_batches": float(len(groups)),  # update forwards, all passes
        "perf/update_tokens": float(tokens),
        "perf/update_tokens_unshared": float(unshared),
    }

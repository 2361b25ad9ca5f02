"""Micro-batches by token budget: which sequences share a forward pass, and what padding costs.

A micro-batch's memory is set by the tokens it computes, not by how many sequences it holds:
8 rollouts padded to a 72k-token member compute 580k positions. verl's dynamic batch size
(`ppo_max_token_len_per_gpu`) forms micro-batches by tokens instead, and so does this module:

* `micro_batches(lengths, max_tokens, packed)`: sequences sorted by length, longest first, then
  cut into runs whose computed tokens stay within `max_tokens`. Padded (SDPA, eager): a run of
  k sequences computes k x its first (longest) length. Packed (flash-attention varlen: the
  sequences of a micro-batch concatenated in one row, positions restarting per sequence, no
  padding): it computes the sum of the lengths, filled first-fit. A sequence longer than the
  budget is not cut (each token attends to all before it): it runs alone, so the budget caps
  every micro-batch but one holding a single longer sequence (`rcgrpo plan` sizes memory for
  max(budget, longest episode)). The longest micro-batch comes first: a budget too large for
  the GPU fails on the first forward of the first step, not hours in.
  With `max_sampled`, a micro-batch also holds at most that many sampled (loss) positions: a
  budget-filled micro-batch of mostly sampled rows is split, so the head's memory stays what
  `rcgrpo plan` counts (`rl.max_sampled_per_micro_batch`).
* `fixed_micro_batches(n, size)`: the count-based split (`micro_batch_size` sequences each,
  in the given order), what `max_tokens_per_micro_batch: 0` keeps.
* `pad_frac(lengths, groups, packed)`: the share of computed positions that are padding,
  logged as `train/pad_frac`.

The loss normalisation does not depend on the grouping (each micro-batch's summed loss is
divided by the token count of the whole optimizer batch), so any grouping gives the same
gradient up to float rounding (tests/test_batching.py: 1e-6 against the padded path).

    .venv/bin/pytest tests/test_batching.py -q
"""

from __future__ import annotations

from collections.abc import Sequence


def by_length(lengths: Sequence[int]) -> list[int]:
    """Indices of `lengths`, longest first; ties keep their index order (deterministic)."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def micro_batches(
    lengths: Sequence[int],
    max_tokens: int,
    packed: bool = False,
    sampled: Sequence[int] | None = None,
    max_sampled: int = 0,
) -> list[list[int]]:
    """Indices into `lengths` grouped into micro-batches of at most `max_tokens` computed tokens
    and, with `max_sampled` > 0, at most `max_sampled` sampled (loss) positions (`sampled[i]` of
    sequence i: the LM head's work and its activations grow with them, not with the tokens).

    padded: runs of the longest-first order, k sequences costing k x the first one's length;
    packed: first-fit decreasing into bins of `max_tokens` (sum of lengths). Every index appears
    exactly once; inside a micro-batch the indices are in longest-first order. A sequence over
    either cap runs alone.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    cap = max_sampled if max_sampled > 0 and sampled is not None else 0
    order = by_length(lengths)
    groups: list[list[int]] = []
    used: list[int] = []  # sampled positions in each micro-batch
    if packed:
        room: list[int] = []  # tokens left in each open bin
        for i in order:
            n, s = lengths[i], sampled[i] if cap else 0
            fit = next(
                (b for b, r in enumerate(room) if n <= r and (not cap or used[b] + s <= cap)), None
            )
            if fit is None:
                groups.append([i])
                room.append(max_tokens - n)  # negative for a sequence longer than the budget
                used.append(s)
            else:
                groups[fit].append(i)
                room[fit] -= n
                used[fit] += s
        return groups
    for i in order:
        # the run's first member is its longest: adding one more costs (k + 1) x that length
        s = sampled[i] if cap else 0
        tokens_ok = groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens
        if tokens_ok and (not cap or used[-1] + s <= cap):
            groups[-1].append(i)
            used[-1] += s
        else:
            groups.append([i])
            used.append(s)
    return groups


def fixed_micro_batches(n: int, size: int) -> list[list[int]]:
    """[0..n) in order, cut into micro-batches of `size` sequences (the last may be smaller)."""
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def computed_tokens(lengths: Sequence[int], group: Sequence[int], packed: bool = False) -> int:
    """Positions a forward over `group` computes: sum of lengths packed, k x longest padded."""
    sizes = [lengths[i] for i in group]
    return sum(sizes) if packed else len(sizes) * max(sizes, default=0)


def pad_frac(
    lengths: Sequence[int], groups: Sequence[Sequence[int]], packed: bool = False
) -> float:
    """Share of the computed positions of `groups` that are padding: 1 - real / computed."""
    computed = sum(computed_tokens(lengths, g, packed) for g in groups)
    real = sum(lengths[i] for g in groups for i in g)
    return 1.0 - real / computed if computed else 0.0

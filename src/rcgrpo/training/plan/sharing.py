"""The update's work when each micro-batch computes its groups' shared prompt prefix once
(`rl.shared_prefix`, rcgrpo.training.shared_forward), as a ratio to the unshared update, for
`rcgrpo plan`'s step time.

The G rollouts of a task share their first prompt but for its last PREFIX_TAIL tokens (the goal
onward: timing.PREFIX_TAIL, the assumption the rollout simulation makes for vLLM's prefix
cache). Sharing happens inside a mini-batch: the rows of one task in one mini-batch form a
cluster computing P + sum(len - P) tokens, and attention P^2 + sum(len^2 - P^2) (the suffixes'
queries against [prefix; suffix]); the shared micro-batches hold whole clusters
(shared_prefix.micro_batches), so no padding. The mini-batches are the same as the unshared
update's (timing.step_micro_batches' shuffle of rollouts): with several mini-batches a pass, a
group's rollouts are spread over them and share less. The attention runs at causal FLOPs
(rcgrpo.training.suffix_attention), which is what these squares count.

Memory (`shared_layer`): a shared micro-batch's budget counts computed tokens, so the update's
activations are its computed tokens x the layer measured on the shared forward's packed row
(layers.json `shared_saved` / `shared_peak`, `rcgrpo plan --measure`), plus on CUDA the copies of
a prefix's keys and values that its `lower_right` kernel makes per suffix and the flash backward
keeps: G suffixes copying a prefix of P tokens hold 2 x P x kv_dim x b bytes each, over at least
P computed tokens, so at most 2 x kv_dim x b x G bytes per computed token (counted at that bound).

    .venv/bin/pytest tests/test_shared_prefix.py -q -k plan
"""

from __future__ import annotations

import random
from collections import defaultdict

from rcgrpo.training.plan import memory as M
from rcgrpo.training.plan.timing import PREFIX_TAIL


def shared_layer(arch, b: int, profile: str, dtype: str, group: int) -> M.Layer:
    """Bytes per computed token of one layer in the shared update (module docstring): the
    measured packed row + the bound on CUDA's copies of the prefix's keys and values."""
    measured = M.measured_layer(profile, dtype, shared=True)
    copies = 2 * arch.kv_dim * b * group
    return M.Layer(measured.saved + copies, measured.peak + copies)


def forward_flops(arch, tokens: float, squares: float) -> float:
    """One forward's FLOPs: 2 x non-embedding params per token + causal attention's T^2 term
    (the formula of timing.update_flops)."""
    non_embedding = arch.params() - arch.vocab * arch.hidden * (1 if arch.tied else 2)
    return 2 * non_embedding * tokens + 2 * arch.layers * arch.q_dim * squares


def shared_ratio(arch, groups, micro: list[list[int]], mini: int, seed: int = 0) -> dict:
    """groups: the step's episodes as timing.draw_step gives them (groups of G shapes [(prefill,
    sampled), ...]); micro: the unshared micro-batches of one pass (timing.step_micro_batches
    with the same seed and mini-batch size `mini`). Returns the forward FLOPs ratio
    shared / unshared and both passes' computed tokens."""
    episodes = [ep for g in groups for ep in g]
    task = [i for i, g in enumerate(groups) for _ in g]
    lengths = [sum(p + s for p, s in ep) for ep in episodes]
    prefix = [max(0, ep[0][0] - PREFIX_TAIL) for ep in episodes]
    unshared_tokens = unshared_sq = 0.0
    for m in micro:  # padded rows: k x the longest
        top = max(lengths[i] for i in m)
        unshared_tokens += len(m) * top
        unshared_sq += len(m) * top * top
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)  # the mini-batches of step_micro_batches
    mini = mini or len(order)
    tokens = sq = 0.0
    for start in range(0, len(order), mini):
        clusters = defaultdict(list)
        for i in order[start : start + mini]:
            clusters[task[i]].append(i)
        for rows in clusters.values():
            p = prefix[rows[0]] if len(rows) > 1 else 0
            tokens += p + sum(lengths[i] - p for i in rows)
            sq += p * p + sum(lengths[i] ** 2 - p * p for i in rows)
    ratio = forward_flops(arch, tokens, sq) / forward_flops(arch, unshared_tokens, unshared_sq)
    return {"ratio": ratio, "tokens": tokens, "unshared_tokens": unshared_tokens}

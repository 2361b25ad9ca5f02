"""Rank balance of one RL update pass on `rcgrpo plan`'s episode mix: each rank's estimated
cost (rcgrpo.training.balance) under the contiguous split and the cost-balanced one, and with
`rl.shared_prefix` on (the default): shared micro-batches dealt by padded-row costs with the
cheapest micro-batch as the zero-weight filler (as before) and by what they compute
(balance.shared_cost) with the mini-batch's shortest row alone as the filler (as
rcgrpo.training.grpo.dealing.deal does), each rank's load counted as computed.

    PYTHONPATH=src .venv/bin/python bench/rank_balance.py --ranks 8
"""

from __future__ import annotations

import argparse
import random
from collections import defaultdict

from rcgrpo.training import balance
from rcgrpo.training.batching import micro_batches
from rcgrpo.training.plan import constants as C
from rcgrpo.training.plan import timing as T
from rcgrpo.training.shared_prefix import cluster_micro_batches


def clusters_of(rows: list[int], task: list[int], prefix: list[int]) -> list[tuple[list, int]]:
    """The clusters the shared forward finds among `rows`: the rows of one task share its first
    prompt but the last PREFIX_TAIL tokens (the plan's assumption, plan/sharing.py); a row
    alone is its own prefix."""
    by_task = defaultdict(list)
    for r in rows:
        by_task[task[r]].append(r)
    return [(m, prefix[m[0]] if len(m) > 1 else -1) for m in by_task.values()]


def paper_mix(profile: str = "qwen2.5-7b-instruct", shared: bool = False):
    """Micro-batch costs per mini-batch (each one optimizer step, which the ranks share) of one
    update pass as `rcgrpo plan` draws it for the paper's rl settings (params.yaml's rl section
    with `--preset paper`: tasks x G episodes of the replayed shapes), and the attention
    coefficient. Each mini-batch: ([(a micro-batch's cost as computed, its padded-row cost)],
    the cost of its shortest row alone). Unshared: padded rows, both the same; shared: the
    micro-batches of whole clusters (budget on computed tokens)."""
    from rcgrpo.run_config import resolve

    rl = resolve(None, "paper").rl
    arch = C.architecture(profile)
    groups = T.draw_step(T.episode_shapes(), rl.tasks_per_step, rl.group_size, seed=0)
    episodes = [ep for g in groups for ep in g]
    lengths = [sum(p + s for p, s in ep) for ep in episodes]
    task = [i for i, g in enumerate(groups) for _ in g]
    prefix = [max(0, ep[0][0] - T.PREFIX_TAIL) for ep in episodes]
    order = list(range(len(lengths)))
    random.Random(0).shuffle(order)  # as timing.step_micro_batches
    non_emb = arch.params() - arch.vocab * arch.hidden * (1 if arch.tied else 2)
    coef = balance.attention_coef(arch.layers, arch.q_dim, non_emb)
    budget, minis = rl.max_tokens_per_micro_batch, []
    for i in range(0, len(order), rl.mini_batch_size):
        part = order[i : i + rl.mini_batch_size]
        row = balance.cost([min(lengths[k] for k in part)], coef)  # the update's filler
        if not shared:
            micro = micro_batches([lengths[k] for k in part], budget, packed=False)
            costs = [balance.group_cost([lengths[k] for k in part], g, False, coef) for g in micro]
            minis.append(([(c, c) for c in costs], row))
            continue
        micro = cluster_micro_batches(clusters_of(part, task, prefix), lengths, budget)
        padded = [balance.group_cost(lengths, g, False, coef) for g in micro]
        real = [
            balance.shared_cost(
                [(m, p if p >= 0 else lengths[m[0]]) for m, p in clusters_of(g, task, prefix)],
                lengths,
                coef,
            )
            for g in micro
        ]
        minis.append((list(zip(real, padded, strict=True)), row))
    return minis, coef


def figures(world: int, shared: bool = False) -> dict[str, tuple[list[float], float]]:
    """For each split: per rank its cost as computed, summed over the pass's mini-batches, and
    the pass's cost as the ranks wait (sum over mini-batches of the slowest rank's)."""
    minis, _ = paper_mix(shared=shared)
    names = ("padded costs", "computed costs") if shared else ("contiguous", "balanced")
    out = {}
    for name in names:
        total, wall = [0.0] * world, 0.0
        for mini, row in minis:
            real = [r for r, _ in mini]
            if name == "contiguous":  # the filler was the first (longest) micro-batch
                parts, filler = balance.contiguous(len(real), world), real[0]
            elif name == "padded costs":  # the filler was the cheapest as dealt
                by = [d for _, d in mini]
                parts = balance.partition(by, world)
                filler = real[min(range(len(by)), key=by.__getitem__)]
            else:  # now: the shortest row alone
                parts, filler = balance.partition(real, world), row
            loads = balance.rank_loads(real, parts, filler)
            total, wall = [t + x for t, x in zip(total, loads, strict=True)], wall + max(loads)
        out[name] = total, wall
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    world = ap.parse_args().ranks
    for shared in (False, True):
        minis, coef = paper_mix(shared=shared)
        useful = sum(r for mini, _ in minis for r, _ in mini) / world
        print(
            f"rl.shared_prefix {str(shared).lower()}: {len(minis)} mini-batches, "
            f"{sum(len(m) for m, _ in minis)} micro-batches, attention coef {coef:.3e} tokens "
            "per T^2"
        )
        for name, (loads, wall) in figures(world, shared).items():
            print(f"{name:14s} per rank (M token-eq): " + " ".join(f"{x / 1e6:.2f}" for x in loads))
            print(
                f"{name:14s} slowest rank / mean useful {max(loads) / useful:.3f}; "
                f"pass (waiting per mini-batch) / mean useful {wall / useful:.3f}"
            )


if __name__ == "__main__":
    main()

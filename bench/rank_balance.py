"""Rank balance of one RL update pass on `rcgrpo plan`'s episode mix: each rank's estimated
cost (rcgrpo.training.balance) under the contiguous split and the cost-balanced one.

    PYTHONPATH=src .venv/bin/python bench/rank_balance.py --ranks 8
"""

from __future__ import annotations

import argparse
import random

from rcgrpo.training import balance
from rcgrpo.training.batching import micro_batches
from rcgrpo.training.plan import constants as C
from rcgrpo.training.plan import timing as T


def paper_mix(profile: str = "qwen2.5-7b-instruct") -> tuple[list[list[float]], float]:
    """Micro-batch costs per mini-batch (each one optimizer step, which the ranks share) of one
    update pass as `rcgrpo plan` draws it for the paper's rl settings (params.yaml's rl section
    with `--preset paper`: tasks x G episodes of the replayed shapes, padded rows), and the
    attention coefficient."""
    from rcgrpo.run_config import resolve

    rl = resolve(None, "paper").rl
    arch = C.architecture(profile)
    groups = T.draw_step(T.episode_shapes(), rl.tasks_per_step, rl.group_size, seed=0)
    lengths = [sum(p + s for p, s in ep) for g in groups for ep in g]
    order = list(range(len(lengths)))
    random.Random(0).shuffle(order)  # as timing.step_micro_batches
    non_emb = arch.params() - arch.vocab * arch.hidden * (1 if arch.tied else 2)
    coef = balance.attention_coef(arch.layers, arch.q_dim, non_emb)
    minis = []
    for i in range(0, len(order), rl.mini_batch_size):
        part = [lengths[k] for k in order[i : i + rl.mini_batch_size]]
        micro = micro_batches(part, rl.max_tokens_per_micro_batch, packed=False)
        minis.append([balance.group_cost(part, g, False, coef) for g in micro])
    return minis, coef


def figures(world: int) -> dict[str, tuple[list[float], float]]:
    """For each split: per rank its estimated cost summed over the pass's mini-batches, and the
    pass's cost as the ranks wait (sum over mini-batches of the slowest rank's)."""
    minis, _ = paper_mix()
    out = {}
    for name in ("contiguous", "balanced"):
        total, wall = [0.0] * world, 0.0
        for costs in minis:
            if name == "contiguous":  # the filler was the first (longest) micro-batch
                parts, filler = balance.contiguous(len(costs), world), costs[0]
            else:
                parts, filler = balance.partition(costs, world), min(costs)
            loads = balance.rank_loads(costs, parts, filler)
            total, wall = [t + x for t, x in zip(total, loads, strict=True)], wall + max(loads)
        out[name] = total, wall
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    world = ap.parse_args().ranks
    minis, coef = paper_mix()
    useful = sum(sum(c) for c in minis) / world
    print(
        f"{len(minis)} mini-batches, {sum(map(len, minis))} micro-batches, "
        f"attention coef {coef:.3e} tokens per T^2"
    )
    for name, (loads, wall) in figures(world).items():
        print(f"{name:10s} per rank (M token-eq): " + " ".join(f"{x / 1e6:.2f}" for x in loads))
        print(
            f"{name:10s} slowest rank / mean useful {max(loads) / useful:.3f}; "
            f"pass (waiting per mini-batch) / mean useful {wall / useful:.3f}"
        )


if __name__ == "__main__":
    main()

"""Ranks share the RL update evenly: on `rcgrpo plan`'s episode mix (params.yaml's rl section,
the replayed ground-truth shapes) the slowest of 8 ranks' estimated cost is within 10 % of the
mean (bench/rank_balance.py prints the figures, before and after)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import rank_balance  # noqa: E402


def test_eight_ranks_within_ten_percent_of_mean():
    minis, _ = rank_balance.paper_mix()
    useful = sum(sum(c) for c in minis) / 8
    figures = rank_balance.figures(8)
    loads, wall = figures["balanced"]
    assert max(loads) <= 1.10 * useful
    assert wall <= 1.10 * useful  # each mini-batch waits for its slowest rank
    # the contiguous longest-first split it replaces was not
    assert max(figures["contiguous"][0]) > 1.10 * useful

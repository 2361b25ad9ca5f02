"""How long the tool observations of the 800 BFCL ground truths are: the figure behind the
default of `env.max_observation_chars` (it must cut no task's intended answer).

Runs every task's ground truth in this process (rcgrpo.bfcl.replay.ground_truth_run, ~1 min on
one core) and prints the count, median, p99, p99.9 and largest observation in characters, and
how many a cap would cut.

    .venv/bin/python scripts/observation_sizes.py [--cap 32768]
"""

from __future__ import annotations

import argparse

from rcgrpo.bfcl.observations import DEFAULT_MAX_CHARS
from rcgrpo.bfcl.replay import ground_truth_run
from rcgrpo.bfcl.tasks import get_task, load_split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cap", type=int, default=DEFAULT_MAX_CHARS)
    ap.add_argument("--limit", type=int, default=0, help="first N tasks only (0 = all 800)")
    args = ap.parse_args()
    ids = list(load_split())[: args.limit or None]
    sizes = sorted(
        len(o) for t in ids for turn in ground_truth_run(get_task(t)).results for o in turn
    )
    n = len(sizes)
    at = lambda q: sizes[min(n - 1, int(n * q))]  # noqa: E731
    head = f"tasks {len(ids)}, observations {n}:"
    print(f"{head} median {at(0.5):,}, p99 {at(0.99):,}, p99.9 {at(0.999):,}, max {sizes[-1]:,}")
    print(f"cut by a cap of {args.cap:,}: {sum(s > args.cap for s in sizes)}")


if __name__ == "__main__":
    main()

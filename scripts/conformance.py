"""Full conformance run: our `bfcl check` against bfcl-eval's executor + multi_turn_checker.

Checks the ground truth of all 800 multi-turn entries plus N perturbations of each (default 3,
so 2,400) and prints the agreement per perturbation kind; exits 1 on any disagreement and lists
them. About a minute on 2 cores.

    .venv/bin/python scripts/conformance.py --perturbations 3 --seed 0
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

from rcgrpo.runtime import apply_defaults


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--perturbations", type=int, default=3, help="perturbed trajectories per task"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the perturbations")
    args = parser.parse_args()
    apply_defaults()
    from rcgrpo.bfcl.conformance import cases, compare
    from rcgrpo.bfcl.tasks import load_tasks

    start = time.perf_counter()
    rows = compare(cases(list(load_tasks().values()), args.perturbations, args.seed))
    by_kind = collections.defaultdict(lambda: [0, 0, 0])  # agree, total, passed (bfcl-eval)
    for row in rows:
        stats = by_kind[row["kind"]]
        stats[0] += row["ours"] == row["theirs"]
        stats[1] += 1
        stats[2] += row["theirs"]
    print(f"{'kind':16} {'agree':>7} {'total':>6} {'pass':>6}")
    for kind, (agree, total, passed) in sorted(by_kind.items()):
        print(f"{kind:16} {agree:7d} {total:6d} {passed:6d}")
    disagreements = [r for r in rows if r["ours"] != r["theirs"]]
    agree = len(rows) - len(disagreements)
    print(
        f"agreement: {agree}/{len(rows)} = {100 * agree / len(rows):.2f}% "
        f"in {time.perf_counter() - start:.1f} s"
    )
    for row in disagreements:
        print(json.dumps(row))
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())

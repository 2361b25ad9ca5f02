"""Full conformance run: our `bfcl check` against bfcl-eval's executor + multi_turn_checker.

Checks the ground truth of all 800 multi-turn entries plus N perturbations of each (default 3,
so 2,400) and prints the agreement per perturbation kind; then checks that the scoring replay
agrees with the live episode on every call's outcome over the same trajectories plus the
hostile family (15 hostile texts per ground-truth call: keys that spell code, non-ASCII and
surrogate keys, NaN/inf, unhashable literals). Exits 1 on any disagreement and lists them.

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
    parser.add_argument(
        "--no-live-replay", action="store_true", help="skip the live-vs-replay agreement"
    )
    args = parser.parse_args()
    apply_defaults()
    from rcgrpo.bfcl.conformance import cases, compare
    from rcgrpo.bfcl.tasks import load_tasks

    start = time.perf_counter()
    tasks = list(load_tasks().values())
    case_list = cases(tasks, args.perturbations, args.seed)
    rows = compare(case_list)
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
    if args.no_live_replay:
        return 1 if disagreements else 0
    return live_replay(case_list, tasks) or (1 if disagreements else 0)


def live_replay(case_list, tasks) -> int:
    """Live episode vs scoring replay over the trajectories and the hostile family."""
    from rcgrpo.bfcl.live_replay import hostile_family, live_vs_replay

    start = time.perf_counter()
    counts = collections.Counter()
    differ = []
    for task, kind, trajectory in [*case_list, *hostile_family(tasks)]:
        family = "hostile" if kind == "hostile" else "conformance"
        counts[family] += 1
        if difference := live_vs_replay(task, trajectory):
            differ.append({"task_id": task.id, "kind": kind, "difference": difference})
    total = sum(counts.values())
    print(
        f"live vs replay: {total - len(differ)}/{total} agree "
        f"({counts['conformance']} conformance + {counts['hostile']} hostile trajectories) "
        f"in {time.perf_counter() - start:.1f} s"
    )
    for row in differ:
        print(json.dumps(row))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

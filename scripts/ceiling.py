"""The ceiling of a profile's token limits: all 800 ground truths through the agent loop.

Replays the expert assistant text of every task as the model's messages (tokenised by the
profile's tokenizer, cut at the per-message limit as generation would be; see
rcgrpo/data/ceiling.py) under the profile's default limits (rcgrpo.models.profiles.PROFILES) or
the ones given, and prints the ceiling k/n per category with the paper reward, the stop reasons
of the unsolved episodes and the measured prompt / episode / message lengths in tokens. The
first prompt carries the <|high_reward|> goal (the longest prompt a policy sees). Exits 1 when
the ceiling is below n. ~1-3 min per profile and protocol on 2 cores.

    .venv/bin/python scripts/ceiling.py --profile qwen-shape --protocol combined
    .venv/bin/python scripts/ceiling.py --profile tiny --protocol bfcl --max-new-tokens 96 --max-total-tokens 1536
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from rcgrpo.runtime import apply_defaults


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", default="tiny", help="a model profile (rcgrpo.models.profiles)"
    )
    parser.add_argument("--protocol", default="combined", choices=["combined", "bfcl"])
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0 = the profile's")
    parser.add_argument("--max-total-tokens", type=int, default=0, help="0 = the profile's")
    parser.add_argument("--max-steps", type=int, default=20, help="model messages per turn")
    parser.add_argument("--split", default="all", choices=["all", "train", "test"])
    parser.add_argument("--limit", type=int, default=0, help="first N tasks only (0 = all)")
    args = parser.parse_args()
    apply_defaults()
    from rcgrpo.bfcl.tasks import load_tasks, tasks_in
    from rcgrpo.chat.prompts import Renderer
    from rcgrpo.chat.record import HIGH
    from rcgrpo.data.ceiling import ceiling
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import PROFILES, ModelConfig
    from rcgrpo.rollout.agent_loop import Limits

    if args.profile not in PROFILES:
        parser.error(f"unknown profile {args.profile!r}: pick one of {sorted(PROFILES)}")
    profile = PROFILES[args.profile]
    limits = Limits(
        args.max_new_tokens or profile.max_new_tokens,
        args.max_total_tokens or profile.max_total_tokens,
        args.max_steps,
    )
    tasks = list(load_tasks().values()) if args.split == "all" else tasks_in(args.split)
    tasks = tasks[: args.limit] if args.limit else tasks
    policy = load_policy(ModelConfig(profile=args.profile))
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    start = time.perf_counter()
    result = ceiling(tasks, renderer, args.protocol, limits, policy.compact_docs, HIGH)
    print(
        f"profile {args.profile}, protocol {args.protocol}, limits: {limits.max_new_tokens} "
        f"tokens/message, {limits.max_total_tokens}/episode, {limits.max_steps} steps/turn; "
        f"{'compact' if policy.compact_docs else 'full JSON'} tool docs"
    )
    for category, (k, n) in sorted(result.solved.items()):
        print(f"  {category:14} {k:4d}/{n}")
    k, n = result.total
    print(f"  stop reasons of the unsolved: {dict(result.stops) or '-'}")
    for name, lens in (("first prompt", result.prompt_lens), ("episode", result.episode_lens)):
        print(
            f"  {name:13} tokens: median {statistics.median(lens):.0f}, "
            f"p95 {sorted(lens)[int(0.95 * (len(lens) - 1))]}, max {max(lens)}"
        )
    print(f"  longest message: {result.longest_message} tokens (stop included)")
    print(f"  ({time.perf_counter() - start:.0f} s) failed: {' '.join(result.failed[:10]) or '-'}")
    print(f"ceiling {k}/{n}")
    return 0 if k == n else 1


if __name__ == "__main__":
    sys.exit(main())

"""Writes src/rcgrpo/training/plan/episodes.json: the shape of every BFCL multi-turn episode for
`rcgrpo plan`'s rollout simulation, measured by replaying the 800 ground truths.

Each episode is the list of its model calls as (new tokens to prefill, tokens sampled): the
first prompt, then for every later message the tool observations / user turn since the last
one; read off the replayed rollout's loss mask (runs of 0 = prefill, runs of 1 = sampled). The
replay is scripts/ceiling.py's (rcgrpo.data.ceiling.replay: the expert's messages as the
model's, under the profile's limits, <|high_reward|> goal in the prompt). ~1-3 min on 2 cores.

    .venv/bin/python scripts/episode_shapes.py --profile qwen-shape --protocol combined
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rcgrpo.runtime import apply_defaults

OUT = Path(__file__).resolve().parents[1] / "src/rcgrpo/training/plan/episodes.json"


def segments(mask: list[int]) -> list[list[int]]:
    """Loss mask -> [[prefill, sampled], ...]: each run of 0s with the run of 1s after it."""
    out, i = [], 0
    while i < len(mask):
        j = i
        while j < len(mask) and mask[j] == 0:
            j += 1
        k = j
        while k < len(mask) and mask[k] == 1:
            k += 1
        out.append([j - i, k - j])
        i = k
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="qwen-shape")
    ap.add_argument("--protocol", default="combined", choices=["combined", "bfcl"])
    args = ap.parse_args()
    apply_defaults()
    from rcgrpo.bfcl.tasks import load_tasks
    from rcgrpo.chat.prompts import Renderer
    from rcgrpo.chat.record import HIGH
    from rcgrpo.data.ceiling import replay
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import PROFILES, ModelConfig
    from rcgrpo.rollout.agent_loop import Limits

    profile = PROFILES[args.profile]
    limits = Limits(profile.max_new_tokens, profile.max_total_tokens, 20)
    policy = load_policy(ModelConfig(profile=args.profile))
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    episodes = {}
    for task in load_tasks().values():
        rollout, _ = replay(task, renderer, args.protocol, limits, policy.compact_docs, HIGH)
        episodes[task.id] = segments(list(rollout.loss_mask))
    data = {"profile": args.profile, "protocol": args.protocol,
            "source": "scripts/episode_shapes.py: the ground truths replayed", "episodes": episodes}  # fmt: skip
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    lengths = sorted(sum(p + s for p, s in e) for e in episodes.values())
    print(f"{len(episodes)} episodes -> {OUT}: tokens median {lengths[len(lengths) // 2]}, "
          f"max {lengths[-1]}")  # fmt: skip


if __name__ == "__main__":
    main()

"""Two ranks of one RL step's rollout exchange, rank 1 hostile: for tests/test_rendezvous.py.

Run under `torch.distributed.run --nproc-per-node 2 tests/hostile_rank.py MARKER`. Both ranks
set up the real `Ranks` (each holds the run's secret: an insider). Rank 0 rolls out its share
of a step with the toy engine through `rollouts.roll_out`, as the trainer does; rank 1 sends,
where its rollouts go, what `torch.distributed.all_gather_object` sends for an object whose
unpickling runs code: it writes MARKER. Rank 0 must refuse it without running it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # test_trainer, toy_models
from test_trainer import TASKS, ToyEngine, tiny_policy  # noqa: E402

from rcgrpo.rollout.environment import Rewards  # noqa: E402
from rcgrpo.training import distributed  # noqa: E402
from rcgrpo.training.grpo import rollouts  # noqa: E402
from rcgrpo.training.grpo.config import RLConfig  # noqa: E402


class Evil:
    def __reduce__(self):
        return (exec, (f"open({sys.argv[1]!r}, 'w').write('ran')",))


def main() -> None:
    policy = tiny_policy()
    params = list(policy.model.parameters())
    ranks = distributed.for_training(policy.model, torch.optim.AdamW(params), params)
    if ranks.rank == 1:
        torch.distributed.all_gather_object([None, None], Evil())
        return
    cfg = RLConfig(tasks_per_step=2, group_size=2, steps=1, out_dir=str(Path(sys.argv[1]).parent))
    tasks, tokens = rollouts.draw(TASKS, cfg, 0)
    score = lambda task, rollout: Rewards(0.0, {"paper": 0})  # noqa: E731
    rollouts.roll_out(ToyEngine(policy), ranks, tasks, tokens, cfg, 0, score)
    print("rank 0 took the exchange", flush=True)


if __name__ == "__main__":
    main()

"""BFCL's two checkers as named rewards: "paper" (the paper's R = R_state x R_action) and "bfcl"
(BFCL's official check); `reward` (rl.reward) names which one trains.

A rollout of the agent loop carries its verdicts already (scored in one batch per rollout call:
`batch`), so the scorer reads them; any other rollout (calls only) is replayed by the checkers.
`batch` sends a rollout call's trajectories to the sandbox worker in one request: one round trip
per trajectory costs ~0.2 ms of process switches on top of ~0.25 ms of replay, and an RL step's
n x G episodes or an evaluation shard share them (bench/executor.py, the k = 40 row).

    from rcgrpo.envs.bfcl.environment import BFCL
    score = BFCL.scorer("bfcl", reward="paper")     # score(task, rollout) -> Rewards
"""

from __future__ import annotations

from dataclasses import dataclass

from rcgrpo.bfcl.checkers import score, score_many
from rcgrpo.bfcl.replay import Verdict
from rcgrpo.bfcl.tasks import Task
from rcgrpo.rollout.environment import Rewards, carried

CHECKS = ("paper", "bfcl")  # the checkers, in the order reports list them


@dataclass(frozen=True)
class BfclScorer:
    """Rewards of a BFCL rollout under `protocol`, trained on the check named `reward`."""

    protocol: str = "bfcl"
    reward: str = "paper"

    def __post_init__(self):
        if self.reward not in CHECKS:
            raise ValueError(f"BFCL reward {self.reward!r}: one of {CHECKS}")

    def __call__(self, task: Task, rollout) -> Rewards:
        rewards = carried(rollout, self.reward)
        if rewards is not None:
            return rewards
        paper, bfcl = score(task, rollout.calls, self.protocol)
        checks = {"paper": paper.reward, "bfcl": bfcl.reward}
        return Rewards(
            float(checks[self.reward]), checks, {"paper": paper.reason, "bfcl": bfcl.reason}
        )

    def batch(self, items) -> list[Rewards]:
        """(task, rollout) pairs of the agent loop, scored in one request; an episode that
        failed on its own (stop reason "error") scores 0 on both checks, with its reason."""
        failed = [getattr(r, "stop_reason", "") == "error" for _, r in items]
        run = [(task, r.calls) for (task, r), bad in zip(items, failed, strict=True) if not bad]
        verdicts = iter(score_each_alone_on_failure(run, self.protocol))
        out = []
        for (_, r), bad in zip(items, failed, strict=True):
            if bad:
                paper = bfcl = Verdict(False, None, f"episode failed: {r.error}")
            else:
                paper, bfcl = next(verdicts)
            checks = {"paper": paper.reward, "bfcl": bfcl.reward}
            reasons = {"paper": paper.to_dict(), "bfcl": bfcl.to_dict()}
            out.append(Rewards(float(checks[self.reward]), checks, reasons))
        return out


def score_each_alone_on_failure(items, protocol: str) -> list[tuple[Verdict, Verdict]]:
    """`score_many`; if the batch raises (a trusted replay that overruns its limit in a rebuilt
    worker), each trajectory is scored alone and the one that raises fails with the reason."""
    if not items:
        return []
    try:
        return score_many(items, protocol)
    except Exception:  # noqa: BLE001 - find the trajectory at fault below
        out = []
        for task, calls in items:
            try:
                out.append(score(task, calls, protocol))
            except Exception as e:  # noqa: BLE001 - this trajectory's failure, with its reason
                failed = Verdict(False, None, f"scoring failed: {type(e).__name__}: {e}")
                out.append((failed, failed))
        return out

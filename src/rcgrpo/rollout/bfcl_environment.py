"""BFCL v4 multi-turn as an `Environment` (rcgrpo.rollout.environment): its tasks, its
sandboxed episodes and its two checkers as named rewards.

The scorer's checks are "paper" (the paper's R = R_state x R_action) and "bfcl" (BFCL's official
check); `reward` (rl.reward) names which one trains. A rollout from the agent loop carries its
verdicts already (scored in one batch per rollout call, rcgrpo.rollout.agent_loop.results), so
the scorer reads them; any other rollout (calls only) is replayed by the checkers here.

    from rcgrpo.rollout.bfcl_environment import BFCL
    score = BFCL.scorer("bfcl", reward="paper")     # score(task, rollout) -> Rewards
"""

from __future__ import annotations

from dataclasses import dataclass

from rcgrpo.bfcl.environment import STEP_LIMIT, Episode
from rcgrpo.bfcl.tasks import CATEGORIES, Task, tasks_in
from rcgrpo.rollout.environment import Rewards

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
        record = getattr(rollout, "trajectory", None)  # agent_loop.Rollout: already scored
        if record is not None:
            checks = {"paper": int(record.paper_reward), "bfcl": int(record.bfcl_reward)}
            reasons = dict(getattr(record, "reward_reason", None) or {})
        else:
            from rcgrpo.bfcl.checkers import score

            paper, bfcl = score(task, rollout.calls, self.protocol)
            checks = {"paper": paper.reward, "bfcl": bfcl.reward}
            reasons = {"paper": paper.reason, "bfcl": bfcl.reason}
        return Rewards(float(checks[self.reward]), checks, reasons)


class BfclEnvironment:
    """BFCL's tasks (rcgrpo.bfcl.tasks), episodes (rcgrpo.bfcl.environment) and checkers."""

    name = "bfcl"

    def tasks(self, split: str, categories: tuple[str, ...] = CATEGORIES) -> list[Task]:
        return tasks_in(split, tuple(categories))

    def episode(
        self, task: Task, protocol: str = "bfcl", step_limit: int = STEP_LIMIT, sandbox=None
    ) -> Episode:
        """An episode at no turn yet; the bfcl protocol hides miss_func functions until the
        turn that reveals them (the combined one lists every function from the start)."""
        return Episode(task, hide_missed=protocol == "bfcl", step_limit=step_limit, sandbox=sandbox)

    def scorer(self, protocol: str = "bfcl", reward: str | None = None) -> BfclScorer:
        return BfclScorer(protocol, reward or "paper")


BFCL = BfclEnvironment()

"""BFCL episodes in the agent loop for the tests: the loop opened on `BFCL.episode(...)` as an
engine opens it (rcgrpo.rollout.engine), and a finished loop scored as an engine scores a batch."""

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.rollout.agent_loop import AgentLoop, Limits, results


def bfcl_loop(task, renderer, protocol="combined", reward_token=None, limits=Limits(), compact_docs=True, sandbox=None):  # fmt: skip
    """An AgentLoop on a BFCL episode of `task` (its calls in `sandbox`; None: this thread's)."""
    episode = BFCL.episode(task, protocol, limits.max_steps, sandbox)
    return AgentLoop(episode, renderer, reward_token, limits, compact_docs)


def finished(loop):
    """The loop's rollout, scored with its record (agent_loop.results of one loop)."""
    return results([loop], BFCL.scorer(loop.protocol))[0]

"""BFCL's prompt protocol over a sandboxed episode: what the model reads first, what ends a turn
and the episode. The agent loop (rcgrpo.rollout.agent_loop) drives it through the `Episode`
protocol of rcgrpo.rollout.environment; the tools run in rcgrpo.bfcl.environment.Episode.

Protocols:
* "combined" (paper): one prompt "Step 1: ... Step n: ..." with a `done()` tool; every function
  is listed from the start; `done()` ends the episode ("done") and is not scored; a message
  with no call ends it ("no_calls").
* "bfcl" (official): user turns one at a time; in miss_func the held-out functions become
  callable at the reveal turn (the loop lists them in its user message); BFCL's per-turn step
  limit; a message with no call ends the turn, the last turn's ends the episode ("finished").

    .venv/bin/pytest tests/test_agent_loop.py -q
"""

from __future__ import annotations

from rcgrpo.bfcl.environment import STEP_LIMIT, Episode, Step
from rcgrpo.bfcl.tasks import Task

PROTOCOLS = ("bfcl", "combined")  # BFCL's own first: what a model trained with none is scored in
SYSTEM_PROMPT = (
    "You are an agent that completes tasks by calling the functions listed below. To call "
    "functions, reply with only a python list of calls, e.g. [cd(folder='document'), ls()]. "
    "The results come back as tool messages. When the request is complete, reply in plain text."
)
COMBINED_SUFFIX = (
    " The user's request is a list of steps: do them in order, and when every step is done, "
    "call done()."
)
DONE_DOC = {
    "name": "done",
    "description": "Call this when every step of the request is complete. Ends the episode.",
    "parameters": {"type": "dict", "properties": {}, "required": []},
}


def combined_request(turns: list[list[dict]]) -> str:
    """The paper's single prompt: 'Step 1: ...\\nStep 2: ...' over the turns with user text
    (miss_func's empty reveal turns are skipped: in this protocol every function is listed)."""
    texts = [" ".join(m["content"] for m in turn) for turn in turns if turn]
    return "\n".join(f"Step {i}: {text}" for i, text in enumerate(texts, start=1))


class BfclEpisode:
    """One BFCL task in flight under a protocol; its calls run in `sandbox` (None: this
    thread's sandbox worker). `tools` is the sandboxed episode (its state, its instances)."""

    def __init__(
        self, task: Task, protocol: str, split: str, step_limit: int = STEP_LIMIT, sandbox=None
    ):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be 'bfcl' or 'combined', got {protocol!r}")
        self.task, self.protocol, self.split = task, protocol, split
        # the bfcl protocol hides miss_func functions until the turn that reveals them
        hide = protocol == "bfcl"
        self.tools = Episode(task, hide_missed=hide, step_limit=step_limit, sandbox=sandbox)

    def opening(self) -> tuple[list[dict], list[dict]]:
        self.tools.begin_turn(0)
        system, docs = SYSTEM_PROMPT, self.tools.tool_docs()
        if self.protocol == "combined":
            system += COMBINED_SUFFIX
            docs = [*docs, DONE_DOC]
            user = combined_request(list(self.task.turns))
        else:
            user = "\n".join(m["content"] for m in self.task.turns[0])
        return [{"role": "system", "content": system}, {"role": "user", "content": user}], docs

    def step(self, text: str) -> Step:
        step = self.tools.step(text)
        if self.protocol == "combined" and any(c.name == "done" for c in step.calls):
            step.stop = "done"
        return step

    def next_turn(self) -> list[dict] | str:
        if self.protocol == "combined":
            return "no_calls"  # one turn: a message without a call ends the episode
        if self.tools.turn + 1 >= self.tools.n_turns:
            return "finished"
        return self.tools.begin_turn()

    def tool_docs(self) -> list[dict]:
        return self.tools.tool_docs()

    @property
    def steps_left(self) -> int:
        return self.tools.steps_left

"""The wall clock of one episode in flight: when each model message was asked for and sampled,
and when its tool calls ran, as the agent loop lives through them.

Why here and not in the trace writer: a rollout batch interleaves many episodes in one engine
call, so only the loop that feeds an episode knows when its own message came back and how long
its own calls took; the per-call seconds are the episode's step result's, where it measures
them (BFCL: in the tool worker, around each dispatch). rcgrpo.tracking lays the spans out from `record()`.

    clock = EpisodeClock(); clock.sampled(); clock.tools_started(); clock.tools_done(step)
    .venv/bin/pytest tests/test_traces.py -q -k timed
"""

from __future__ import annotations

import time


class EpisodeClock:
    """Times in ns since the epoch. One entry per assistant message:
    [asked, sampled, tools_start, tools_end, seconds per call (None: killed by a limit)];
    asked..sampled is the message's time in the engine (queued + generated)."""

    def __init__(self):
        self.start = self.asked = time.time_ns()  # asked: when the pending ids were ready
        self.end = 0
        self.messages: list[list] = []

    def sampled(self) -> int:
        """A message came back; returns how many were recorded before it (for `drop`)."""
        self.messages.append([self.asked, time.time_ns(), 0, 0, []])
        return len(self.messages) - 1

    def drop(self, keep: int) -> None:
        """Forget the messages after the first `keep` (the loop rolled a failed one back)."""
        del self.messages[keep:]

    def tools_started(self) -> None:
        self.messages[-1][2] = time.time_ns()

    def tools_done(self, step) -> None:
        """step: the episode's step result; its optional `seconds` and `overran` per call (an
        environment that does not time its calls: 0.0 each)."""
        took = getattr(step, "seconds", None) or [0.0] * len(step.calls)
        overran = getattr(step, "overran", None) or [False] * len(took)
        seconds = [None if o else t for o, t in zip(overran, took, strict=True)]
        self.messages[-1][3:] = [time.time_ns(), seconds]

    def ready(self) -> None:
        """The next prompt's ids are ready: the next message is asked for now."""
        self.asked = time.time_ns()

    def finish(self) -> None:
        self.end = time.time_ns()

    def record(self) -> dict:
        """{"start", "end", "messages"}: what Rollout.timing holds."""
        return {"start": self.start, "end": self.end, "messages": self.messages}

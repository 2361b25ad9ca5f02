"""Episode schedulers: how the episodes of one rollout call reach the engine.

`lockstep` (the old loop): every round gathers the episodes waiting for the model, sorts them
longest first, generates their next messages in batches of `max_batch`, then runs their tool
calls one after the other; the next round starts when every episode of this one is back.

`run_async` (rollout.scheduler: async): each episode runs in its own thread, from its first
prompt to its end: request a message, execute its calls, request the next one. At most
`max_in_flight` episodes run at once; a finished one hands its slot to the next episode at once.
Tool calls run in a pool of sandbox workers (`ToolPool`, episode i in worker i mod k), so the
tool calls of different episodes run concurrently and overlap generation. How a request reaches
the model is the engine's `client`:
* a server engine (vLLM) sends each request as it comes (the server batches whatever is
  running, iteration by iteration);
* an in-process batched engine (HF) gets a `RoundBatcher`: it generates once every episode in
  flight has its request queued, the batch sorted longest first (episode index breaking ties) and
  cut into `max_batch` rows, exactly as a lock-step round. Forming a batch from whoever happens
  to be ready would make the batch composition, and with it the last bits of the logits, depend
  on thread timing: sampled ids and exact resume would no longer reproduce on the CPU. So with
  max_in_flight >= the episodes of the call, HF gives bit-for-bit the lock-step rollouts; what
  async adds there is the concurrent tool calls.
Sampling seeds are per (seed, episode index, step), so no scheduler changes what an episode samples.

    .venv/bin/pytest tests/test_scheduler.py -q
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from rcgrpo.rollout.agent_loop import AgentLoop


def episode_seed(seed: int, index: int, step: int) -> int:
    """A 63-bit seed for (run seed, episode, step): mixes with large odd constants."""
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + step * 0x94D049BB133111EB) & (
        (1 << 63) - 1
    )


def lockstep(engine, loops: list[AgentLoop], seed: int, first_index: int) -> None:
    """Drive `loops` to their end in rounds (every round waits for its slowest episode)."""
    steps = [0] * len(loops)
    while waiting := [i for i, loop in enumerate(loops) if loop.pending() is not None]:
        # Longest first: sequences of similar length share a batch (less padding).
        waiting.sort(key=lambda i: -len(loops[i].ids))
        for start in range(0, len(waiting), engine.cfg.max_batch):
            batch = waiting[start : start + engine.cfg.max_batch]
            samples = engine.generate(
                [loops[i].ids for i in batch],
                [loops[i].max_new() for i in batch],
                [episode_seed(seed, first_index + i, steps[i]) for i in batch],
                episodes=[first_index + i for i in batch],
            )
            for i, sample in zip(batch, samples, strict=True):
                engine.replied(sample)
                loops[i].feed(sample.ids, sample.logprobs)
                steps[i] += 1
                if loops[i].pending() is None:
                    engine.finished(loops[i].ids, first_index + i)


class Flight:
    """The episodes of one async rollout call: which may start next, how many are in flight.

    `active` counts episodes handed to a thread and not finished. A thread that finishes an
    episode takes the next one in the same locked step (`claim(finished=True)`), so `active`
    never dips while a successor is being set up: the RoundBatcher's "every episode in flight
    has queued" is then the same set of episodes whatever the thread timing."""

    def __init__(self, n: int, max_in_flight: int):
        self.cond = threading.Condition()
        self.n, self.active = n, min(n, max_in_flight)
        self.next = self.active  # episodes 0..active-1 are handed out by the caller
        self.error: BaseException | None = None
        self.in_flight_max = self.active

    def claim(self, finished: bool) -> int | None:
        with self.cond:
            self.active -= finished
            index = None
            if self.error is None and self.next < self.n:
                index, self.next, self.active = self.next, self.next + 1, self.active + 1
            self.cond.notify_all()
            return index

    def fail(self, error: BaseException) -> None:
        with self.cond:
            self.error = self.error or error
            self.cond.notify_all()


class ToolPool:
    """k sandbox workers (rcgrpo.bfcl.sandbox), started on first use and kept by the engine:
    episode i executes its calls in worker i mod k, so k tool calls can run at once."""

    def __init__(self, k: int = 0):
        self.k = k or min(16, os.cpu_count() or 1)  # 0: one per core, at most 16 processes
        self._sandboxes: list = []
        self._lock = threading.Lock()

    def sandbox(self, index: int):
        from rcgrpo.bfcl.sandbox import Sandbox, configured

        with self._lock:
            while len(self._sandboxes) < self.k:
                self._sandboxes.append(Sandbox(configured()))
            return self._sandboxes[index % self.k]

    def close(self) -> None:
        for sandbox in self._sandboxes:
            sandbox.close()
        self._sandboxes = []


def run_async(
    engine, make_loop: Callable[[int], AgentLoop], n: int, seed: int, first_index: int
) -> list[AgentLoop]:
    """Run n episodes (make_loop(i) builds episode i, in its thread) with at most
    engine.cfg.max_in_flight in flight; returns the finished loops in episode order."""
    loops: list[AgentLoop | None] = [None] * n
    flight = Flight(n, engine.cfg.max_in_flight)
    with engine.client(flight) as client:

        def episode(i: int) -> None:
            loop = loops[i] = make_loop(i)
            step = 0
            while (ids := loop.pending()) is not None:
                if flight.error is not None:
                    return  # another episode failed: stop early, the error is raised below
                sample = client(
                    ids, loop.max_new(), episode_seed(seed, first_index + i, step), first_index + i
                )
                loop.feed(sample.ids, sample.logprobs)
                step += 1
            client.finished(loop.ids, first_index + i)

        def worker(index: int | None) -> None:
            while index is not None:
                try:
                    episode(index)
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                    flight.fail(e)
                index = flight.claim(finished=True)

        threads = [
            threading.Thread(target=worker, args=(i,), name=f"rollout-episode-{i}", daemon=True)
            for i in range(flight.active)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if flight.error is not None:
        raise flight.error
    engine.in_flight_max = flight.in_flight_max
    return loops  # type: ignore[return-value]


class _Slot:
    """One request's answer, set by the generating thread (a Sample or an exception)."""

    def __init__(self):
        self.done = threading.Event()
        self.value = self.error = None

    def get(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


class RoundBatcher:
    """The async client of an in-process batched engine (HF): one generating thread that runs a
    round once every episode in flight has queued its request (see the module docstring)."""

    def __init__(self, engine, flight: Flight):
        self.engine, self.flight = engine, flight
        self.queue: list[tuple] = []  # (episode, prompt, max_new, seed, slot)
        self.done_ids: list[tuple[list[int], int]] = []  # finished episodes, for engine.finished
        self.closed = False

    def __enter__(self):
        self.thread = threading.Thread(target=self._loop, name="rollout-generate", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        with self.flight.cond:
            self.closed = True
            self.flight.cond.notify_all()
        self.thread.join()

    def __call__(self, prompt: list[int], max_new: int, seed: int, episode: int):
        slot = _Slot()
        with self.flight.cond:
            self.queue.append((episode, prompt, max_new, seed, slot))
            self.flight.cond.notify_all()
        return slot.get()

    def finished(self, ids: list[int], episode: int) -> None:
        with self.flight.cond:
            self.done_ids.append((ids, episode))

    def _ready(self) -> bool:
        return self.closed or (bool(self.queue) and len(self.queue) >= self.flight.active)

    def _loop(self) -> None:
        engine, cond = self.engine, self.flight.cond
        while True:
            with cond:
                cond.wait_for(self._ready)
                if not self.queue:
                    return  # closed and nothing left
                batch, self.queue = self.queue, []
                done, self.done_ids = self.done_ids, []
            for ids, episode in done:
                engine.finished(ids, episode)
            batch.sort(key=lambda r: (-len(r[1]), r[0]))  # = lockstep's order
            for start in range(0, len(batch), engine.cfg.max_batch):
                rows = batch[start : start + engine.cfg.max_batch]
                try:
                    samples = engine.generate(
                        [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
                    )
                except BaseException as e:  # noqa: BLE001 - handed to every waiting episode
                    for r in rows:
                        r[4].error = e
                        r[4].done.set()
                    continue
                for r, sample in zip(rows, samples, strict=True):
                    engine.replied(sample)
                    r[4].value = sample
                    r[4].done.set()


class DirectClient:
    """The async client of a server engine (`engine.request(prompt, max_new, seed, episode)`,
    thread-safe): every request goes out as it comes; the server batches what is running."""

    def __init__(self, engine):
        self.engine = engine

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def __call__(self, prompt: list[int], max_new: int, seed: int, episode: int):
        sample = self.engine.request(prompt, max_new, seed, episode)
        self.engine.replied(sample)
        return sample

    def finished(self, ids: list[int], episode: int) -> None:
        self.engine.finished(ids, episode)


class Clock:
    """Busy time of one resource (a server, the in-process model): the union of the intervals
    during which at least one request was in progress, from the client's side."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running, self.since, self.busy = 0, 0.0, 0.0

    def start(self) -> None:
        with self.lock:
            if self.running == 0:
                self.since = time.perf_counter()
            self.running += 1

    def stop(self) -> None:
        with self.lock:
            self.running -= 1
            if self.running == 0:
                self.busy += time.perf_counter() - self.since

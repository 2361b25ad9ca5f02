"""Heartbeats of the ranks of a launched training run, and the watcher that names a stalled
rank: each rank's thread rewrites <out_dir>/heartbeat/rank_<r>.json every `every_s` seconds with
its step, phase, when the phase began, its last progress and the time, then reads every rank's
file (every rank watches: a frozen rank 0 is named by the others). When a rank made no progress
for `stall_s` seconds outside a wait at a collective, it prints one line naming it (rank, its
phase and step, the age) and ends the process with exit code 3, so torchrun stops the other
ranks and the run fails in minutes instead of hanging until the process-group timeout (hours:
it must cover a whole rollout).

Why progress and not just the beat: a rank blocked in Python (a hung tool call, a server that
never answers, a sleep) keeps its beat thread alive, so a beat only proves the process exists. The
main thread's progress is recorded where it is cheap: every forward of the model (a pre-hook on
its input embeddings: each training micro-batch, each HF decode step), every phase change, and
every reply of the rollout engine (Engine.watch: the scheduler ticks on each message back, a vLLM
server's included, whose forwards run in another process). A
rank waiting for the others at a collective of ours (`waiting`) is not stalled; of the ranks that
stopped, the one that stopped first is named (the others are waiting for it). A frozen process
(no beat for `stall_s`) is named too.

    hb = Heartbeat(out_dir, rank, world, every_s=30, stall_s=300)
    hb.watch(model)               # ticks on every forward
    engine.watch(hb.tick)         # ... and on every reply of the rollout engine
    hb.phase("rollout", step)     # ... "update", "sync", "save"
    with hb.waiting("gather"): ...
    hb.close()
    .venv/bin/pytest tests/test_scale.py -q -k stall
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

STALL_EXIT = 3  # the exit code of a run ended by the watcher
TEST_STALL_ENV = "RCGRPO_TEST_STALL"  # "RANK:PHASE:SECONDS": a fault injected by tests only


class Heartbeat:
    """This rank's beat thread (and on rank 0 the watcher); see the module docstring."""

    def __init__(self, out_dir, rank: int, world: int, every_s: float, stall_s: float):
        self.folder = Path(out_dir) / "heartbeat"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rank, self.world, self.every_s, self.stall_s = rank, world, every_s, stall_s
        now = time.time()
        self.state = {"rank": rank, "pid": os.getpid(), "step": 0, "phase": "start"}
        self.state |= {"since": now, "progress": now, "waiting": False}
        self._hook = None
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{rank}", daemon=True)
        self._thread.start()

    # -- the main thread ------------------------------------------------------------------------
    def tick(self, *_args) -> None:
        """Progress (a forward pass, an engine's reply, a phase change): one float written,
        nothing else (any thread)."""
        self.state["progress"] = time.time()

    def watch(self, model) -> None:
        """Tick on every forward of `model` (a pre-hook on its input embeddings)."""
        self._hook = model.get_input_embeddings().register_forward_pre_hook(self.tick)

    def phase(self, name: str, step: int) -> None:
        now = time.time()
        self.state.update(step=step, phase=name, since=now, progress=now, waiting=False)
        self._beat()
        _injected_stall(self.rank, name)

    @contextlib.contextmanager
    def waiting(self, what: str):
        """Around a collective of ours: this rank waits for the others, it is not stalled."""
        self.state["waiting"] = what
        try:
            yield
        finally:
            self.state["waiting"] = False
            self.tick()

    def close(self) -> None:
        """Stop beating; the last beat says "done" (a rank still saving is not kept waiting on a
        finished one's silence)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.state.update(phase="done", waiting="done")
        self._beat()
        if self._hook is not None:
            self._hook.remove()

    # -- the thread -------------------------------------------------------------------------------
    def _beat(self) -> None:
        path = self.folder / f"rank_{self.rank}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({**self.state, "time": time.time()}))
        tmp.replace(path)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self._beat()
                line = stalled(self.read(), time.time(), self.stall_s)
                if line:  # every rank watches: a frozen rank 0 is named by the others
                    print(f"rcgrpo: {line}", file=sys.stderr, flush=True)
                    os._exit(STALL_EXIT)  # the main thread may sit in a collective for hours
            except OSError:  # an unreadable beat (being replaced): the next round reads it
                continue

    def read(self) -> dict[int, dict]:
        beats = {}
        for r in range(self.world):
            with contextlib.suppress(OSError, ValueError):
                beats[r] = json.loads((self.folder / f"rank_{r}.json").read_text())
        return beats


def stalled(beats: dict[int, dict], now: float, stall_s: float) -> str | None:
    """The one-line verdict on the ranks' beats, or None. A rank is stalled when its beat is
    older than stall_s (a frozen or vanished process) or, outside a wait at a collective, its
    last progress is; of several, the one that stopped first."""
    late = []
    for r, b in beats.items():
        if b["phase"] == "done":  # finished its loop: silent from now on
            continue
        silent = now - b["time"]
        if silent > stall_s:
            late.append((b["time"], r, f"no heartbeat for {silent:.0f} s"))
        elif not b["waiting"] and now - b["progress"] > stall_s:
            late.append((b["progress"], r, f"no progress for {now - b['progress']:.0f} s"))
    if not late:
        return None
    _, r, why = min(late)
    b = beats[r]
    return (
        f"rank {r} (pid {b['pid']}) stalled: {why}, in phase {b['phase']} of step {b['step']} "
        f"(entered {now - b['since']:.0f} s ago; stall window {stall_s:g} s); the run is stopped "
        f"instead of waiting for the collective timeout: see that rank's output above"
    )


def _injected_stall(rank: int, phase: str) -> None:
    """A test's fault: RCGRPO_TEST_STALL=RANK:PHASE:SECONDS sleeps that rank's main thread on
    entering that phase (a hang cannot otherwise be caused on demand). Never set in a run."""
    spec = os.environ.get(TEST_STALL_ENV)
    if spec:
        want_rank, want_phase, seconds = spec.split(":")
        if int(want_rank) == rank and want_phase == phase:
            time.sleep(float(seconds))


def for_rank(cfg, ranks, engine, model) -> Heartbeat | None:
    """Under a launcher: an RL rank's Heartbeat (`follow`); else None (launched ranks only: a
    stalled one is named)."""
    from rcgrpo.training import distributed

    if not distributed.launched() or not cfg.heartbeat_s:
        return None
    hb = Heartbeat(cfg.out_dir, ranks.rank, ranks.world, cfg.heartbeat_s, cfg.stall_s)
    return follow(hb, ranks, engine, model)


def follow(hb: Heartbeat, ranks, engine, model) -> Heartbeat:
    """hb's progress: the model's forwards and every reply of the rollout engine (the engine the
    trainer holds: a ShardedEngine passes it to its own); waits at the ranks' collectives
    (ranks.waiting) are not stalls."""
    hb.watch(model)
    engine.watch(hb.tick)
    ranks.waiting = hb.waiting
    return hb

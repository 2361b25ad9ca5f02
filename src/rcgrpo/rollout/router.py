"""Which vLLM server gets a request: least-loaded first turn, sticky later turns (verl's routing).

An episode's first request goes to the server with the fewest requests of ours in progress (ties:
the lowest index); every later request of that episode goes to the same server, whose prefix
cache holds the episode's earlier turns (each message re-sends the whole growing prefix, and only
the server that computed it can skip it). `forget` drops an episode's entry when it is over.

    .venv/bin/pytest tests/test_scheduler.py -q -k router
"""

from __future__ import annotations

import os
import subprocess
import threading


class Router:
    def __init__(self, n: int):
        self.lock = threading.Lock()
        self.load = [0] * n  # requests in progress per server
        self.served = [0] * n  # requests sent per server (running count)
        self.sticky: dict[int, int] = {}  # episode -> server

    def acquire(self, episode: int | None) -> int:
        """The server for the next request of `episode` (None: no episode, least-loaded)."""
        with self.lock:
            server = self.sticky.get(episode) if episode is not None else None
            if server is None:
                server = min(range(len(self.load)), key=lambda i: (self.load[i], i))
                if episode is not None:
                    self.sticky[episode] = server
            self.load[server] += 1
            self.served[server] += 1
            return server

    def release(self, server: int) -> None:
        """A request sent to `server` is answered (or failed)."""
        with self.lock:
            self.load[server] -= 1

    def forget(self, episode: int) -> None:
        with self.lock:
            self.sticky.pop(episode, None)

    def reset(self) -> None:
        """A new rollout call: episode indices start over."""
        with self.lock:
            self.sticky.clear()


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries ([] without nvidia-smi)."""
    from shutil import which

    if which("nvidia-smi") is None:
        return []
    if (env := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def gpu_of(device: str | None) -> str | None:
    """The physical GPU id of torch device "cuda:i" (or "cuda": 0) for a child's
    CUDA_VISIBLE_DEVICES: entry i of ours when set (e.g. "2,3" and cuda:1 -> "3"), else i;
    None for a CPU device or none given."""
    if not device or not str(device).startswith("cuda"):
        return None
    index = int(str(device).partition(":")[2] or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    return visible[index] if visible else str(index)

"""Process defaults every entry point applies first: telemetry off, sane timeouts.

Called by the CLI, the flows and the test suite (never at import time: importing rcgrpo has no
side effects). Values already set in the environment win, so a user can override any of them.
The Hugging Face hub is NOT put offline: a model asked for by hub id (the 7B profiles, or
model.path=org/name) is downloaded into the HF cache on a fresh GPU box. Nothing else asks the
hub for anything (the tiny and qwen-shape models are built here and load from local folders,
the vLLM server loads a local export with HF_HUB_OFFLINE=1), and HF_HUB_OFFLINE=1 set by the
user (or the test suite, tests/conftest.py) still wins.
`torch_threads(n)` runs a block (the rollout engines' generate) with a deliberate torch thread
count: n, else $RCGRPO_TORCH_THREADS, else 1 (measured below).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULTS = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    # 2 cores: the ephemeral Prefect server needs longer than its 20 s default to start.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    # The ephemeral server a flow run starts (no PREFECT_API_URL) has no UI, so no page of any
    # origin may call it (Prefect's default is CORS "*"), and CSRF tokens are required (its own
    # client fetches them). `rcgrpo ui` sets its UI's origin instead (rcgrpo.servers).
    "PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS": "",
    "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "true",
}


def apply_defaults() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    cache = project_root() / "cache"
    # bfcl-eval writes result folders under its package dir unless told where the project is.
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(cache / "bfcl"))
    # caches that default to the shared /tmp (tiktoken's BPE files for the qwen-shape tokenizer,
    # torch.compile's kernels, vLLM's included): the project's cache/, kept between runs
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(cache / "tiktoken"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))


PROJECT_ENV = "RCGRPO_PROJECT"  # the checkout to use, for an installed `rcgrpo` run anywhere


def project_root() -> Path:
    """$RCGRPO_PROJECT (`rcgrpo run --project DIR` sets it), else the checkout this package runs
    from (where params.yaml lives), else the working dir."""
    if chosen := os.environ.get(PROJECT_ENV):
        return Path(chosen).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "params.yaml").exists() and (parent / "pyproject.toml").exists():
            return parent
    return Path.cwd()


def replace_dir(tmp: Path, path: Path) -> Path:
    """Put the finished folder `tmp` at `path` by renames (same parent, same filesystem): the
    old `path` stays whole until the new one is complete, and is removed only after the swap."""
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return path


# -- torch CPU threads ---------------------------------------------------------------------------
# Why 1 by default (bench/rollout.py, bfcl protocol, 32 episodes, tiny model, this 2-core box):
#   quiet box (load ~1, the bench itself): 2 threads batched 2.64 s, naive 17.3 s;
#                                          1 thread  batched 3.34 s, naive 26.1 s.
#   shared box (load 3-4, other users):    2 threads batched 122 s,  naive 300 s;
#                                          1 thread  batched 4.2-4.6 s, naive 29-30 s.
# torch's OpenMP threads spin-wait between ops; when another process holds the second core, every
# op of a decode step waits for a preempted thread (27x slower batched, 10x naive), while 1 thread
# loses 1.3x (batched) to 1.5x (naive) on a quiet box. OMP_WAIT_POLICY=PASSIVE (sleep, not spin)
# removed the cliff under load (2 threads 5.8 s) but cost 2.3x on the quiet box (6.1 s, a wake-up
# per op), so it is not set here. On a dedicated machine set RCGRPO_TORCH_THREADS (or
# rollout.threads) to its core count.
TORCH_THREADS_ENV = "RCGRPO_TORCH_THREADS"
DEFAULT_TORCH_THREADS = 1


def torch_thread_count(n: int = 0) -> int:
    """The thread count to use: n if > 0, else $RCGRPO_TORCH_THREADS, else the default."""
    if n > 0:
        return n
    env = os.environ.get(TORCH_THREADS_ENV, "")
    if env and not (env.isdigit() and int(env) > 0):
        raise ValueError(f"{TORCH_THREADS_ENV} must be a positive integer, got {env!r}")
    return int(env) if env else DEFAULT_TORCH_THREADS


@contextmanager
def torch_threads(n: int = 0) -> Iterator[int]:
    """Run the block with torch_thread_count(n) intra-op threads, then restore the old count."""
    import torch

    old, new = torch.get_num_threads(), torch_thread_count(n)
    if new != old:
        torch.set_num_threads(new)
    try:
        yield new
    finally:
        if new != old:
            torch.set_num_threads(old)

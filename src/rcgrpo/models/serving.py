"""One served base per run: the folder an inference server loads, exported once and shared.

A LoRA policy is served as its base weights (with the reward-token rows as the policy has them)
plus an adapter. That base is ~15 GB for a 7B in bf16 and takes a full reload of the base on the
host to write, so it is exported once per run, not once per engine: `shared_base` keys the
folder by what is in it (base source, dtype, the reward rows' bytes), exports under an exclusive
file lock (the first rank to ask writes it, the local ranks after it wait and reuse it), and
every later engine of the run (RL's ranks, the evaluations) whose rows are the same serves the
same folder. The folder lives under the run's output (`served_bases`, entered by `rcgrpo run`,
sets RCGRPO_SERVED_DIR for the stages and their torchrun ranks) and is removed when the run
ends. Every node's torchrun agent (rcgrpo.tracking.stage.launch: node 0 of `rcgrpo run`, a
joining node of `--nnodes`, `rcgrpo stage STAGE --procs N`) runs its ranks inside
`node_bases()`: the run's folder when there is one, else a folder of this node's own for that
launch, so the ranks of a node share one export (a rank of a joining node used to export its own
15 GB base). A kill -9 gives no chance to remove it: the next `served_bases` on this host removes
the `served-<host>-<pid>` folders whose pid is gone. An engine outside any of these exports into
its own working folder, removed when it closes.

    .venv/bin/pytest tests/test_lifecycle.py -q -k export
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from rcgrpo.owned import private_dir, sweep_dead

SERVED_ENV = "RCGRPO_SERVED_DIR"  # the run's folder of served bases (set by served_bases)
DONE = ".complete"  # written last: a folder without it is an interrupted export


def served_root() -> Path | None:
    """The run's folder of served bases, None outside a run."""
    value = os.environ.get(SERVED_ENV)
    return Path(value) if value else None


def base_key(policy) -> str:
    """What a served base holds, as a short hash: base source, dtype and reward rows."""
    from rcgrpo.models.export import head_rows, reward_rows
    from rcgrpo.models.sources import base_source

    h = hashlib.sha256(f"{base_source(policy.config)}|{policy.config.dtype}".encode())
    for rows in (reward_rows(policy), head_rows(policy)):
        if rows is not None:
            h.update(rows.float().numpy().tobytes())
    return h.hexdigest()[:16]


def base_for(policy, own: Path) -> Path:
    """The served base an engine of `policy` serves: the run's or node's shared one (a LoRA
    policy's, under RCGRPO_SERVED_DIR), else one exported under the engine's own folder `own`."""
    return shared_base(policy, served_root() or own)


def shared_base(policy, root: Path) -> Path:
    """root/<key>: the served base of a LoRA policy, exported by the first caller (under an
    exclusive lock on root/.lock) and reused by every later one with the same key."""
    from rcgrpo.models.export import export_for_serving

    private_dir(root)  # the user's alone: nobody else reads the weights or holds the lock
    folder = root / base_key(policy)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (folder / DONE).exists():
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # an export cut short by a crash
        export_for_serving(policy, folder)
        (folder / DONE).write_text("")
    return folder


@contextlib.contextmanager
def served_bases(folder: str | Path) -> Iterator[Path]:
    """The run's folder of served bases for everything started inside (env RCGRPO_SERVED_DIR,
    inherited by the stages' processes), removed on the way out however the run ends. The
    folders `served-<host>-<pid>` beside it of this host whose process is gone (a kill -9 runs
    no `finally`) go first; another node's, on a shared outputs/, are its own business."""
    folder = Path(folder).resolve()
    sweep_dead(folder.parent, f"served-{socket.gethostname()}-")
    old = os.environ.get(SERVED_ENV)
    os.environ[SERVED_ENV] = str(folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if old is None:
            os.environ.pop(SERVED_ENV, None)
        else:
            os.environ[SERVED_ENV] = old


def node_bases() -> contextlib.AbstractContextManager:
    """For a launch of ranks on this node: the run's folder of served bases when one is set,
    else `served_bases` on outputs/served-<host>-<pid> (host: nodes may share outputs/)."""
    if served_root() is not None:
        return contextlib.nullcontext(served_root())
    from rcgrpo.runtime import project_root

    return served_bases(project_root() / "outputs" / f"served-{socket.gethostname()}-{os.getpid()}")

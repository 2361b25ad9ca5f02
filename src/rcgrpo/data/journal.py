"""The build lock on data/ and the publish journal it replays: one build or rollback at a time, and
whatever a killed publish left behind undone (before its git commit) or finished (after it) by
the next process that takes the lock.

A journal (.dvc/tmp/rcgrpo-publish.json, written by rcgrpo.data.publishing before its first
rename) records what moves where; `recover` reads it. `rcgrpo` runs it at start too.

    with build_lock(root):   # waits for another build; recovers a killed publish first
        ...
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from rcgrpo.data.versioning import BuildLocked, _git, push

LOCK_NAME = "rcgrpo-build.lock"
JOURNAL = "rcgrpo-publish.json"  # in .dvc/tmp: what a publish in progress has moved where


def journal_path(root: Path) -> Path:
    return root / ".dvc" / "tmp" / JOURNAL


def write_journal(root: Path, entry: dict) -> None:
    tmp = journal_path(root).with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, journal_path(root))  # atomic: the journal is always whole


def recover(root: str | Path) -> str | None:
    """Finish or undo a publish that was killed (call with the build lock held; build_lock
    does). Before its git commit: the previous data/, data.dvc and .gitignore go back and the
    new build is kept where it was built. After it: the push is redone. Returns what it did."""
    root = Path(root).resolve()
    path = journal_path(root)
    if not path.exists():
        return None
    j = json.loads(path.read_text())
    data, backup, new = root / j["data_dir"], Path(j["backup"]), Path(j["new"])
    if j["phase"] == "committed":
        push(root, j["data_dir"])  # raises (journal kept) if the remote is still unreachable
        did = f"finished the publish of {j['data_dir']}/ killed before its push (pushed now)"
    else:
        if data.exists() and (backup.exists() or not j["had_data"]):  # data/ is the new build
            if new.exists():
                shutil.rmtree(data)
            else:
                data.rename(new)
        if backup.exists():
            backup.rename(data)
        dvc_file = root / f"{j['data_dir']}.dvc"
        _git(root, "reset", "-q", "--", dvc_file.name, ".gitignore", check=False)  # unstage
        if j["dvc_before"] is None:
            dvc_file.unlink(missing_ok=True)
        else:
            dvc_file.write_text(j["dvc_before"])
        (root / ".gitignore").write_text(j["gitignore_before"])
        did = (
            f"undid a publish of {j['data_dir']}/ killed before its commit; new build kept in {new}"
        )
    shutil.rmtree(backup, ignore_errors=True)
    path.unlink()
    return did


@contextlib.contextmanager
def build_lock(root: str | Path, timeout: float = 600.0):
    """Exclusive lock on data/ for one build or rollback; waits up to `timeout` seconds."""
    from filelock import FileLock, Timeout

    tmp = Path(root) / ".dvc" / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    lock, info = FileLock(str(tmp / LOCK_NAME)), tmp / f"{LOCK_NAME}.holder"
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        holder = info.read_text().strip() if info.exists() else "unknown"
        raise BuildLocked(
            f"another dataset build or rollback holds {tmp / LOCK_NAME} ({holder}); waited "
            f"{timeout:.0f} s. Wait for it to finish or raise dataset.lock_timeout_s."
        ) from None
    try:
        info.write_text(f"pid {os.getpid()} since {time.strftime('%H:%M:%S')}")
        if did := recover(root):  # a publish killed earlier: finish or undo it first
            import warnings

            warnings.warn(did, stacklevel=3)
        yield
    finally:
        info.unlink(missing_ok=True)
        lock.release()

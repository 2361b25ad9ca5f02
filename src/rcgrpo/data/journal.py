"""The build lock on data/ and the publish journal it replays: one build or rollback at a time, and
whatever a killed publish left behind undone (before its git commit) or finished (after it) by
the next process that takes the lock; staging folders of killed builds are removed there too.

A journal (.dvc/tmp/rcgrpo-publish.json, written by rcgrpo.data.publishing before its first
rename and again before its git commit) records what moves where; `recover` reads it, acts only
on paths a publish could have written (a journal naming anything else is refused, never
followed) and deletes nothing but the previous version's copy in .dvc/tmp once it is back.
`rcgrpo` runs it at start too.

    with build_lock(root):   # waits for another build; recovers a killed publish first
        ...
    .venv/bin/pytest tests/test_versioning.py tests/test_recovery.py -q
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path

from rcgrpo.data.versioning import BuildLocked, VersioningError, _git, _md5_of, _remote_dir, push
from rcgrpo.owned import private_dir

LOCK_NAME, LOCKS = "rcgrpo-build.lock", "rcgrpo-locks"  # .dvc/tmp/rcgrpo-locks/<the lock>
JOURNAL = "rcgrpo-publish.json"  # in .dvc/tmp: what a publish in progress has moved where
STAGING, KEPT, PREVIOUS = "rcgrpo-staging-", "rcgrpo-kept-", "rcgrpo-previous-"


def journal_path(root: Path) -> Path:
    return root / ".dvc" / "tmp" / JOURNAL


def write_journal(root: Path, entry: dict) -> None:
    tmp = journal_path(root).with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, journal_path(root))  # atomic: the journal is always whole


def _checked(root: Path, j) -> tuple[Path, Path, Path]:
    """(data, backup, new) of a journal, each where a publish puts it, else VersioningError:
    recovery renames these, so a corrupt or planted journal must not steer it. data: a folder
    of the project that git tracks no file in (not src/), outside .git, .dvc and the remote,
    that is a DVC-tracked data folder or holds a build (manifest.json) or is absent; backup:
    .dvc/tmp/rcgrpo-previous-*; new: inside the project."""
    tmp = root / ".dvc" / "tmp"
    try:
        data, backup, new = root / j["data_dir"], Path(j["backup"]), Path(j["new"])
        ok = j["phase"] in ("swap", "commit", "committed") and isinstance(j["had_data"], bool)
    except (TypeError, KeyError):
        ok = False
    if ok:
        data, new = data.resolve(), new.resolve()
        guarded = (root / ".git", root / ".dvc", _remote_dir(root))
        ok = (
            data != root
            and data.is_relative_to(root)
            and not any(data.is_relative_to(g) or g.is_relative_to(data) for g in guarded)
            and not _git(root, "ls-files", "--", str(data), check=False)
            and (
                not data.exists()
                or (data / "manifest.json").is_file()
                or (root / f"{j['data_dir']}.dvc").is_file()
            )
            and backup.parent == tmp
            and backup.name.startswith(PREVIOUS)
            and new.is_relative_to(root)
            and new not in (root, data)
            and not new.is_relative_to(root / ".git")
        )
    if not ok:
        raise VersioningError(
            f"{journal_path(root)} is not a journal rcgrpo wrote (it names paths a publish "
            "does not write): left as it is, nothing was moved; read it and delete it"
        )
    return data, backup, new


def _landed(root: Path, j: dict) -> bool:
    """Whether the git commit of a publish killed in its 'commit' phase was made: HEAD moved
    since the journal was written and data.dvc at HEAD names the new build."""
    head = _git(root, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
    if not head or head == j.get("head_before"):
        return False
    text = _git(root, "show", f"HEAD:{j['data_dir']}.dvc", check=False)
    try:
        return bool(text) and _md5_of(text) == j.get("md5")
    except VersioningError:
        return False


def recover(root: str | Path) -> str | None:
    """Finish or undo a publish that was killed (call with the build lock held; build_lock
    does). Before its git commit: the previous data/, data.dvc and .gitignore go back and the
    new build is kept in .dvc/tmp/rcgrpo-kept-*. After it (also a kill between the commit and
    the journal's update): the push is redone. Returns what it did."""
    root = Path(root).resolve()
    path = journal_path(root)
    if not path.exists():
        return None
    try:
        j = json.loads(path.read_text())
    except (OSError, ValueError):
        j = None
    data, backup, new = _checked(root, j)
    if j["phase"] == "committed" or (j["phase"] == "commit" and _landed(root, j)):
        push(root, j["data_dir"], j.get("remote"))  # raises (journal kept) while unreachable
        did = f"finished the publish of {j['data_dir']}/ killed before its push (pushed now)"
    else:
        if data.exists() and (backup.exists() or not j["had_data"]):  # data/ is the new build
            if new.exists():  # kept twice: never delete, keep this copy beside it
                new = new.with_name(f"{KEPT}{uuid.uuid4().hex[:12]}")
            data.rename(new)
        if backup.exists():
            backup.rename(data)
        if new.exists() and new.parent == root / ".dvc" / "tmp" and new.name.startswith(STAGING):
            new = new.rename(new.with_name(f"{KEPT}{uuid.uuid4().hex[:12]}"))  # not cleaned
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


def clean_staging(root: str | Path) -> list[Path]:
    """Remove the staging folders (.dvc/tmp/rcgrpo-staging-<pid>-*) of builds whose process is
    gone: a killed build leaves one (a copy of a whole dataset) behind. Call with the build
    lock held and after `recover` (which keeps its build as rcgrpo-kept-*). Returns the removed."""
    removed = []
    for folder in sorted((Path(root) / ".dvc" / "tmp").glob(f"{STAGING}*")):
        pid = folder.name[len(STAGING) :].partition("-")[0]
        if not pid.isdigit():
            continue  # a staging folder of an older rcgrpo: its owner is unknown, kept
        try:
            os.kill(int(pid), 0)
            continue  # a running build's (or a reused pid's: removed at a later build)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # a live process of another user
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


@contextlib.contextmanager
def build_lock(root: str | Path, timeout: float = 600.0):
    """Exclusive lock on data/ for one build or rollback; waits up to `timeout` seconds."""
    from filelock import FileLock, Timeout

    # 0700, in .dvc/tmp (ignored by git and DVC, in any DVC project): no other user can open the
    # lock file, so none can hold it
    folder = private_dir(Path(root) / ".dvc" / "tmp" / LOCKS)
    lock, info = FileLock(str(folder / LOCK_NAME), mode=0o600), folder / f"{LOCK_NAME}.holder"
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        holder = info.read_text().strip() if info.exists() else "unknown"
        raise BuildLocked(
            f"another dataset build or rollback holds {folder / LOCK_NAME} ({holder}); waited "
            f"{timeout:.0f} s. Wait for it to finish or raise dataset.lock_timeout_s."
        ) from None
    try:
        info.write_text(f"pid {os.getpid()} since {time.strftime('%H:%M:%S')}")
        if did := recover(root):  # a publish killed earlier: finish or undo it first
            import warnings

            warnings.warn(did, stacklevel=3)
        clean_staging(root)
        yield
    finally:
        info.unlink(missing_ok=True)
        lock.release()

"""Publishing a dataset version: swap a validated folder into `data/`, `dvc add`, git-commit
data.dvc (and .gitignore only if DVC just changed it; never any other file), `dvc push`, all under
the build lock of rcgrpo.versioning, and recoverable at every crash point.

A journal (.dvc/tmp/rcgrpo-publish.json) written before the first rename records what moves
where. A failure before the commit puts the previous `data/`, data.dvc and .gitignore back at
once. After a kill -9, `recover` (run by the next build/rollback when it takes the lock, and by
`rcgrpo` at start) undoes a publish killed before its commit (the new build is kept in its
staging folder) or redoes the push of one killed after it. tests/test_versioning.py kills a
publishing subprocess in each window (RCGRPO_PUBLISH_PAUSE=aside|swapped|committed holds it there).

    from rcgrpo.publishing import publish
    publish(staging_folder, project_root)      # -> {"rev", "md5", "changed", "path"}
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

from rcgrpo.versioning import (
    VersioningError,
    _git,
    _md5_of,
    _repo,
    build_lock,
    check_data_dir,
    push,
)

JOURNAL = "rcgrpo-publish.json"  # in .dvc/tmp: what a publish in progress has moved where


def _pause(point: str) -> None:
    """Fault injection for tests/test_versioning.py: RCGRPO_PUBLISH_PAUSE=<point> makes publish
    print the point and sleep there, so a test can kill -9 it exactly in that window."""
    if os.environ.get("RCGRPO_PUBLISH_PAUSE") == point:
        print(f"paused at {point}", flush=True)
        time.sleep(600)


def _journal(root: Path) -> Path:
    return root / ".dvc" / "tmp" / JOURNAL


def _write_journal(root: Path, entry: dict) -> None:
    tmp = _journal(root).with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, _journal(root))  # atomic: the journal is always whole


def recover(root: str | Path) -> str | None:
    """Finish or undo a publish that was killed (call with the build lock held; build_lock
    does). Before its git commit: the previous data/, data.dvc and .gitignore go back and the
    new build is kept where it was built. After it: the push is redone. Returns what it did."""
    root = Path(root).resolve()
    path = _journal(root)
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


def publish(
    folder: str | Path,
    root: str | Path,
    data_dir: str = "data",
    message: str = "data: new dataset version",
    commit: bool = True,
    push: bool = True,
    lock_timeout: float = 600.0,
) -> dict:
    """Make `folder` the new `data/` version: swap, dvc add, git commit data.dvc, dvc push, all
    under the build lock. Recoverable at every point: a journal in .dvc/tmp records what was
    moved where before the first rename; a failure undoes the swap at once, and a kill -9 is
    undone (before the commit) or finished (after it) by `recover`, which the next build or
    rollback runs when it takes the lock (and `rcgrpo` at start). A stale .git/index.lock is
    refused before anything moves."""
    root, folder = Path(root).resolve(), Path(folder).resolve()
    data = check_data_dir(root, data_dir)  # before the lock and any rename
    with build_lock(root, lock_timeout):
        if commit and (lock := root / ".git" / "index.lock").exists():
            raise VersioningError(
                f"{lock} exists: another git command is running, or one was killed. Remove it "
                "if no git process runs, then build again; nothing was changed"
            )
        gitignore = root / ".gitignore"
        ignore_before = gitignore.read_bytes() if gitignore.exists() else b""
        dvc_path = root / f"{data_dir}.dvc"
        backup = root / ".dvc" / "tmp" / f"rcgrpo-previous-{uuid.uuid4().hex[:12]}"
        entry = {
            "phase": "swap", "data_dir": data_dir, "backup": str(backup), "new": str(folder),
            "had_data": data.exists(), "gitignore_before": ignore_before.decode(),
            "dvc_before": dvc_path.read_text() if dvc_path.exists() else None,
        }  # fmt: skip
        _write_journal(root, entry)
        try:
            if data.exists():
                data.rename(backup)
            _pause("aside")
            folder.rename(data)
            _pause("swapped")
            repo = _repo(root)
            try:
                repo.add([str(data)])  # absolute: DVC resolves targets against the cwd
            finally:
                repo.close()
            md5 = _md5_of(dvc_path.read_text())
            paths = [dvc_path.name]
            if gitignore.exists() and gitignore.read_bytes() != ignore_before:
                paths.append(".gitignore")  # DVC added its entry for data/
            rev, changed = None, True
            if commit:
                _git(root, "add", "--", *paths)
                staged = _git(root, "diff", "--cached", "--name-only", "--", *paths)
                if staged:
                    _git(root, "commit", "-m", f"{message} ({md5})", "--", *paths)
                changed = bool(staged)
                rev = _git(root, "log", "-1", "--format=%H", "--", dvc_path.name)
        except BaseException as e:  # also Ctrl-C: put the previous version back now
            recover(root)
            if not isinstance(e, Exception):
                raise
            raise VersioningError(
                f"publishing {data_dir} failed; previous {data_dir}/ restored, new build kept "
                f"in {folder}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}"
            ) from e
        _write_journal(root, {**entry, "phase": "committed"})
        shutil.rmtree(backup, ignore_errors=True)
        _pause("committed")
        if push:
            globals()["push"](root, data_dir)  # the module's push (the flag shadows it)
        _journal(root).unlink()
        return {"rev": rev, "md5": md5, "changed": changed, "path": str(data)}

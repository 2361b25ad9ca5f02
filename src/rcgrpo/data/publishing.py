"""Publishing a dataset version: swap a validated folder into `data/`, `dvc add`, git-commit
data.dvc (and .gitignore only if DVC just changed it; never any other file), `dvc push`, all under
the build lock of rcgrpo.data.versioning, and recoverable at every crash point.

A journal (.dvc/tmp/rcgrpo-publish.json) written before the first rename records what moves
where, and is rewritten (phase "commit": HEAD and the new md5) just before the git commit. A
failure before the commit puts the previous `data/`, data.dvc and .gitignore back at once.
After a kill -9, `recover` (run by the next build/rollback when it takes the lock, and by
`rcgrpo` at start) undoes a publish killed before its commit (the new build is kept in
.dvc/tmp/rcgrpo-kept-*) or redoes the push of one killed after it, also one killed between the
commit and the journal's update. tests/test_versioning.py kills a publishing subprocess in each
window (RCGRPO_PUBLISH_PAUSE=aside|swapped|commit|committed holds it there).

    from rcgrpo.data.publishing import publish
    publish(staging_folder, project_root)      # -> {"rev", "md5", "changed", "path"}

Every change of what data/ holds (a publish, a rollback) also writes its md5 to
outputs/<data_dir>/version.json (`mark_version`): dvc.yaml's training stages depend on that file,
so they rerun when data/ changes by either route, while data.dvc, which DVC would make a stage of
their pipeline (one a fresh clone cannot verify), stays out of it.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

from rcgrpo.data import versioning
from rcgrpo.data.journal import build_lock, journal_path, recover, write_journal
from rcgrpo.data.versioning import (
    VersioningError,
    _git,
    _md5_of,
    _repo,
    check_data_dir,
)


def _pause(point: str) -> None:
    """Fault injection for tests/test_versioning.py: RCGRPO_PUBLISH_PAUSE=<point> makes publish
    print the point and sleep there, so a test can kill -9 it exactly in that window."""
    if os.environ.get("RCGRPO_PUBLISH_PAUSE") == point:
        print(f"paused at {point}", flush=True)
        time.sleep(600)


def publish(
    folder: str | Path,
    root: str | Path,
    data_dir: str = "data",
    message: str = "data: new dataset version",
    commit: bool = True,
    push: bool = True,
    lock_timeout: float = 600.0,
    remote: str | None = None,
) -> dict:
    """Make `folder` the new `data/` version: swap, dvc add, git commit data.dvc, dvc push, all
    under the build lock. Recoverable at every point: a journal in .dvc/tmp records what was
    moved where before the first rename; a failure undoes the swap at once, and a kill -9 is
    undone (before the commit) or finished (after it) by `recover`, which the next build or
    rollback runs when it takes the lock (and `rcgrpo` at start). A stale .git/index.lock is
    refused before anything moves. `remote`: a one-off push target (dataset.remote) instead of
    the project's remote; .dvc/config is never changed (versioning.check_remote)."""
    root, folder = Path(root).resolve(), Path(folder).resolve()
    data = check_data_dir(root, data_dir, remote)  # before the lock and any rename
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
            "phase": "swap",
            "data_dir": data_dir,
            "backup": str(backup),
            "new": str(folder),
            "had_data": data.exists(),
            "gitignore_before": ignore_before.decode(),
            "dvc_before": dvc_path.read_text() if dvc_path.exists() else None,
            "remote": remote,
        }
        write_journal(root, entry)
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
                head = _git(root, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
                write_journal(root, {**entry, "phase": "commit", "md5": md5, "head_before": head})
                _git(root, "add", "--", *paths)
                staged = _git(root, "diff", "--cached", "--name-only", "--", *paths)
                if staged:
                    _git(root, "commit", "-m", f"{message} ({md5})", "--", *paths)
                    _pause("commit")
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
        write_journal(root, {**entry, "phase": "committed"})
        shutil.rmtree(backup, ignore_errors=True)
        _pause("committed")
        if push:
            versioning.push(root, data_dir, remote)  # (the `push` flag shadows the name)
        journal_path(root).unlink()
        mark_version(root, data_dir, md5)
        return {"rev": rev, "md5": md5, "changed": changed, "path": str(data)}


def mark_version(root: str | Path, data_dir: str, md5: str) -> Path:
    """outputs/<data_dir>/version.json = {"md5"}: the version data/ holds now (see above)."""
    import json

    path = Path(root) / "outputs" / data_dir / "version.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"md5": md5}) + "\n")
    return path

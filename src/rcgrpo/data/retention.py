"""Old data versions dropped from the DVC cache (and the remote): `dvc gc` with a fixed scope.

What is kept: the data of the working tree and of the last `keep_commits` commits of every
git branch (`dvc gc --workspace --all-branches --num N`), so the version main's data.dvc
points at, and the one checked out now, are never removed. With `cloud`, the same scope is
collected in the project's remote too (`--cloud`); without it only the local cache shrinks and
`rcgrpo data rollback` can still fetch older versions from the remote. Why not
`--all-commits`: it keeps every version ever committed, which is what a nightly rebuild grows.

    collect_garbage(project_root(), keep_commits=5, cloud=False)
    .venv/bin/pytest tests/test_retention.py -q -k dvc
"""

from __future__ import annotations

import logging
from pathlib import Path

from rcgrpo.data.versioning import VersioningError, _repo


def collect_garbage(root: str | Path, keep_commits: int, cloud: bool = False) -> list[str]:
    """`dvc gc -w -a -n keep_commits [-c] -f` in the project at `root` (keep_commits >= 1);
    returns what DVC said ("Removed 3 objects from repo cache."), kept off the terminal."""
    if keep_commits < 1:
        raise ValueError(f"keep_commits must be >= 1, got {keep_commits}")
    root = Path(root).resolve()
    repo = _repo(root)
    said: list[str] = []
    log = logging.getLogger("dvc")  # its own handlers print to stdout: collected here instead
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())
    saved = log.handlers[:], log.propagate
    log.handlers, log.propagate = [handler], False
    try:
        repo.gc(workspace=True, all_branches=True, num=keep_commits, cloud=cloud, force=True)
        return said
    except Exception as e:
        raise VersioningError(f"dvc gc in {root} failed: {e}") from e
    finally:
        log.handlers, log.propagate = saved
        repo.close()

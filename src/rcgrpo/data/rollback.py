"""`rcgrpo data rollback <rev>`: data/ back to the version data.dvc had at a git revision.

`rollback(rev, root)`: data.dvc at <rev> must name data/ and nothing else (a commit whose
data.dvc says `path: src` would have DVC replace src/ by the dataset: refused before anything
is touched), then its objects copied into the cache from the project's own remote (HEAD's .dvc/config, never
<rev>'s: rcgrpo.data.objects) and a check that every one is there, then data.dvc is
written from <rev> (the git index is not touched: a failed or uncommitted rollback never leaves
a staged data.dvc for the next commit to record) and `dvc checkout`, byte for byte; any failure
puts data.dvc and data/ back as they were and says why in one line. Returns what changed
(files added / removed / modified, row counts before and after). DVC is reached through
rcgrpo.data.versioning's repo helper (the one DVC touchpoint).

    rcgrpo data rollback <rev>
    from rcgrpo.data.rollback import rollback; rollback("HEAD~1", ".")
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import yaml

from rcgrpo.data.journal import build_lock
from rcgrpo.data.objects import copy_version
from rcgrpo.data.publishing import mark_version
from rcgrpo.data.versioning import (
    VersioningError,
    _git,
    _manifest,
    _md5_of,
    _remote_dir,
    _repo,
    _rows,
    check_data_dir,
    file_md5s,
    listing,
)
from rcgrpo.fields import yaml_load

MAX_DVC_BYTES = 65_536  # DVC writes ~150 bytes for data/; a larger file is no pointer of ours


def _resolve_rev(root: Path, rev: str, dvc_file: str) -> str:
    full = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if not full:
        raise VersioningError(f"{rev!r} is not a git revision here; see `rcgrpo data versions`")
    entry = _git(root, "ls-tree", full, "--", dvc_file, check=False).split()
    if not entry:
        raise VersioningError(f"revision {rev} has no {dvc_file}: it holds no dataset version")
    if entry[0] not in ("100644", "100755"):
        raise VersioningError(f"{dvc_file} at {rev} is not a plain file (mode {entry[0]})")
    return full


def target_text(root: Path, full: str, rev: str, dvc_file: str, data_dir: str) -> bytes:
    """data.dvc at `full`, byte for byte, if it tracks `data_dir` and nothing else: exactly one
    output, whose path is data_dir, no `wdir`. DVC checks out whatever path a .dvc file names,
    so a committed `path: src` (or `outputs`, `..`) would replace that folder: refused."""
    raw = subprocess.run(
        ["git", "-C", str(root), "show", f"{full}:{dvc_file}"], capture_output=True, check=True
    ).stdout
    if len(raw) > MAX_DVC_BYTES:
        raise VersioningError(
            f"{dvc_file} at {rev} is {len(raw):,} bytes, over the {MAX_DVC_BYTES:,} a .dvc file "
            "of one folder can need; refused unread. Nothing was changed"
        )
    try:  # no YAML aliases (rcgrpo.fields): a 315-byte bomb expanded when the error printed it
        doc = yaml_load(raw.decode())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        problem = " ".join(str(e).split())[:160]
        raise VersioningError(
            f"{dvc_file} at {rev} is not a .dvc file DVC writes ({problem}); refused. Nothing "
            "was changed"
        ) from None
    try:
        outs = doc["outs"]
        path = outs[0]["path"] if isinstance(outs, list) and len(outs) == 1 else None
        wdir = doc.get("wdir", ".")
    except (TypeError, KeyError, IndexError, AttributeError):
        path = wdir = None
    if (
        not isinstance(path, str)
        or wdir not in (".", None)
        or (os.path.normpath(path) != os.path.normpath(data_dir))
    ):
        raise VersioningError(
            f"{dvc_file} at {rev} does not track {data_dir}/ alone (outs: "
            f"{' '.join(str(doc.get('outs') if isinstance(doc, dict) else doc).split())[:120]}"
            f"); refused: a checkout of it would replace another folder. Nothing was changed"
        )
    return raw


def rollback(
    rev: str, root: str | Path, data_dir: str = "data", lock_timeout=600.0, force: bool = False
) -> dict:
    """Restore data/ to the version committed at `rev`, byte for byte; report what changed.

    The version's objects are fetched into the local cache (`dvc fetch` at `rev`) and checked
    complete before anything is touched: a version in neither the cache nor the remote fails
    with data.dvc and data/ as they were. Any later failure puts both back (data/ is moved
    aside, not overwritten, until the checkout has finished). data.dvc is left as it was at
    `rev` (not committed): commit it to make the rollback the new head, or roll forward again
    with the newer rev. Refuses (unless `force`) when data/ holds edits that no version records.
    """
    root = Path(root).resolve()
    dvc_file = f"{data_dir}.dvc"
    data = check_data_dir(root, data_dir)
    full = _resolve_rev(root, rev, dvc_file)
    text = target_text(root, full, rev, dvc_file, data_dir)  # only data/, before anything
    md5 = _md5_of(text.decode(), f"{dvc_file} at {rev}")
    with build_lock(root, lock_timeout):
        saved = (root / dvc_file).read_bytes() if (root / dvc_file).exists() else None
        try:
            before_md5 = _md5_of(saved.decode(errors="replace")) if saved else ""
        except VersioningError:
            before_md5 = ""  # an unreadable data.dvc: rolling back is how it gets repaired
        before = listing(root, before_md5) if before_md5 else {}
        workspace = file_md5s(data) if data.exists() else {}
        if workspace and workspace != before and not force:
            raise VersioningError(
                f"{data} has changes no dataset version records (differs from "
                f"{dvc_file}); rolling back would discard them. Build/add them first, or force."
            )
        _fetch_version(root, full, dvc_file, md5)  # nothing touched yet if this fails
        aside = root / ".dvc" / "tmp" / f"rcgrpo-rollback-{uuid.uuid4().hex[:12]}"
        if data.exists():
            data.rename(aside)
        repo = None
        try:
            (root / dvc_file).write_bytes(text)  # not `git checkout`: the index stays as it was
            repo = _repo(root)
            repo.checkout(targets=[str(root / dvc_file)], force=True)
            if file_md5s(data) != listing(root, md5):
                raise VersioningError(f"dvc checkout left {data} different from version {md5}")
        except Exception as e:
            shutil.rmtree(data, ignore_errors=True)
            if aside.exists():
                aside.rename(data)
            if saved is None:
                (root / dvc_file).unlink(missing_ok=True)
            else:
                (root / dvc_file).write_bytes(saved)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise VersioningError(
                f"rollback to {rev} failed, {dvc_file} and {data_dir}/ restored as they were: "
                f"{first}"
            ) from None
        finally:
            if repo is not None:
                repo.close()
        shutil.rmtree(aside, ignore_errors=True)
        after = listing(root, md5)
        mark_version(root, data_dir, md5)  # dvc.yaml's training stages rerun on it
    return {
        "rev": full,
        "md5": md5,
        "previous_md5": before_md5,
        "added": sorted(set(after) - set(before)),
        "removed": sorted(set(before) - set(after)),
        "modified": sorted(k for k in set(after) & set(before) if after[k] != before[k]),
        "rows_before": _rows(_manifest(root, before)),
        "rows_after": _rows(_manifest(root, after)),
    }


def _fetch_version(root: Path, full: str, dvc_file: str, md5: str) -> None:
    """The objects of version `md5` into the local cache, from the project's remote as HEAD's
    .dvc/config names it: never a remote of the target commit's .dvc/config, which `dvc fetch
    --rev` would read (rcgrpo.data.objects). VersioningError in one line if any is missing."""
    remote = _remote_dir(root)
    cache = root / ".dvc" / "cache" / "files" / "md5"
    if lost := copy_version(remote / "files" / "md5", cache, md5):
        raise VersioningError(
            f"version {md5} (rev {full[:10]}) cannot be restored: {len(lost)} of its objects "
            f"are in neither the cache nor the remote {remote}; nothing was changed"
        )

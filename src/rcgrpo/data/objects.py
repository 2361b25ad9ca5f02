"""DVC objects read and copied without trusting their names: a hash must look like one
(`^[0-9a-f]{32}(\\.dir)?$`), and an object file is opened with O_NOFOLLOW, so a hash that is a
path (`../../etc/passwd`) or an object that is a symlink fails in one line instead of reading
some other file.

Why rollback copies objects itself: `dvc fetch --rev <rev>` reads the remotes of the target
commit's `.dvc/config`, so a crafted commit naming an http remote of its own made a rollback
download that remote's data. Here the objects of a version come only from the project's local
remote as HEAD's .dvc/config names it (rcgrpo.data.versioning._remote_dir).

    from rcgrpo.data.objects import check_hash, read_object, copy_version
    .venv/bin/pytest tests/test_versioning.py -q -k crafted
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

HASH = re.compile(r"[0-9a-f]{32}(\.dir)?")


class ObjectError(ValueError):
    """A hash or an object file that is not what DVC writes."""


def check_hash(md5: object, where: str) -> str:
    if not isinstance(md5, str) or not HASH.fullmatch(md5):
        raise ObjectError(f"{where}: {str(md5)[:80]!r} is not a DVC md5 hash; refused")
    return md5


def object_path(base: Path, md5: str) -> Path:
    return base / md5[:2] / md5[2:]


def read_object(path: Path) -> bytes:
    """The bytes of an object file, refusing a symlink (the file or its folder)."""
    if path.parent.is_symlink():
        raise ObjectError(f"{path.parent} is a symlink, not a DVC object folder; refused")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise ObjectError(
            f"{path}: cannot open as a plain object file ({e.strerror}); refused"
        ) from None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def dir_entries(raw: bytes, where: str) -> dict[str, str]:
    """relpath -> md5 of a `.dir` object, each hash checked; ObjectError in one line."""
    try:
        entries = {e["relpath"]: e["md5"] for e in json.loads(raw)}
    except (ValueError, TypeError, KeyError) as e:
        raise ObjectError(f"{where} is not a DVC directory listing ({e}); refused") from None
    for rel, md5 in entries.items():
        check_hash(md5, f"{where}: {rel}")
    return entries


def copy_version(remote: Path, cache: Path, md5: str) -> list[str]:
    """Copy the `.dir` object `md5` and its files from `remote` into `cache` (both DVC's
    files/md5 folders), skipping those already cached; returns the hashes found in neither."""
    lost = []

    def copy(h: str) -> bytes | None:
        dest = object_path(cache, h)
        if dest.is_file() and not dest.is_symlink():
            return read_object(dest)
        src = object_path(remote, h)
        if not src.exists() and not src.is_symlink():
            lost.append(h)
            return None
        raw = read_object(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + f".{os.getpid()}.tmp")
        tmp.write_bytes(raw)
        tmp.chmod(0o444)  # as DVC keeps its cache
        tmp.replace(dest)
        return raw

    listing = copy(check_hash(md5, "data.dvc"))
    if listing is not None:
        for h in dir_entries(listing, f"object {md5}").values():
            copy(h)
    return lost

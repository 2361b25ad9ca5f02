"""A rollback reads only the project's own remote and only real DVC objects
(rcgrpo.data.objects): a crafted commit whose .dvc/config names a remote of its own gets nothing
from it; a hash that is a path, or a remote object that is a symlink, fails in one line with
data/ untouched. Throw-away git + DVC projects (tests/test_versioning.py's helpers). ~20 s.

    .venv/bin/pytest tests/test_rollback_remotes.py -q
"""

from __future__ import annotations

import os
import shutil

import pytest
from test_versioning import built, git, make_project

from rcgrpo.data.objects import ObjectError
from rcgrpo.data.publishing import publish
from rcgrpo.data.rollback import rollback
from rcgrpo.data.versioning import VersioningError, file_md5s


def _commit(root, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (root / rel).write_text(text)
    git(root, "add", *files)
    git(root, "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD")


def test_crafted_commit_with_its_own_remote_fetches_nothing(tmp_path):
    ours = make_project(tmp_path / "proj")
    v1 = publish(built(ours, 0)[0], ours)
    before = file_md5s(ours / "data")
    theirs = make_project(tmp_path / "attacker")  # a version that only the attacker's remote has
    evil = publish(built(theirs, 7)[0], theirs)
    evil_remote = theirs / "dvc_remote"
    config = (ours / ".dvc" / "config").read_text()
    config = config.replace("remote = local", "remote = evil")
    config += f"['remote \"evil\"']\n    url = {evil_remote}\n"
    head = git(ours, "rev-parse", "HEAD")
    crafted = _commit(
        ours, {"data.dvc": (theirs / "data.dvc").read_text(), ".dvc/config": config}, "crafted"
    )
    git(ours, "reset", "-q", "--hard", head)  # the crafted commit stays reachable by its hash
    with pytest.raises(VersioningError, match="cannot be restored") as refused:
        rollback(crafted, ours)
    assert str(ours / "dvc_remote") in str(refused.value) and "\n" not in str(refused.value)
    assert file_md5s(ours / "data") == before  # data/ as it was
    cached = ours / ".dvc" / "cache" / "files" / "md5" / evil["md5"][:2] / evil["md5"][2:]
    assert not cached.exists()  # nothing of the attacker's came in
    assert v1["md5"] != evil["md5"]


def test_hash_that_is_a_path_is_refused(tmp_path):
    root = make_project(tmp_path / "proj")
    publish(built(root, 0)[0], root)
    text = (root / "data.dvc").read_text()
    md5 = next(ln.split()[-1] for ln in text.splitlines() if "md5:" in ln)
    bad = _commit(root, {"data.dvc": text.replace(md5, "../../../../etc/passwd")}, "bad hash")
    git(root, "reset", "-q", "--hard", "HEAD~1")
    with pytest.raises(ObjectError, match="is not a DVC md5 hash; refused"):
        rollback(bad, root)


def test_remote_object_that_is_a_symlink_is_refused_before_data_changes(tmp_path):
    root = make_project(tmp_path / "proj")
    v1 = publish(built(root, 0)[0], root)
    publish(built(root, 1)[0], root)
    now = file_md5s(root / "data")
    shutil.rmtree(root / ".dvc" / "cache")
    obj = root / "dvc_remote" / "files" / "md5" / v1["md5"][:2] / v1["md5"][2:]
    os.chmod(obj.parent, 0o755)
    obj.unlink()
    (tmp_path / "elsewhere.json").write_text('[{"relpath": "x", "md5": "' + "0" * 32 + '"}]')
    obj.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ObjectError, match="cannot open as a plain object file"):
        rollback(v1["rev"], root)
    assert file_md5s(root / "data") == now

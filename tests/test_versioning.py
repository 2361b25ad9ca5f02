"""DVC versioning in a throw-away git + DVC project (never the real checkout): publish commits
only data.dvc, versions lists every build, rollback restores byte for byte and rolls forward,
a missing cache is pulled from the local remote, and the lock makes a second writer wait or fail.

    .venv/bin/pytest tests/test_versioning.py -q
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading

import pytest

from rcgrpo.data.dataset import DatasetConfig, build_folder
from rcgrpo.data.journal import build_lock
from rcgrpo.data.publishing import publish
from rcgrpo.data.rollback import rollback
from rcgrpo.data.versioning import (
    BuildLocked,
    VersioningError,
    data_version,
    file_md5s,
    init_project,
    listing,
    staging_dir,
    versions,
)
from rcgrpo.envs.bfcl.environment import BFCL


def git(root, *args):
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def make_project(root):
    """git init + an unrelated file + dvc init with the offline defaults, committed."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "test@example.com")
    git(root, "config", "user.name", "test")
    (root / "README.md").write_text("a project\n")
    (root / ".gitignore").write_text("/dvc_remote/\n/outputs/\n")  # as a checkout ignores them
    git(root, "add", "README.md", ".gitignore")
    git(root, "commit", "-q", "-m", "init")
    init_project(root, "dvc_remote")
    git(root, "add", ".dvc", ".dvcignore")
    git(root, "commit", "-q", "-m", "dvc init")
    return root


def built(root, seed: int):
    """A finished build in a staging folder of `root`, and its file md5s."""
    folder = staging_dir(root)
    build_folder(
        DatasetConfig(train_tasks=8, test_tasks=4, rollouts="off", seed=seed), folder, BFCL
    )
    return folder, file_md5s(folder)


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path / "proj")


def test_offline_dvc_config_is_committed(project):
    config = (project / ".dvc" / "config").read_text()
    assert "analytics = False" in config and "site_cache_dir" in config
    assert "../dvc_remote" in config
    assert not git(project, "status", "--porcelain", ".dvc")


def test_publish_commits_only_data_dvc_and_pushes(project):
    (project / "README.md").write_text("someone's uncommitted edit\n")
    folder, md5s = built(project, 0)
    result = publish(folder, project)
    assert result["rev"] == git(project, "rev-parse", "HEAD") and result["changed"]
    committed = git(project, "show", "--name-only", "--format=", "HEAD").split()
    assert set(committed) <= {"data.dvc", ".gitignore"} and "data.dvc" in committed
    assert git(project, "status", "--porcelain", "README.md")  # still uncommitted
    assert file_md5s(project / "data") == md5s and not folder.exists()
    assert any((project / "dvc_remote" / "files" / "md5").rglob("*.dir"))  # pushed
    v = data_version(project)
    assert v == {"rev": result["rev"], "md5": result["md5"], "dirty": False}
    # the same bytes again: no new commit, same version
    again, _ = built(project, 0)
    assert publish(again, project)["changed"] is False
    assert len(versions(project)) == 1


def test_rollback_v1_v2_v1_byte_for_byte_and_forward(project):
    f1, md5s1 = built(project, 0)
    v1 = publish(f1, project)
    f2, md5s2 = built(project, 1)
    v2 = publish(f2, project)
    assert md5s1 != md5s2

    listed = versions(project)
    assert [v["rev"] for v in listed] == [v2["rev"], v1["rev"]]
    assert listed[0]["checked_out"] and not listed[1]["checked_out"]
    assert listed[1]["rows"]["rctp/train.jsonl"] == {"high": 8, "low": 8}
    assert listed[1]["date"] and listed[1]["md5"] == v1["md5"]

    marked = project / "outputs" / "data" / "version.json"  # what dvc.yaml's stages follow
    assert json.loads(marked.read_text()) == {"md5": v2["md5"]}
    change = rollback(v1["rev"][:8], project)
    assert file_md5s(project / "data") == md5s1
    assert json.loads(marked.read_text()) == {"md5": v1["md5"]}
    assert change["md5"] == v1["md5"] and change["previous_md5"] == v2["md5"]
    assert "rctp/train.jsonl" in change["modified"] and not change["added"]
    assert data_version(project)["dirty"]  # data.dvc now differs from HEAD (v2)

    rollback(v2["rev"], project)
    assert file_md5s(project / "data") == md5s2
    assert not data_version(project)["dirty"]


def test_rollback_pulls_from_the_remote_when_the_cache_is_gone(project):
    f1, md5s1 = built(project, 0)
    v1 = publish(f1, project)
    f2, _ = built(project, 1)
    publish(f2, project)
    shutil.rmtree(project / ".dvc" / "cache")
    rollback(v1["rev"], project)
    assert file_md5s(project / "data") == md5s1


def test_bad_revision_fails_clearly(project):
    with pytest.raises(VersioningError, match="not a git revision"):
        rollback("no-such-rev", project)
    first = git(project, "rev-list", "--max-parents=0", "HEAD")
    with pytest.raises(VersioningError, match="holds no dataset version"):
        rollback(first, project)


def test_second_writer_fails_clearly_while_locked_and_loses_nothing(project):
    f1, md5s1 = built(project, 0)
    publish(f1, project)
    f2, _ = built(project, 1)
    with build_lock(project), pytest.raises(BuildLocked, match="holds .*rcgrpo-build.lock"):
        publish(f2, project, lock_timeout=0.5)
    assert file_md5s(project / "data") == md5s1 and f2.exists()  # nothing swapped, nothing lost


def test_second_writer_waits_for_the_lock(project):
    f2, md5s2 = built(project, 1)
    held, release = threading.Event(), threading.Event()

    def hold():
        with build_lock(project):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    waiter = threading.Thread(target=lambda: publish(f2, project, lock_timeout=30))
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive()  # waiting, not failing
    release.set()
    waiter.join(60)
    holder.join()
    assert file_md5s(project / "data") == md5s2


def test_cli_versions_and_rollback(project):
    from typer.testing import CliRunner

    from rcgrpo.cli.data import app

    f1, md5s1 = built(project, 0)
    v1 = publish(f1, project)
    f2, _ = built(project, 1)
    publish(f2, project)
    runner = CliRunner()
    listed = runner.invoke(app, ["versions", "--root", str(project)])
    assert listed.exit_code == 0 and v1["rev"][:10] in listed.output
    assert "rctp/train.jsonl: 8/8" in listed.output
    back = runner.invoke(app, ["rollback", v1["rev"], "--root", str(project)])
    assert back.exit_code == 0, back.output
    assert "modified: " in back.output and "rctp/train.jsonl" in back.output
    assert file_md5s(project / "data") == md5s1
    wrong = runner.invoke(app, ["rollback", "nope", "--root", str(project)])
    assert wrong.exit_code == 1 and "not a git revision" in wrong.output
    bad_key = runner.invoke(app, ["build", "--set", "no_such_key=1"])
    # a ConfigError: `rcgrpo` (cli.main) prints it as one `error:` line, exit 2 (test_hardening)
    assert type(bad_key.exception).__name__ == "ConfigError"
    assert "no_such_key" in str(bad_key.exception)


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_data_dir_may_only_be_the_tracked_folder_or_a_new_one(project):
    """`data_dir=dvc_remote` once renamed the remote aside, deleted it and committed
    dvc_remote.dvc: now refused before anything is touched, from the API and the CLI."""
    import os
    import sys

    f1, _ = built(project, 0)
    publish(f1, project)  # the remote now holds this version's objects
    remote, head = _tree(project / "dvc_remote"), git(project, "rev-parse", "HEAD")
    (project / "src").mkdir()
    (project / "src" / "code.py").write_text("x = 1\n")
    folder, _ = built(project, 1)
    for bad in ("dvc_remote", "src", ".dvc", "..", "README.md"):
        with pytest.raises(VersioningError, match=f"dataset.data_dir={bad}"):
            publish(folder, project, data_dir=bad)
    out = subprocess.run(
        [sys.executable, "-m", "rcgrpo.cli", "data", "build", "--set", f"root={project}",
         "--set", "data_dir=dvc_remote", "--set", "rollouts=off"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert out.returncode == 2 and out.stderr.startswith("error: dataset.data_dir=dvc_remote")
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert _tree(project / "dvc_remote") == remote and (project / "src" / "code.py").exists()
    assert git(project, "rev-parse", "HEAD") == head and not (project / "dvc_remote.dvc").exists()
    assert folder.exists()  # the build itself is kept
    fresh = publish(folder, project, data_dir="data_v2")  # a new folder is fine
    assert (project / "data_v2.dvc").exists() and fresh["changed"]


def test_rollback_to_a_version_in_neither_cache_nor_remote_changes_nothing(project):
    """It used to leave data/ empty, data.dvc at the lost version and a 51-line traceback."""
    import os
    import sys

    f1, _ = built(project, 0)
    v1 = publish(f1, project)
    f2, md5s2 = built(project, 1)
    publish(f2, project)
    dvc_before = (project / "data.dvc").read_bytes()
    only_v1 = {v1["md5"], *listing(project, v1["md5"]).values()} - set(md5s2.values())
    for base in (project / ".dvc" / "cache", project / "dvc_remote"):  # lose v1's own objects
        for m in only_v1:
            (base / "files" / "md5" / m[:2] / m[2:]).unlink()
    with pytest.raises(VersioningError, match="in neither the cache nor the remote"):
        rollback(v1["rev"], project)
    assert (project / "data.dvc").read_bytes() == dvc_before
    assert file_md5s(project / "data") == md5s2 and not git(project, "status", "--porcelain")
    out = subprocess.run(
        [sys.executable, "-m", "rcgrpo.cli", "data", "rollback", v1["rev"], "--root", str(project)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "nothing was changed" in out.stderr
    assert file_md5s(project / "data") == md5s2
    assert (project / "data.dvc").read_bytes() == dvc_before


def test_rollback_restores_data_and_data_dvc_when_the_checkout_fails(project):
    """A fault after the check (an object corrupted in the cache: dvc checkout writes the wrong
    bytes, the result check sees it) puts data.dvc and data/ back as they were."""
    f1, md5s1 = built(project, 0)
    v1 = publish(f1, project)
    f2, md5s2 = built(project, 1)
    publish(f2, project)
    dvc_before = (project / "data.dvc").read_bytes()
    changed = sorted(set(md5s1.values()) - set(md5s2.values()))[0]
    (project / ".dvc" / "cache" / "files" / "md5" / changed[:2] / changed[2:]).write_text("x\n")
    with pytest.raises(VersioningError, match="restored as they were"):
        rollback(v1["rev"], project)
    assert (project / "data.dvc").read_bytes() == dvc_before
    assert file_md5s(project / "data") == md5s2


def _publish_killed_at(point, folder, project):
    """Run publish in a subprocess, kill -9 it in the window `point` (RCGRPO_PUBLISH_PAUSE)."""
    import os
    import signal
    import sys

    code = f"from rcgrpo.data.publishing import publish; publish({str(folder)!r}, {str(project)!r})"
    env = {**os.environ, "RCGRPO_PUBLISH_PAUSE": point}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    try:
        lines = iter(proc.stdout.readline, "")  # DVC prints its own hints first
        assert any(line.strip() == f"paused at {point}" for line in lines)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("point", ["aside", "swapped", "commit", "committed"])
def test_publish_killed_at_each_fault_window_is_recovered(project, point):
    """`commit`: killed after the git commit but before the journal said so (the
    commit stayed, data.dvc was left modified, the objects never reached the remote)."""
    f1, md5s1 = built(project, 0)
    publish(f1, project)
    dvc1, head1 = (project / "data.dvc").read_bytes(), git(project, "rev-parse", "HEAD")
    f2, md5s2 = built(project, 1)
    _publish_killed_at(point, f2, project)
    if point == "aside":
        assert not (project / "data").exists()  # the window an earlier audit found: data/ missing
    warned = pytest.warns(UserWarning, match="killed before its")
    with warned, build_lock(project):  # what the next build / rollback / rcgrpo start does
        pass
    assert not (project / ".dvc" / "tmp" / "rcgrpo-publish.json").exists()
    if point in ("commit", "committed"):  # committed before the kill: kept, pushed now
        assert git(project, "rev-parse", "HEAD") != head1 and file_md5s(project / "data") == md5s2
        assert not git(project, "status", "--porcelain")  # data.dvc is the committed one
        shutil.rmtree(project / ".dvc" / "cache")
        rollback(head1, project)  # v1 from the remote
        rollback("HEAD", project)  # v2 needs the objects the recovery pushed
        assert file_md5s(project / "data") == md5s2
        return
    assert file_md5s(project / "data") == md5s1 and (project / "data.dvc").read_bytes() == dvc1
    assert git(project, "rev-parse", "HEAD") == head1 and not git(project, "status", "--porcelain")
    (kept,) = (project / ".dvc" / "tmp").glob("rcgrpo-kept-*")  # not removed by a later build
    assert file_md5s(kept) == md5s2 and not f2.exists()
    publish(kept, project)  # and publishing it again just works
    assert file_md5s(project / "data") == md5s2


def test_a_stale_git_index_lock_is_refused_before_anything_moves(project):
    f1, md5s1 = built(project, 0)
    publish(f1, project)
    (project / ".git" / "index.lock").write_text("")  # a git killed earlier left it
    f2, md5s2 = built(project, 1)
    with pytest.raises(VersioningError, match=r"index.lock exists.*nothing was changed"):
        publish(f2, project)
    assert file_md5s(project / "data") == md5s1 and file_md5s(f2) == md5s2
    (project / ".git" / "index.lock").unlink()
    publish(f2, project)
    assert file_md5s(project / "data") == md5s2

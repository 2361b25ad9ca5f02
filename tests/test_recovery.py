"""Data versioning under attack and after kills, in throw-away
git + DVC projects with real git commits, real DVC objects and real kill -9s:

* a crafted commit whose data.dvc names `src` / `outputs` / `..`: rollback refuses it, nothing
  moves; a failed rollback leaves the git index as it was;
* a one-off `--set remote=X` never reaches the committed .dvc/config; `remote=src` or the data
  folder is refused before anything runs;
* a publish killed in its `committed` window while the remote is unreachable: `rcgrpo --help`
  and other commands still work (one warning line), the next one finishes the push;
* a journal naming paths outside .dvc/tmp and the data folder is never followed;
* a killed build's staging folder is removed by the next build.

    .venv/bin/pytest tests/test_recovery.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from test_versioning import _publish_killed_at, _tree, built, git, make_project

from rcgrpo.data.journal import build_lock, journal_path
from rcgrpo.data.publishing import publish
from rcgrpo.data.rollback import rollback
from rcgrpo.data.versioning import VersioningError, file_md5s, init_project
from rcgrpo.runtime import project_root


@pytest.fixture
def project(tmp_path):
    """A project with v1 published, committed code in src/ and trained models in outputs/."""
    root = make_project(tmp_path / "proj")
    (root / "src").mkdir()
    (root / "src" / "train.py").write_text("print('the code')\n")
    (root / ".gitignore").write_text("/dvc_remote/\n/outputs/\n")
    git(root, "add", "src", ".gitignore")
    git(root, "commit", "-q", "-m", "code")
    (root / "outputs" / "rl" / "final").mkdir(parents=True)
    (root / "outputs" / "rl" / "final" / "model.safetensors").write_bytes(b"weights" * 100)
    folder, _ = built(root, 0)
    publish(folder, root)
    return root


def _state(root):
    """Everything a rollback could hurt: src/, outputs/, data/, data.dvc, HEAD and git status."""
    return (_tree(root / "src"), _tree(root / "outputs"), file_md5s(root / "data"),
            (root / "data.dvc").read_bytes(), git(root, "rev-parse", "HEAD"),
            git(root, "status", "--porcelain"))  # fmt: skip


def _crafted_commit(root, text: str) -> str:
    """A commit (not checked out, as a fetched branch would be) whose data.dvc is `text`."""
    blob = subprocess.run(["git", "-C", str(root), "hash-object", "-w", "--stdin"], input=text,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    index = root / ".git" / "crafted-index"
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    run = {"capture_output": True, "text": True, "check": True, "env": env}
    subprocess.run(["git", "-C", str(root), "read-tree", "HEAD"], **run)
    subprocess.run(["git", "-C", str(root), "update-index", "--add", "--cacheinfo",
                    f"100644,{blob},data.dvc"], **run)  # fmt: skip
    tree = subprocess.run(["git", "-C", str(root), "write-tree"], **run).stdout.strip()
    index.unlink()
    return git(root, "commit-tree", tree, "-p", "HEAD", "-m", "data: a better dataset")


@pytest.mark.parametrize("path", ["src", "outputs", "..", ".", "data/../src"])
def test_a_rollback_to_a_data_dvc_naming_another_folder_is_refused(project, path):
    """`path: src` had DVC replace src/ by the dataset (and `outputs` the
    trained models), then said "data.dvc and data/ restored as they were"."""
    md5 = (project / "data.dvc").read_text().split("md5: ")[1].split()[0]  # objects present
    rev = _crafted_commit(project, f"outs:\n- md5: {md5}\n  hash: md5\n  path: {path}\n")
    before = _state(project)
    with pytest.raises(VersioningError, match=r"does not track data/ alone.*Nothing was changed"):
        rollback(rev, project)
    assert _state(project) == before
    out = subprocess.run([sys.executable, "-m", "rcgrpo.cli", "data", "rollback", rev, "--root",
                          str(project)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "does not track data/ alone" in out.stderr and "restored" not in out.stderr
    assert _state(project) == before


@pytest.mark.parametrize(
    "text",
    ["outs:\n- md5: {m}\n  path: data\n- md5: {m}\n  path: src\n",  # two outputs
     "wdir: ..\nouts:\n- md5: {m}\n  path: data\n"],  # data of the folder above
)  # fmt: skip
def test_a_second_output_or_a_wdir_is_refused_too(project, text):
    md5 = (project / "data.dvc").read_text().split("md5: ")[1].split()[0]
    rev = _crafted_commit(project, text.format(m=md5))
    before = _state(project)
    with pytest.raises(VersioningError, match="does not track data/ alone"):
        rollback(rev, project)
    assert _state(project) == before


def test_a_rollback_never_stages_data_dvc(project):
    """A failed rollback left `MM data.dvc` in `git status`: the next routine commit would have
    recorded the version it failed to restore. Now only the work tree changes, on success."""
    v1, md5s1 = git(project, "rev-parse", "HEAD"), file_md5s(project / "data")
    f2, md5s2 = built(project, 1)
    publish(f2, project)
    v1_only = sorted(set(md5s1.values()) - set(md5s2.values()))
    rollback(v1, project)  # success: data.dvc modified in the work tree, nothing staged
    assert git(project, "status", "--porcelain", "data.dvc") == "M data.dvc"
    assert not git(project, "diff", "--cached", "--name-only")
    rollback("HEAD", project)
    assert not git(project, "status", "--porcelain")
    cache = project / ".dvc" / "cache" / "files" / "md5"
    for m in v1_only:  # corrupt v1's objects: its checkout now fails after the fetch check
        if (cache / m[:2] / m[2:]).exists():
            (cache / m[:2] / m[2:]).write_text("x\n")
    with pytest.raises(VersioningError, match="restored as they were"):
        rollback(v1, project)
    assert not git(project, "status", "--porcelain") and file_md5s(project / "data") == md5s2


def test_a_one_off_remote_never_reaches_the_committed_dvc_config(project):
    """`data build --set remote=data` wrote `url = ../data` into .dvc/config
    (every later build and rollback failed); `--set remote=src` pushed objects into src/."""
    config = (project / ".dvc" / "config").read_bytes()
    head = git(project, "rev-parse", "HEAD")
    for bad, says in (("data", "the data folder"), ("src", "git tracks files"),
                      (".dvc", "DVC state"), (".", "the project")):  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "rcgrpo.cli", "data", "build", "--set", f"root={project}",
             "--set", f"remote={bad}", "--set", "rollouts=off"],
            capture_output=True, text=True, timeout=300)  # fmt: skip
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert out.stderr.startswith(f"error: dataset.remote={bad}: ") and says in out.stderr
    init_project(project, "elsewhere")  # what each build's prepare step runs
    assert (project / ".dvc" / "config").read_bytes() == config
    f2, md5s2 = built(project, 1)
    publish(f2, project, remote="backup_remote")  # a one-off push target
    assert any((project / "backup_remote" / "files" / "md5").rglob("*.dir"))
    assert (project / ".dvc" / "config").read_bytes() == config
    assert not git(project, "status", "--porcelain", ".dvc") and _tree(project / "src")
    rollback(head, project)  # the project's own remote and config still work
    f3, _ = built(project, 2)
    publish(f3, project)
    assert (project / ".dvc" / "config").read_bytes() == config


def _checkout_copy(project):
    """The rcgrpo package copied into `project` (with params.yaml and pyproject.toml), so that
    `python -m rcgrpo.cli` run from there takes `project` as its checkout (project_root)."""
    src = project_root()
    for name in ("params.yaml", "pyproject.toml"):
        shutil.copy(src / name, project / name)
    shutil.copytree(src / "src" / "rcgrpo", project / "pkg" / "rcgrpo",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(project / "pkg"), "COLUMNS": "400"}
    return lambda *args: subprocess.run(
        [sys.executable, "-m", "rcgrpo.cli", *args],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_commands_work_while_a_killed_publish_cannot_finish(project):
    """after a kill in the `committed` window with the remote unreachable,
    every command (even --help) ended in a 53-line traceback: the recovery ran outside the
    error handler. Now one warning line, the command runs, and the next one finishes the push."""
    rcgrpo = _checkout_copy(project)
    f2, md5s2 = built(project, 1)
    _publish_killed_at("committed", f2, project)
    remote = project / "dvc_remote"
    remote.rename(project / "remote_away")
    remote.write_text("the disk is not mounted\n")  # unreachable: not a folder
    for args in (["--help"], ["data", "versions", "--root", str(project)]):
        out = rcgrpo(*args)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("warning: a dataset publish killed"), lines
    assert journal_path(project).exists()  # still to be finished
    remote.unlink()
    (project / "remote_away").rename(remote)
    out = rcgrpo("--help")
    assert out.returncode == 0 and out.stderr.strip() == (
        "note: finished the publish of data/ killed before its push (pushed now)"
    ), out.stderr
    assert not journal_path(project).exists() and file_md5s(project / "data") == md5s2
    shutil.rmtree(project / ".dvc" / "cache")  # the objects are in the remote now
    rollback("HEAD", project)
    assert file_md5s(project / "data") == md5s2


@pytest.mark.parametrize(
    "bad",
    [{"data_dir": ".."}, {"data_dir": "src"}, {"backup": "{root}/src"},
     {"backup": "{root}/.dvc/tmp/../../outputs"}, {"new": "/etc"}, {"phase": "rm -rf"}, None],
)  # fmt: skip
def test_a_journal_naming_other_paths_is_never_followed(project, bad):
    """`recover()` rmtree'd whatever paths the journal named. A journal that names anything a
    publish does not write is refused in one line; nothing moves or goes."""
    tmp = project / ".dvc" / "tmp"
    entry = {"phase": "swap", "data_dir": "data", "had_data": True, "dvc_before": None,
             "backup": str(tmp / "rcgrpo-previous-0123"), "new": str(tmp / "rcgrpo-staging-1-x"),
             "gitignore_before": ""}  # fmt: skip
    text = "{not json" if bad is None else json.dumps(
        entry | {k: v.format(root=project) for k, v in bad.items()})  # fmt: skip
    journal_path(project).write_text(text)
    before = _state(project)
    with pytest.raises(VersioningError, match="is not a journal rcgrpo wrote"), build_lock(project):
        pass
    assert _state(project) == before and journal_path(project).read_text() == text


def test_a_killed_builds_staging_folder_is_removed_by_the_next_build(project):
    """killed builds left their staging folders in .dvc/tmp forever."""
    code = ("from rcgrpo.data.versioning import staging_dir; import time; "
            f"d = staging_dir({str(project)!r}); (d / 'rows.jsonl').write_text('x' * 10000); "
            "print(d, flush=True); time.sleep(600)")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    killed = proc.stdout.readline().strip()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    from rcgrpo.data.versioning import staging_dir

    mine = staging_dir(project)  # a build of a live process (this one) is left alone
    with build_lock(project):
        pass
    assert not os.path.exists(killed) and mine.exists()

"""`bench/update.py --against REF` leaves no git worktree behind: its temporary worktree of REF
(bench/update_against.py's `worktree`) is removed and pruned when the bench ends, fails, or is
stopped by SIGINT, SIGTERM or SIGHUP, and one left by a SIGKILL is removed by the next run.

Each test runs the real `worktree` in a child process on a throwaway git repository and reads
`git worktree list` afterwards.

    .venv/bin/pytest tests/test_update_against.py -q
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import update_against  # noqa: E402

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {bench!r})
    import update_against
    with update_against.worktree("HEAD", root=Path({root!r})) as (tree, commit):
        print(tree, flush=True)
        {body}
    """
)


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit (cache/ git-ignored, as in the project)."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / ".gitignore").write_text("/cache/\n")
    git(root, "add", ".gitignore")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return root


def registered(root: Path) -> list[str]:
    """The worktrees git knows of, the main one excluded."""
    lines = git(root, "worktree", "list", "--porcelain").splitlines()
    return [line.split(" ", 1)[1] for line in lines if line.startswith("worktree ")][1:]


def start(root: Path, body: str) -> tuple[subprocess.Popen, Path]:
    """The child inside `worktree`, running `body`; returns it and the worktree it made."""
    code = CHILD.format(bench=str(BENCH), root=str(root), body=body)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tree = Path(proc.stdout.readline().strip())
    assert tree.is_dir() and registered(root) == [str(tree)], proc.stderr.read()
    return proc, tree


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stopped_bench_leaves_no_worktree(repo, sig):
    proc, tree = start(repo, "time.sleep(120)")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0  # stopped, not finished
    assert registered(repo) == [], err
    assert not tree.parent.exists()
    assert list((repo / "cache").iterdir()) == []


@pytest.mark.parametrize("end", ["pass", "raise RuntimeError('the update failed')"])
def test_a_finished_or_failed_bench_leaves_no_worktree(repo, end):
    proc, _ = start(repo, f"sys.stdin.readline(); {end}")
    proc.communicate("go\n", timeout=60)
    assert registered(repo) == []
    assert list((repo / "cache").iterdir()) == []


def test_a_worktree_left_by_sigkill_is_removed_by_the_next_run(repo):
    proc, tree = start(repo, "time.sleep(120)")
    proc.kill()  # no handler runs: the worktree stays registered
    proc.communicate(timeout=60)
    assert registered(repo) == [str(tree)]
    with update_against.worktree("HEAD", root=repo) as (fresh, _):
        assert registered(repo) == [str(fresh)]  # the dead run's one is gone
    assert registered(repo) == []
    assert list((repo / "cache").iterdir()) == []

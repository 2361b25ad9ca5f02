"""What is this user's own on disk: folders only the user can enter (0700), where the lock files
live (the project's `cache/locks/`, a DVC project's `.dvc/tmp/rcgrpo-locks/`), and the removal of
what a dead owner left.

Why a folder of its own for the locks: `flock` needs only read access, so a lock file any other
local user can open (0644 in a 0755 folder) can be held by them, and every run, prune and build
of the project is refused while they hold it. In a 0700 folder nobody else reaches the file.

Why the removal walks iteratively and checks the owner: the sweeps look in shared places (the
temp dir), where another user can plant a folder with the name the sweep looks for. A 3,000-deep
one made the recursive `shutil.rmtree` of Python 3.11 raise RecursionError at every vLLM start;
a folder of another user's is now skipped, and one of ours is removed with a loop and a list,
never a recursion, never through a symlink.

    from rcgrpo.owned import lock_dir, private_dir, sweep_dead
    lock_dir(project_root()) / "rcgrpo-run.lock"
    .venv/bin/pytest tests/test_owned.py -q
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

LOCKS = Path("cache") / "locks"  # in the project: every lock of rcgrpo's


class NotOwned(RuntimeError):
    """A folder that must be this user's alone belongs to someone else (or is a symlink)."""


def private_dir(path: str | Path) -> Path:
    """`path` as a folder of this user's that only they can enter (0700): made if missing (its
    parents as the umask says), set back to 0700 if it was open to others; NotOwned in one line
    if it is not a folder, or it or a symlink at its place is another user's."""
    path = Path(path)
    with contextlib.suppress(FileExistsError):  # a file or link there: looked at below
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) and st.st_uid == os.geteuid():  # the user's own link: its target
        with contextlib.suppress(FileNotFoundError):  # dangling: not a folder
            st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise NotOwned(
            f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): another user "
            "made it; remove it (as its owner or root) and run again"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise NotOwned(f"{path} must be a folder of yours, but it is not a folder")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def private_files(folder: Path, pattern: str) -> None:
    """The files of `folder` matching `pattern` readable by this user alone (0600)."""
    for file in folder.glob(pattern):
        st = os.lstat(file)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(file, 0o600)


def lock_dir(root: str | Path) -> Path:
    """<root>/cache/locks, 0700: where the project's lock files live."""
    return private_dir(Path(root) / LOCKS)


def open_lock(folder: str | Path, name: str) -> tuple[int, Path]:
    """(descriptor, path) of the lock file `name` in `folder`, made private (0700) first: the
    file 0600, opened read-write, not inherited by child processes."""
    path = (private_dir(folder) / name).resolve()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return fd, path


def remove_tree(path: str | Path) -> bool:
    """Remove the folder `path` and all in it when it is this user's, walking with a loop (no
    recursion: any depth) and never through a symlink. False when it is not ours, or something
    in it cannot go (a path past the system's length limit): what is left stays."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False
    stack = [os.fspath(path)]
    try:
        while stack:
            folder = stack[-1]
            below = []
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        below.append(entry.path)
                    else:
                        os.unlink(entry.path)
            if below:  # empty those first; this one is looked at again after them
                stack += below
                continue
            os.rmdir(folder)
            stack.pop()
    except OSError:
        return False
    return True


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def sweep_dead(parent: str | Path, prefix: str) -> list[Path]:
    """Remove the folders `parent/<prefix><pid>[-...]` of this user's whose process <pid> is
    gone (a live one's, another user's and an unparsable name are kept); the removed paths."""
    removed = []
    try:
        with os.scandir(parent) as entries:
            names = [e.name for e in entries if e.name.startswith(prefix)]
    except OSError:
        return []
    for name in names:
        pid = name[len(prefix) :].partition("-")[0]
        if pid.isdigit() and not alive(int(pid)) and remove_tree(Path(parent) / name):
            removed.append(Path(parent) / name)
    return removed

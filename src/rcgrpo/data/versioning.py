"""The one DVC touchpoint: `data/` tracked whole by `data.dvc`, versions = git commits of it.

* `init_project(root)`: `dvc init` if needed, then the committed `.dvc/config`: analytics off, the
  site cache inside the project, and a local directory remote (default `dvc_remote/`) so push
  and pull work offline.
* `publish(folder, root)` (in rcgrpo.data.publishing): swap a validated folder into `data/`, `dvc add`,
  git-commit data.dvc, `dvc push`, under the build lock and recoverable after a kill.
* `check_data_dir(root, data_dir, remote)`: only the tracked data folder or a new one may be
  published, and only a new folder or a DVC remote outside the project's tracked files pushed to.
* `versions(root)`: every commit of data.dvc (rev, date, md5, rows per split and label).
* `rollback(rev, root)` (in rcgrpo.data.rollback): back to the version committed at <rev>, byte for
  byte, and leaving data.dvc and data/ as they were on any failure.
* `data_version(root)`: {rev, md5, dirty} for the MLflow run that trains on the data.

    rcgrpo data versions
    rcgrpo data rollback <rev>
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid
from pathlib import Path

import yaml

from rcgrpo.data.objects import check_hash, dir_entries, read_object

DVC_FILE = "data.dvc"
REMOTE_NAME = "local"


class VersioningError(RuntimeError):
    """A git/DVC step failed; the message says which and what to do."""


class BuildLocked(VersioningError):
    """Another build holds the lock on data/."""


def _git(root: Path, *args: str, check: bool = True) -> str:
    cmd = ["git", "-C", str(root)]
    if subprocess.run([*cmd, "config", "user.email"], capture_output=True).returncode:
        cmd += ["-c", "user.name=rcgrpo", "-c", "user.email=rcgrpo@localhost"]  # CI boxes
    done = subprocess.run([*cmd, *args], capture_output=True, text=True)
    if check and done.returncode:
        raise VersioningError(f"git {' '.join(args)} failed in {root}: {done.stderr.strip()}")
    return done.stdout.strip()


def _repo(root: Path, config: dict | None = None):
    from dvc.repo import Repo  # heavy import, only when versioning

    # site_cache_dir from the committed config is relative; pin it to this project absolutely.
    pinned = {"core": {"site_cache_dir": str(root / ".dvc" / "site_cache")}}
    repo = Repo(str(root), config={**pinned, **(config or {})})
    repo.scm_context.quiet = True  # no "git add data.dvc" hint: publish commits it itself
    return repo


def init_project(root: str | Path, remote: str = "dvc_remote") -> None:
    """Make `root` (a git work tree) a DVC project with the offline defaults (idempotent).

    `remote` becomes the committed remote only when the project has none yet: `dataset.remote`
    of one build (`--set remote=X`) is a one-off push target (publish's `remote`), never written
    into .dvc/config, so a later build or rollback still finds the project's own remote. To
    move the remote for good: `dvc remote modify local url <path>` and commit .dvc/config."""
    root = Path(root).resolve()
    if _git(root, "rev-parse", "--is-inside-work-tree", check=False) != "true":
        raise VersioningError(f"{root} is not a git work tree: run `git init` there first")
    from dvc.repo import Repo

    if not (root / ".dvc").exists():
        Repo.init(str(root))
    # An absolute path: DVC stores it relative to .dvc/ (portable) when it lies in the project.
    url = str(Path(remote) if Path(remote).is_absolute() else root / remote)
    from dvc.config_schema import RelPath  # saved relative to .dvc/, as `dvc remote add` does

    repo = _repo(root)
    wanted = {"analytics": False, "site_cache_dir": os.path.join(".dvc", "site_cache")}
    with repo.config.edit() as conf:  # .dvc/config, committed with the project
        if {k: conf["core"].get(k) for k in wanted} != wanted:
            conf["core"].update(wanted)
        if REMOTE_NAME not in conf["remote"]:  # a new project: its remote; never a one-off
            conf["core"]["remote"] = REMOTE_NAME
            conf["remote"][REMOTE_NAME] = {"url": RelPath(url)}
        else:
            url = str(_remote_dir(root))
    repo.close()
    # The site cache holds machine-local state dbs: never commit it (dvc init ignores only
    # config.local, tmp and cache).
    ignore = root / ".dvc" / ".gitignore"
    lines = ignore.read_text().splitlines() if ignore.exists() else []
    if "/site_cache" not in lines:
        ignore.write_text("\n".join([*lines, "/site_cache"]) + "\n")
    Path(url).mkdir(parents=True, exist_ok=True)


def staging_dir(root: str | Path) -> Path:
    """A fresh folder for a build in progress: inside .dvc/tmp (git- and DVC-ignored), on the
    same filesystem as data/ so the final swap is a rename."""
    # the pid names the owner: once it is gone, the next build removes the folder (journal.py)
    name = f"rcgrpo-staging-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    path = Path(root) / ".dvc" / "tmp" / name
    path.mkdir(parents=True)
    return path


def _md5_of(dvc_text: str, where: str = DVC_FILE) -> str:
    """The md5 a .dvc file names; VersioningError (one line) if it is empty or truncated."""
    try:
        md5 = yaml.safe_load(dvc_text)["outs"][0]["md5"]
    except (yaml.YAMLError, TypeError, KeyError, IndexError):
        md5 = None
    if not isinstance(md5, str) or not md5:
        raise VersioningError(
            f"{where} is empty or truncated (no outs[0].md5): restore it with "
            f"`git checkout -- {where}` or `rcgrpo data rollback <rev>`"
        )
    return check_hash(md5, where)  # a path there would be read as an object


def _cache_file(root: Path, md5: str) -> Path | None:
    """The cache (or local remote) file of an object, as DVC 3 lays them out."""
    for base in (root / ".dvc" / "cache" / "files" / "md5", _remote_dir(root) / "files" / "md5"):
        path = base / md5[:2] / md5[2:]
        if path.exists():
            return path
    return None


def _remote_dir(root: Path) -> Path:
    import configparser

    parser = configparser.ConfigParser()
    parser.read(root / ".dvc" / "config")
    url = parser.get(f"'remote \"{REMOTE_NAME}\"'", "url", fallback="../dvc_remote")
    return (root / ".dvc" / url).resolve()


def listing(root: Path, md5: str) -> dict[str, str]:
    """relpath -> md5 of every file in a stored version ({} if its manifest is not stored)."""
    path = _cache_file(root, check_hash(md5, "a dataset version"))
    return dir_entries(read_object(path), f"object {md5}") if path else {}


def _manifest(root: Path, files: dict[str, str]) -> dict:
    path = _cache_file(root, files["manifest.json"]) if "manifest.json" in files else None
    return json.loads(read_object(path)) if path else {}


def _rows(manifest: dict) -> dict:
    """{"rctp/train.jsonl": {"high": n, "low": n}, ...} from a build manifest."""
    return {
        name: {"high": c["high"], "low": c["low"]} for name, c in manifest.get("files", {}).items()
    }


def check_data_dir(root: str | Path, data_dir: str = "data", remote: str | None = None) -> Path:
    """`data_dir` may only be the DVC-tracked data folder (its `<data_dir>.dvc` exists) or a new
    one (absent or empty), inside the project and outside .git, .dvc and the remote: publish
    renames it aside and deletes it, so any other folder (the remote, src/, ...) is refused
    before anything is touched. `remote` (a build's dataset.remote) is checked too
    (`check_remote`). Returns the absolute path."""
    root = Path(root).resolve()
    path = (root / data_dir).resolve()
    where = f"dataset.data_dir={data_dir}"
    if path == root or not path.is_relative_to(root):
        raise VersioningError(f"{where}: must be a folder inside the project {root}")
    guarded = [root / ".git", root / ".dvc", _remote_dir(root)]
    if remote is not None:
        guarded.append(check_remote(root, remote, data_dir))
    if any(path.is_relative_to(g) or g.is_relative_to(path) for g in guarded):
        raise VersioningError(f"{where}: {path} holds or is git/DVC state or the DVC remote")
    tracked = (root / f"{data_dir}.dvc").exists()
    if path.exists() and not tracked and (not path.is_dir() or any(path.iterdir())):
        raise VersioningError(
            f"{where}: {path} exists and is not a DVC-tracked data folder (no {data_dir}.dvc); "
            "only the tracked data folder or a new (absent or empty) one can be versioned"
        )
    return path


def remote_path(root: Path, remote: str) -> Path:
    """A dataset.remote folder as an absolute path (relative ones are the project's)."""
    return (root / remote).resolve() if not Path(remote).is_absolute() else Path(remote).resolve()


def check_remote(root: str | Path, remote: str, data_dir: str = "data") -> Path:
    """A push target may be the project's remote, a new (absent or empty) folder, or one that
    holds only DVC objects; never the project, .git, .dvc, data_dir or a folder git tracks files
    in (`--set remote=src` would fill src/ with objects). Returns the absolute path."""
    root = Path(root).resolve()
    path, where = remote_path(root, remote), f"dataset.remote={remote}"
    if path == _remote_dir(root):
        return path
    data = (root / data_dir).resolve()
    for what, g in (
        ("the project", root),
        ("git state", root / ".git"),
        ("DVC state", root / ".dvc"),
        ("the data folder", data),
    ):
        if path == g or g.is_relative_to(path) or (g != root and path.is_relative_to(g)):
            raise VersioningError(f"{where}: {path} is or holds {what}; pick another folder")
    if path.is_relative_to(root) and _git(root, "ls-files", "--", str(path), check=False):
        raise VersioningError(f"{where}: git tracks files in {path}; pick another folder")
    objects = {"files", "tmp"}  # DVC 3 (files/md5/..) and DVC 2 (2-hex folders) layouts
    if path.exists() and (
        not path.is_dir()
        or any(
            p.name not in objects and not (len(p.name) == 2 and p.is_dir()) for p in path.iterdir()
        )
    ):
        raise VersioningError(
            f"{where}: {path} exists and is not a DVC remote (only files/ may be in it)"
        )
    return path


def push(root: str | Path, data_dir: str = "data", remote: str | None = None) -> None:
    """dvc push the version data.dvc names to the project's remote, or to `remote` (a one-off
    push target, passed to DVC for this push only: .dvc/config is not changed)."""
    root = Path(root).resolve()
    target = remote_path(root, remote) if remote else _remote_dir(root)
    repo = _repo(root, {"remote": {REMOTE_NAME: {"url": str(target)}}} if remote else None)
    try:
        repo.push([str(root / f"{data_dir}.dvc")])
    except Exception as e:
        raise VersioningError(f"dvc push to {target} failed: {e}") from e
    finally:
        repo.close()


def versions(root: str | Path, data_dir: str = "data") -> list[dict]:
    """Every committed version of data/, newest first, with its row counts per file and label."""
    root = Path(root).resolve()
    dvc_file = f"{data_dir}.dvc"
    log = _git(root, "log", "--format=%H %cI", "--", dvc_file, check=False)
    current = _md5_of((root / dvc_file).read_text()) if (root / dvc_file).exists() else None
    out = []
    for line in filter(None, log.splitlines()):
        rev, date = line.split(" ", 1)
        text = _git(root, "show", f"{rev}:{dvc_file}", check=False)
        if not text:  # the commit that deleted data.dvc
            continue
        md5 = _md5_of(text)
        files = listing(root, md5)
        out.append(
            {
                "rev": rev,
                "date": date,
                "md5": md5,
                "rows": _rows(_manifest(root, files)),
                "checked_out": md5 == current,
            }
        )
    return out


def file_md5s(folder: str | Path) -> dict[str, str]:
    """relpath -> md5 of every file under `folder` (what DVC would record)."""
    folder = Path(folder)
    return {
        str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def data_version(root: str | Path | None = None, data_dir: str = "data") -> dict:
    """{"rev", "md5", "dirty"} of the dataset in the work tree, for MLflow runs to record.

    rev: the last commit of data.dvc (None if never committed); dirty: data.dvc differs from that
    commit, or a file in data/ differs from the version data.dvc names.
    """
    from rcgrpo.runtime import project_root

    root = Path(root).resolve() if root else project_root()
    dvc_file = root / f"{data_dir}.dvc"
    if not dvc_file.exists():
        return {"rev": None, "md5": None, "dirty": True}
    md5 = _md5_of(dvc_file.read_text())
    rev = _git(root, "log", "-1", "--format=%H", "--", dvc_file.name, check=False) or None
    changed = bool(_git(root, "status", "--porcelain", "--", dvc_file.name, check=False))
    stored = listing(root, md5)
    workspace = file_md5s(root / data_dir) if (root / data_dir).exists() else {}
    return {"rev": rev, "md5": md5, "dirty": changed or (bool(stored) and stored != workspace)}

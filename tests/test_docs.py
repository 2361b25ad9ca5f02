"""The README and docs/ pages stay true to the checkout: every relative link resolves (the file,
and the heading when a #anchor is given), every `rcgrpo ...` line of a fenced block names a real
command (its `--help` exits 0), docs/layout.md's tree lists exactly the files there are, and the
README's short tree names only real paths.

Why: docs drift silently; a moved page, a renamed command or a new module should fail here, not
confuse a reader.

    .venv/bin/pytest tests/test_docs.py -q
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose_and_fences(text: str) -> tuple[list[str], list[str]]:
    """A markdown text -> (lines outside fenced blocks, lines inside them). A ```text block is a
    program's output, not commands: its lines are in neither list."""
    prose, fenced, fence = [], [], None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = line.strip()[3:] if fence is None else None
        elif fence is None:
            prose.append(line)
        elif fence != "text":
            fenced.append(line)
    return prose, fenced


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = prose_and_fences(page.read_text())
    return {anchor(line.lstrip("#")) for line in prose if re.match(r"#{1,6} ", line)}


def test_anchor_matches_github():
    assert anchor("Will it fit? `rcgrpo plan`") == "will-it-fit-rcgrpo-plan"
    assert (
        anchor("Side by side with TRL (`bench/peer_trl.py`)")
        == "side-by-side-with-trl-benchpeer_trlpy"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    prose, _ = prose_and_fences(page.read_text())
    broken = []
    for target in LINK.findall("\n".join(prose)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(f"{target}: no heading #{frag} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def command_paths() -> list[tuple[str, ...]]:
    """The command words of every `rcgrpo ...` line in a fenced block (arguments, options and
    comments dropped), each path once."""
    paths = set()
    for page in PAGES:
        _, fenced = prose_and_fences(page.read_text())
        for line in fenced:
            words = line.split("#")[0].split()
            if not words or words[0] != "rcgrpo":
                continue
            path = []
            for word in words[1:]:
                if not re.fullmatch(r"[a-z][a-z0-9_-]*", word):
                    break  # an option, a path, a placeholder: the command ends here
                path.append(word)
            paths.add(tuple(path))
    return sorted(paths)


def resolve(path: tuple[str, ...]) -> tuple[str, ...]:
    """The command words of `path` that name (sub)commands; the rest are a leaf's arguments. A
    word after a group that is not one of its commands fails."""
    import typer

    from rcgrpo.cli import app

    cmd, words = typer.main.get_command(app), []
    for word in path:
        sub = getattr(cmd, "commands", None)
        if sub is None:  # a leaf command: the rest are its arguments
            break
        assert word in sub, f"`rcgrpo {' '.join(path)}`: no command {word!r} (has {sorted(sub)})"
        cmd, words = sub[word], [*words, word]
    return tuple(words)


def test_docs_name_commands():
    assert len(command_paths()) >= 5  # the README's own examples at least


def test_every_documented_rcgrpo_command_exists():
    commands = sorted({resolve(path) for path in command_paths()})
    failed = []
    for words in commands:
        run = subprocess.run(
            [sys.executable, "-m", "rcgrpo.cli", *words, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if run.returncode != 0:
            failed.append(
                f"rcgrpo {' '.join(words)} --help: exit {run.returncode}: {run.stderr[-300:]}"
            )
    assert not failed, "\n".join(failed)


def tree_paths() -> set[str]:
    """The paths of docs/layout.md's tree (`  x.py` lines are under the last `dir/` line)."""
    text = (ROOT / "docs" / "layout.md").read_text()
    block = text.split("```", 2)[1]
    paths, parent = set(), ""
    for line in block.splitlines():
        if not line.strip():
            continue
        name = line.split()[0]
        if line.startswith("  "):
            paths.add(parent + name)
        else:
            paths.add(name.rstrip("/"))
            parent = name if name.endswith("/") else ""
    return paths


def listed_files() -> set[str]:
    """Files the tree must list: tracked sources of src/, flows/, bench/, scripts/ and docs/,
    less the packages' __init__.py (the package line says it)."""
    tracked = subprocess.run(
        ["git", "ls-files", "src", "flows", "bench", "scripts", "docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    keep = {".py", ".md", ".json", ".yaml", ".sh"}
    return {
        p
        for p in tracked
        if Path(p).suffix in keep and Path(p).name != "__init__.py" and (ROOT / p).exists()
    }


def test_layout_tree_lists_every_file_and_only_real_ones():
    tree = tree_paths()
    missing = sorted(listed_files() - tree)
    assert not missing, f"docs/layout.md tree lacks: {missing}"
    gone = sorted(p for p in tree if not (ROOT / p).exists() and p not in ("mlflow",))
    assert not gone, f"docs/layout.md tree names files that do not exist: {gone}"


def test_the_readme_short_tree_names_real_paths():
    block = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("```", 2)[1]
    parent, gone = "", []
    for line in filter(str.strip, block.splitlines()):
        names = line.split("  ")[0].strip().split(", ")
        if not line.startswith("  "):
            parent = names[0] if names[0].endswith("/") else ""
        base = parent if line.startswith("  ") else ""
        gone += [base + n for n in names if not (ROOT / (base + n)).exists() and n != "mlflow/"]
    assert not gone, f"README layout names paths that do not exist: {gone}"


def test_the_readme_is_a_front_door():
    """The README stays a front door (<= 250 lines): details go to docs/ pages."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move a section to docs/"

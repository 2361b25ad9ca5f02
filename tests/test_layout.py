"""The package reads as the pipeline: every import runs down the stage layers, none in a circle,
and no file of src/ or flows/ is longer than 300 lines.

The layers, bottom to top (README, "Layout"); a module may import from its own layer and the ones
below, never from above (a lower layer that needs something from above takes it as an argument):

    runtime, config, servers -> bfcl -> chat -> models -> rollout -> data -> training
    -> evaluation -> tracking -> flows -> cli

Every import counts, also one inside a function (a lazy import is still a dependency). The graph
is read with `ast` from the source files, so nothing is imported to check it.

    .venv/bin/pytest tests/test_layout.py -q
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LAYERS = [
    (
        "rcgrpo.runtime",
        "rcgrpo.procs",
        "rcgrpo.fields",
        "rcgrpo.config",
        "rcgrpo.servers",
        "rcgrpo.mlflow_ui",
        "rcgrpo.run_lock",
        "rcgrpo",
    ),
    ("rcgrpo.bfcl",),
    ("rcgrpo.chat",),
    ("rcgrpo.models",),
    ("rcgrpo.rollout",),
    ("rcgrpo.data",),
    ("rcgrpo.training",),
    ("rcgrpo.evaluation",),
    ("rcgrpo.tracking",),
    ("flows",),
    ("rcgrpo.cli",),
]
MAX_LINES = 300


def _modules() -> dict[str, Path]:
    found = {}
    files = [*SRC.rglob("*.py"), *(ROOT / "flows").glob("*.py")]
    for path in files:
        parts = list(path.relative_to(SRC if SRC in path.parents else ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (`from a import b` counts a.b if it is one)."""
    modules, graph = _modules(), {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                targets = [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                found = _resolve(target, modules)
                if found and found != name:
                    edges.add(found)
        graph[name] = edges
    return graph


def layer_of(module: str) -> int:
    """The layer of the longest prefix naming the module (the bare `rcgrpo` only itself)."""
    matches = [
        (len(p), i)
        for i, prefixes in enumerate(LAYERS)
        for p in prefixes
        if module == p or (p != "rcgrpo" and module.startswith(p + "."))
    ]
    if not matches:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS")
    return max(matches)[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    found = cycles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_imports_run_down_the_layers():
    upward = [
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
        for a, edges in import_graph().items()
        for b in sorted(edges)
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "imports from a layer above:\n" + "\n".join(upward)


def test_no_file_over_300_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*SRC.rglob("*.py"), *(ROOT / "flows").glob("*.py")]
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines (split them along their concepts): {long}"


def test_every_package_says_what_it_may_import():
    for init in SRC.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc, f"{init.relative_to(ROOT)}: say what the stage may import"


def test_the_checker_sees_a_circle_and_an_upward_import():
    """The checks above would pass on an empty graph: show they catch what they are for."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert "rcgrpo.bfcl.checkers" in graph["rcgrpo.rollout.agent_loop"]  # edges are read
    assert layer_of("rcgrpo.bfcl.checkers") < layer_of("rcgrpo.training.grpo.trainer")
    assert layer_of("rcgrpo.runtime") == 0 and layer_of("rcgrpo.cli.pipeline") == len(LAYERS) - 1

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
import re
import subprocess
import sys
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
        "rcgrpo.flow_server",
        "rcgrpo.mlflow_ui",
        "rcgrpo.run_lock",
        "rcgrpo.owned",
        "rcgrpo",
    ),
    ("rcgrpo.bfcl",),
    ("rcgrpo.chat",),
    ("rcgrpo.models",),
    ("rcgrpo.rollout",),
    ("rcgrpo.data",),
    ("rcgrpo.training",),
    ("rcgrpo.evaluation",),
    ("rcgrpo.tracking", "rcgrpo.run_config"),
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


SKIP = re.compile(r"[ \t]*# fmt: skip\b.*$", re.M)


def formatted_lines(text: str) -> int:
    """A file's length as `ruff format` lays it out with its `# fmt: skip` markers removed: a
    file cannot meet the limit by packing lines. Aligned tables keep their layout between
    `# fmt: off` and `# fmt: on`, which ruff honours."""
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", "x.py", "-"],
        input=SKIP.sub("", text),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return len(out.splitlines())


def test_no_file_over_300_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*SRC.rglob("*.py"), *(ROOT / "flows").glob("*.py")]
        if (n := formatted_lines(p.read_text())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines (split them along their concepts): {long}"


def test_lines_are_counted_as_ruff_lays_them_out():
    packed = "x = f(a,\n      b)  # fmt: skip\n"
    assert formatted_lines(packed) == 1  # joined: it fits in 100 columns
    long_call = "y = g(" + ", ".join(f"argument_{i}" for i in range(12)) + ")  # fmt: skip\n"
    assert formatted_lines(long_call) == 14  # one argument a line once the marker is gone
    table = "# fmt: off\nT = {'a': 1,   'b': 2,\n     'c': 3}\n# fmt: on\n"
    assert formatted_lines(table) == 4  # an aligned table keeps its layout


def _unit(module: str) -> str:
    """What a package docstring names for an imported module: its stage package (`rollout`,
    `flows`) or, in the bottom layer, the module itself (`config`, `runtime`)."""
    parts = module.split(".")
    return parts[0] if parts[0] == "flows" else parts[1]


def stated_imports(doc: str) -> set[str] | None:
    """The names after `Imports:` in a package docstring, up to the full stop ('none' = {})."""
    match = re.search(r"Imports: ([^.]*)\.", doc)
    if match is None:
        return None
    names = {n.strip() for n in match.group(1).replace("\n", " ").split(",")}
    return set() if names == {"none"} else names


def imported_units(package: str, graph: dict[str, set[str]]) -> set[str]:
    """The stage packages and bottom-layer modules that the modules of `package` import."""
    inside = lambda m: m == package or m.startswith(package + ".")  # noqa: E731
    return {_unit(b) for a, edges in graph.items() if inside(a) for b in edges if not inside(b)}


def test_every_package_says_what_it_imports():
    """Each package's docstring ends with `Imports: a, b.`, exactly what its modules import."""
    graph, wrong = import_graph(), []
    for init in sorted(SRC.rglob("__init__.py")):
        package = ".".join(init.parent.relative_to(SRC).parts)
        if package == "rcgrpo":
            continue  # the root: its docstring states the layer order (test below)
        stated = stated_imports(ast.get_docstring(ast.parse(init.read_text())) or "")
        actual = imported_units(package, graph)
        where = init.relative_to(ROOT)
        if stated is None:
            wrong.append(f"{where}: no `Imports: ...` line (it imports {sorted(actual)})")
        elif stated != actual:
            wrong.append(
                f"{where}: says it imports {sorted(stated)}, its modules import "
                f"{sorted(actual)} (add {sorted(actual - stated)}, drop {sorted(stated - actual)})"
            )
        names = {n: "flows" if n == "flows" else f"rcgrpo.{n}" for n in stated or ()}
        upward = [n for n, m in names.items() if layer_of(m) > layer_of(package)]
        if upward:
            wrong.append(f"{where}: names layers above its own: {upward}")
    assert not wrong, "\n".join(wrong)


def test_the_root_docstring_lists_the_layers_in_order():
    doc = ast.get_docstring(ast.parse((SRC / "rcgrpo" / "__init__.py").read_text())) or ""
    chain = re.search(r"bottom to top: ([\w >-]+);", " ".join(doc.split())).group(1)
    stages = [p.split(".")[1] for (p, *_) in LAYERS[1:-2]]  # flows/ and cli/: "on top"
    assert chain.split(" -> ") == stages, (chain, stages)


def test_the_import_statement_check_sees_a_false_statement():
    graph = {"rcgrpo.chat.x": {"rcgrpo.bfcl.tasks", "rcgrpo.config"}, "rcgrpo.chat": set()}
    assert imported_units("rcgrpo.chat", graph) == {"bfcl", "config"}
    assert stated_imports("Prompts.\nImports: bfcl,\nconfig. More.") == {"bfcl", "config"}
    assert stated_imports("Imports: none.") == set() and stated_imports("May import: x") is None


def _top_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names a module defines, names it only imports) at its top level."""
    defined, imported = set(), set()

    def walk(body):
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If | ast.Try):
                for part in (node.body, node.orelse, getattr(node, "finalbody", [])):
                    walk(part)
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)
            else:  # an assignment, a for or with target
                defined.update(
                    t.id
                    for t in ast.walk(node)
                    if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)
                )

    walk(tree.body)
    return defined, imported - defined


def reexported_imports() -> list[str]:
    """Every `from M import name` (src/, flows/, tests/, bench/, scripts/) where M does not
    define `name` but imported it: a shim. Import a name from the module that defines it."""
    files = dict(_modules())
    for folder in ("tests", "bench", "scripts"):  # run with their folder on sys.path
        files.update({p.stem: p for p in (ROOT / folder).glob("*.py")})
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in files.items()}
    names = {m: _top_names(t) for m, t in trees.items()}
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module in files and not node.level):
                continue
            defined, imported = names[node.module]
            for alias in node.names:
                name = alias.name
                if f"{node.module}.{name}" not in files and name in imported:
                    where = files[module].relative_to(ROOT)
                    found.append(f"{where}:{node.lineno} imports {name} through {node.module}")
    return found


def test_no_name_is_imported_through_a_module_that_only_imports_it():
    found = reexported_imports()
    assert not found, "import these from their defining module:\n" + "\n".join(found)


def test_the_checker_sees_a_circle_and_an_upward_import():
    """The checks above would pass on an empty graph: show they catch what they are for."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert "rcgrpo.bfcl.checkers" in graph["rcgrpo.rollout.agent_loop"]  # edges are read
    assert layer_of("rcgrpo.bfcl.checkers") < layer_of("rcgrpo.training.grpo.trainer")
    assert layer_of("rcgrpo.runtime") == 0 and layer_of("rcgrpo.cli.pipeline") == len(LAYERS) - 1

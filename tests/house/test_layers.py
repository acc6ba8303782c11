"""The layers of app/ import one way, and no module of app/ takes part in an import circle.

Every ``import``/``from … import`` of the package is read from the source (function-level imports
included: they are still a dependency), so a circle or an upward import fails here before anyone
has to find it with a debugger. The layers, from the bottom:

* ``app/core``: pure definitions (no database, no FastAPI);
* ``app/ingest``: upload formats, parsed into native episodes;
* ``app/compute``: computation on decoded episodes;
* ``app/storage``: the database, its tables and stores, and caches of computed results;
* ``app/http``: the JSON API, the pages, errors, access control;
* the features ``app/lab`` and ``app/sim`` (each with its own routes), then ``app/main.py`` and
  ``app/cli.py`` on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"

RANK = {
    "core": 0,
    "ingest": 1,
    "compute": 2,
    "storage": 3,
    "http": 4,
    "lab": 5,
    "sim": 5,
    "main": 6,
    "cli": 6,
}
# Packages a layer must never import, whatever their rank (the core stays free of the web framework
# and the database driver).
FORBIDDEN = {"core": ("fastapi", "starlette", "sqlmodel", "sqlalchemy"), "compute": ("fastapi", "sqlmodel")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The absolute modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from app.core import domain`
    return out


MODULES = {module_name(p): p for p in APP.rglob("*.py")}


def app_graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        graph[name] = {m for m in imports_of(path) if m in MODULES and m != name}
    return graph


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_is_in_a_layer():
    stray = [m for m in MODULES if m != "app" and layer(m) not in RANK and layer(m) != "malloc"]
    assert stray == [], f"modules outside the layers of tests/house/test_layers.py: {stray}"


def test_layers_import_one_way():
    upward = []
    for mod, deps in app_graph().items():
        here = layer(mod)
        if here not in RANK:
            continue
        for dep in deps:
            there = layer(dep)
            if there in RANK and RANK[there] > RANK[here]:
                upward.append(f"{mod} -> {dep}")
            if there in RANK and RANK[there] == RANK[here] and there != here:
                upward.append(f"{mod} -> {dep} (two features must not import each other)")
    assert upward == [], "imports that run up the layers:\n" + "\n".join(sorted(upward))


@pytest.mark.parametrize("layer_name", sorted(FORBIDDEN))
def test_lower_layers_stay_free_of_the_framework(layer_name):
    bad = []
    for mod, path in MODULES.items():
        if layer(mod) == layer_name:
            for dep in imports_of(path):
                if dep.split(".")[0] in FORBIDDEN[layer_name]:
                    bad.append(f"{mod} imports {dep}")
    assert bad == []


def test_no_import_circle_inside_app():
    graph = app_graph()
    # Tarjan's strongly connected components: any component of two or more modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    # A package's __init__ importing its own submodules is not a circle of the code.
    circles = [c for c in circles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert circles == [], f"import circles inside app/: {circles}"


def test_estimators_never_import_app():
    bad = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "estimators").rglob("*.py")
        if any(m == "app" or m.startswith("app.") for m in imports_of(p))
    ]
    assert bad == []

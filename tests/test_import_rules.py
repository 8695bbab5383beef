"""The package tree's rules as tests (docs/architecture.md, "Package tree"):
no protocol imports another, nothing outside a protocol's package imports
more of it than the registry hands out, imports run one way (no loops), and
only down the layer table: a module imports its own layer and the layers
below it. Imports made only for type checking or inside functions count."""

from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

GATEWAY = REPO / "gateway"
# What protocols share, and how the rest of the gateway reaches them.
NEUTRAL = frozenset({"gateway.protocols", "gateway.protocols.base", "gateway.protocols.http_frontend",
                     "gateway.protocols.http_upstream",
                     "gateway.protocols.registry", "gateway.protocols.triton"})

# The layers, lowest first: gateway.<layer>.*; a module may import its own
# layer and those below it. The package itself (its version) is core, and
# ``python -m gateway`` (gateway/__main__.py) is the app.
LAYERS = ("core", "config", "observability", "runtime", "transport", "dataplane", "protocols", "app")
# Beside the order: the data plane speaks canonical types only, so it imports
# no transport though it sits above it (the app hands it what it needs).
APART = frozenset({("dataplane", "transport")})


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in GATEWAY.rglob("*.py") if "generated" not in path.parts}


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The gateway modules ``path`` imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                     for alias in node.names]
        found.update(name for name in names if name.startswith("gateway"))
    return found


def _protocol_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "protocols" and f"{parts[0]}.{parts[1]}.{parts[2]}" not in NEUTRAL:
        return parts[2]
    return None


def test_no_protocol_is_imported_from_outside_its_package() -> None:
    known = _modules()
    wrong = []
    for module, path in known.items():
        for imported in _imports(path, known):
            owner = _protocol_of(imported)
            if owner is not None and owner != _protocol_of(module):
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "\n".join(sorted(wrong))


def _layer(module: str) -> int:
    if module == "gateway":
        return 0
    if module == "gateway.__main__":
        return len(LAYERS) - 1
    return LAYERS.index(module.split(".")[1])


def _target(imported: str, known: dict[str, Path]) -> str:
    """The module an import names (``from gateway.x import name``: gateway.x)."""
    while imported and imported not in known:
        imported = imported.rpartition(".")[0]
    return imported


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) pairs where a lower layer imports a higher one."""
    return {(module, imported) for module, targets in graph.items() for imported in targets
            if _layer(imported) > _layer(module)}


def _graph(known: dict[str, Path]) -> dict[str, set[str]]:
    return {module: {_target(imported, known) for imported in _imports(path, known)} - {module, ""}
            for module, path in known.items()}


def test_every_imported_gateway_module_is_in_this_tree() -> None:
    """A module that moved must be imported by its new name everywhere: an
    editable install elsewhere would otherwise quietly serve the old one."""
    known = _modules()
    sources = [*GATEWAY.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    missing = sorted(f"{path.relative_to(REPO)} imports {imported}" for path in sources
                     if "generated" not in path.parts and "data" not in path.relative_to(REPO).parts
                     for imported in _imports(path, known)
                     if imported not in known and ".generated" not in imported)
    assert not missing, "\n".join(missing)


def test_every_module_is_in_a_layer() -> None:
    outside = [module for module in _modules() if module not in ("gateway", "gateway.__main__")
               and module.split(".")[1] not in LAYERS]
    assert not outside, "modules outside the layer table: " + ", ".join(sorted(outside))


def test_imports_only_go_down_the_layers() -> None:
    found = sorted(_upward(_graph(_modules())))
    assert not found, "upward imports: " + "; ".join(f"{a} imports {b}" for a, b in found)


def test_the_data_plane_imports_no_transport() -> None:
    found = sorted((module, imported) for module, targets in _graph(_modules()).items() for imported in targets
                   if (module.split(".")[1:2] + imported.split(".")[1:2]) in [list(pair) for pair in APART])
    assert not found, "; ".join(f"{a} imports {b}" for a, b in found)


def test_the_layer_rule_finds_a_planted_upward_import(tmp_path: Path) -> None:
    """The tests above pass on an empty answer: the finder must see one, in a
    function and under TYPE_CHECKING alike."""
    planted = tmp_path / "planted.py"
    planted.write_text("from typing import TYPE_CHECKING\n"
                       "if TYPE_CHECKING:\n    from gateway.app.server import Gateway\n"
                       "def later() -> None:\n    from gateway.dataplane import routing\n")
    known = _modules()
    graph = {"gateway.core.planted": {_target(name, known) for name in _imports(planted, known)}}
    assert _upward(graph) == {("gateway.core.planted", "gateway.app.server"),
                              ("gateway.core.planted", "gateway.dataplane.routing")}


def test_imports_have_no_loops() -> None:
    known = _modules()
    graph = {}
    for module, path in known.items():
        targets = set()
        for imported in _imports(path, known):
            while imported and imported not in known:  # `from gateway.x import name`: module gateway.x
                imported = imported.rpartition(".")[0]
            if imported and imported != module and not module.startswith(imported + "."):  # a package's own __init__
                targets.add(imported)
        graph[module] = targets
    loops = [component for component in _strongly_connected(graph) if len(component) > 1]
    assert not loops, "import loops: " + "; ".join(" <-> ".join(sorted(c)) for c in loops)


def test_the_loop_finder_finds_a_loop() -> None:
    """The test above passes on an empty answer: the finder must see one."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert sorted(sorted(c) for c in _strongly_connected(graph)) == [["a", "b", "c"], ["d"]]


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components

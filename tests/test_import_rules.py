"""The package tree's rules as tests (docs/architecture.md, "Package tree"):
no protocol imports another, nothing outside a protocol's package imports
more of it than the registry hands out, and imports run one way (no
loops, counting imports made only for type checking or inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

GATEWAY = REPO / "gateway"
# What protocols share, and how the rest of the gateway reaches them.
NEUTRAL = frozenset({"gateway.protocols", "gateway.protocols.base", "gateway.protocols.upstream",
                     "gateway.protocols.registry"})


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

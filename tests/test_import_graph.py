"""No import circle among hdeval's modules.

Read with `ast` only (nothing is imported), so an import inside a function counts as much as one
at the top of a file: both tie the two modules together, and a circle of them is what makes
partial-import errors and a package that cannot be split. lint-imports checks the floors; this
checks what it cannot see, a circle inside one floor.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hdeval"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the hdeval modules it imports, wherever in the file the import statement is.

    `from pkg import name` points at `pkg.name` when that is a module, else at `pkg`; importing
    `a.b.c` is an edge to `a.b.c` only (as import-linter counts it), not to its parents.
    """
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if _is_package(path) else name.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")
                    if node.level > 1:
                        base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in files else base)
            for target in targets:
                # `import hdeval.x.y` where y is a name, not a file: the nearest module above it
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] == root.name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        # iterative, so a deep chain of imports cannot hit the recursion limit
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_reader_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "hdeval"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from hdeval.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nfrom . import c\n")
    (pkg / "sub" / "c.py").write_text("import hdeval.a.f\n")
    graph = import_graph(pkg)
    assert graph["hdeval.a"] == {"hdeval.sub.b"}
    assert graph["hdeval.sub.b"] == {"hdeval.a", "hdeval.sub.c"}
    assert graph["hdeval.sub.c"] == {"hdeval.a"}
    assert cycles(graph) == [["hdeval.a", "hdeval.sub.b", "hdeval.sub.c"]]


def test_no_import_circle_in_the_package():
    found = cycles(import_graph())
    assert not found, "import circles (each: the modules that import each other):\n" + "\n".join(
        " <-> ".join(component) for component in found
    )

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


def private_imports(root: Path = PACKAGE) -> list[str]:
    """A private name of another package (folder) than the importing module's: imported
    (``from hdeval.x.y import _name``) or reached through an imported module
    (``from hdeval.x import y; y._name``, ``import hdeval.x.y as y; y._name``,
    ``import hdeval.x.y; hdeval.x.y._name``): a private name is its package's own business."""

    def package_of(module: str) -> str:
        if (root / Path(*module.split(".")[1:]) / "__init__.py").exists():
            return module  # `from hdeval.pkg import _x`: pkg's own name
        return module.rpartition(".")[0]

    def is_module(module: str) -> bool:
        rel = Path(*module.split(".")[1:])
        return (root / rel).with_suffix(".py").exists() or (root / rel / "__init__.py").exists()

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    found = []
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path, root)
        package = name if _is_package(path) else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bound: dict[str, str] = {}  # a name (or dotted path) in this file -> the hdeval module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == root.name:
                        bound[alias.asname or alias.name] = alias.name
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] != root.name:
                continue
            source = node.module
            for alias in node.names:
                if private(alias.name) and package_of(source) != package:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {source}.{alias.name}")
                elif is_module(f"{source}.{alias.name}"):
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr):
                module = bound.get(ast.unparse(node.value))
                if module is not None and package_of(module) != package:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {module}.{node.attr}")
    return found


def _two_packages(tmp_path):
    """A package ``hdeval`` with sub-packages ``a`` and ``b``; ``a/m.py`` defines ``_secret``."""
    pkg = tmp_path / "hdeval"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "m.py").write_text("def _secret():\n    pass\n")
    return pkg


def test_the_private_import_check_sees_one(tmp_path):
    pkg = _two_packages(tmp_path)
    (pkg / "a" / "n.py").write_text("from hdeval.a.m import _secret\n")  # same package: allowed
    (pkg / "b" / "o.py").write_text("def f():\n    from hdeval.a.m import _secret\n")
    assert private_imports(pkg) == ["hdeval/b/o.py:2 hdeval.a.m._secret"]


def test_the_private_import_check_sees_one_reached_through_a_module(tmp_path):
    # `from hdeval.a import m; m._secret()` is the same breach as importing `_secret`
    pkg = _two_packages(tmp_path)
    (pkg / "a" / "n.py").write_text("from hdeval.a import m\nm._secret()\n")  # same package: allowed
    (pkg / "b" / "o.py").write_text("from hdeval.a import m\n\ndef f():\n    return m._secret()\n")
    (pkg / "b" / "p.py").write_text("import hdeval.a.m as mm\nmm._secret()\n")
    (pkg / "b" / "q.py").write_text("import hdeval.a.m\nhdeval.a.m._secret()\n")
    (pkg / "b" / "r.py").write_text("from hdeval.a import m\nm.public()\nm.__name__\n")  # not private
    assert private_imports(pkg) == [
        "hdeval/b/o.py:4 hdeval.a.m._secret",
        "hdeval/b/p.py:2 hdeval.a.m._secret",
        "hdeval/b/q.py:2 hdeval.a.m._secret",
    ]


def test_no_module_imports_another_packages_private_names():
    found = private_imports()
    assert not found, "private names imported across packages (make them public, or keep them home):\n" + (
        "\n".join(found)
    )


# the doors: code that talks to a terminal (the CLI, and the commands a method adds to it)
DOORS = ("cli",)


def prints(root: Path = PACKAGE) -> list[str]:
    """Calls of print() or click.echo/secho outside the doors: the library reports through
    ``notify``, ``Progress``, warnings and logging, and leaves the terminal to its caller."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in DOORS or path.name == "commands.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (isinstance(f, ast.Name) and f.id == "print") or (
                isinstance(f, ast.Attribute)
                and f.attr in ("echo", "secho")
                and isinstance(f.value, ast.Name)
                and f.value.id == "click"
            ):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_the_print_check_sees_one(tmp_path):
    pkg = tmp_path / "hdeval"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "cli" / "a.py").write_text("print('fine: a door')\n")
    (pkg / "b.py").write_text("import click\n\ndef f():\n    click.echo('no')\n    print('no')\n")
    assert prints(pkg) == ["hdeval/b.py:4", "hdeval/b.py:5"]


def test_the_library_never_prints():
    found = prints()
    assert not found, "the library prints (use notify, Progress, warnings or logging):\n" + "\n".join(found)

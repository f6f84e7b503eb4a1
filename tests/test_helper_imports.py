"""Test modules import helpers from one another inside test functions, where collection does
not see them: a helper renamed in one file broke three tests of another only in the slow run."""

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def _defined(module: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
    return names


def test_every_helper_a_test_imports_from_another_test_module_exists() -> None:
    missing = []
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and (node.module.startswith("test_") or node.module == "conftest")):
                continue
            source = TESTS / f"{node.module}.py"
            defined = _defined(source) if source.exists() else set()
            missing += [f"{path.name}:{node.lineno}: {node.module}.{a.name}"
                        for a in node.names if a.name not in defined]
    assert missing == []

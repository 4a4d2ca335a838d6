"""No module of the simulated device changes another module's state when it is imported: what runs at import is
definitions and assignments to the module's own names; a call made for its effect (a statement, a decorator) or an
assignment into something imported from mtlir is the side effect that explicit registration replaced."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parents[3] / "runtime" / "sim"


def _project_names(tree: ast.Module) -> set[str]:
    """The names a module binds by importing from mtlir (at module level)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mtlir"):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("mtlir")}
    return names


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _effects(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, code) of each module-level call kept for its effect or assignment into an imported mtlir name."""
    imported = _project_names(tree)
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from ((d.lineno, ast.unparse(d)) for d in node.decorator_list if _root(d) in imported)
            if isinstance(node, ast.ClassDef):
                pending += node.body
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _root(node.value) in imported:
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            yield from ((node.lineno, ast.unparse(node)) for t in targets
                        if isinstance(t, (ast.Attribute, ast.Subscript)) and _root(t) in imported)
        elif isinstance(node, (ast.For, ast.If, ast.With, ast.Try)):
            pending += [s for s in ast.iter_child_nodes(node) if isinstance(s, ast.stmt)]


@pytest.mark.parametrize("path", sorted(SIM.rglob("*.py")), ids=lambda p: str(p.relative_to(SIM)))
def test_importing_changes_no_other_module(path: Path) -> None:
    assert list(_effects(ast.parse(path.read_text()))) == []


def test_the_check_sees_the_registration_it_forbids() -> None:
    source = ("from mtlir.runtime.sim.msgsend import objc_method, TABLE\nfrom mtlir.x import RULES\n"
              "@objc_method(int, 'length')\ndef f(): pass\nRULES.setdefault('*', []).insert(0, f)\n"
              "for k in ('a',):\n    TABLE[k] = f\nOWN = {}\nOWN['b'] = f\n")
    assert sorted(line for line, _ in _effects(ast.parse(source))) == [3, 5, 7]

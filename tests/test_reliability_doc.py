"""docs/reliability.md stays true: every test it names (``tests/...py::name``) exists as a test function of that file,
and its table has a row for every rule of the ``Rule`` enumeration (METAL.md §3, rule 0 included)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from mtlir.runtime.sim.rules.rule import Rule

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
NAMED = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def _named() -> list[tuple[str, str]]:
    return sorted(set(NAMED.findall(DOC.read_text())))


def _test_functions(path: Path) -> set[str]:
    """The test functions of a test module: module-level ``test_*`` functions and ``Test*`` classes' methods."""
    tree = ast.parse(path.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        names |= {f"{cls.name}::{m.name}" for m in cls.body if isinstance(m, ast.FunctionDef)}
    return {n for n in names if n.startswith("test_") or "::test_" in n}


def test_the_page_names_many_tests() -> None:
    assert len(_named()) >= 60  # the parse found the table's test column


@pytest.mark.parametrize("path, name", _named(), ids=lambda v: str(v))
def test_every_test_the_page_names_exists(path: str, name: str) -> None:
    module = ROOT / path
    assert module.is_file(), f"docs/reliability.md names {path}, which does not exist"
    assert name in _test_functions(module), f"docs/reliability.md names {path}::{name}, which is not a test there"


def test_every_rule_has_a_row() -> None:
    rows = re.findall(r"^\| (\d+) \| ", DOC.read_text(), re.M)
    assert sorted(map(int, rows)) == sorted(r.number for r in Rule)

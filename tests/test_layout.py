"""The layout shows the architecture (docs/internals.md, "The tree"): a folder per concept, one idea per file, and
imports that only point one way: the IR core imports nothing of the passes or the runtime, the passes import the
core, the runtime imports the core and never the passes."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("mtlir", "passes", "runtime")


def _modules(top: str) -> Iterator[Path]:
    yield from sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path, *, module_level_only: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported module) of every import in ``path``: all of them, or those at module level only."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)


@pytest.mark.parametrize("top", TOPS)
def test_no_word_prefix_shared_by_siblings(top: str) -> None:
    """A family of files named ``word_*.py`` is a folder that was never made: no file or folder shares a ``word_``
    prefix with another sibling."""
    for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        names = sorted(p.stem for p in folder.iterdir()
                       if (p.suffix == ".py" or p.is_dir()) and p.name != "__pycache__" and not p.name.startswith("__"))
        for name in names:
            word = name.strip("_").split("_")[0]
            if "_" not in name.strip("_"):
                continue
            others = [n for n in names if n != name and (n == word or n.startswith(word + "_"))]
            assert not others, f"{folder.relative_to(ROOT)}: {name} shares the prefix {word}_ with {others}"


def test_the_core_imports_nothing_of_the_passes_or_the_runtime() -> None:
    """mtlir/ (the IR core, the front end, the Metal facts, the Program, the pictures) at module level imports neither
    mtlir.passes nor mtlir.runtime; only the command line and the lazy public surface of ``import mtlir`` may."""
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}"
           for path in _modules("mtlir") if "cli" not in path.relative_to(ROOT).parts
           for line, name in _imports(path, module_level_only=path.name == "__init__.py")
           if name.startswith(("mtlir.passes", "mtlir.runtime")) and not _type_checking_only(path, line)]
    assert not bad, bad


def _type_checking_only(path: Path, line: int) -> bool:
    """Whether the import at ``line`` sits under ``if TYPE_CHECKING:`` (for annotations only, never run)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            if any(getattr(n, "lineno", -1) == line for b in node.body for n in ast.walk(b)):
                return True
    return False


def test_the_passes_never_import_the_runtime() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}" for path in _modules("passes")
           for line, name in _imports(path) if name.startswith("mtlir.runtime")]
    assert not bad, bad


def test_nothing_imports_the_tinygrad_client() -> None:
    """mtlir.tinygrad (clients/tinygrad/) imports the core, the passes and the runtime; nothing of mtlir/, passes/ or
    runtime/ imports it (it needs tinygrad, an optional extra), except ``mtlir record`` (mtlir/cli/record.py), inside
    its command function only, so the rest of the command line works without tinygrad."""
    lazy = ROOT / "mtlir" / "cli" / "record.py"
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}" for top in TOPS for path in _modules(top)
           for line, name in _imports(path, module_level_only=path == lazy) if name.startswith("mtlir.tinygrad")]
    assert not bad, "\n".join(bad)


def test_the_runtime_never_imports_the_passes() -> None:
    """What the runtime needs from a lowering is part of the lowered Program; it never calls back into the passes."""
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}" for path in _modules("runtime")
           for line, name in _imports(path) if name.startswith("mtlir.passes")]
    assert not bad, bad

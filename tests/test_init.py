"""`import mtlir`: the public surface, each name imported from where it lives on first use; the import itself loads
neither graphviz, networkx, numpy, pyopencl, the passes nor the runtime, and graphviz comes only with a drawing."""
from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mtlir

HEAVY = ("graphviz", "networkx", "numpy", "pyopencl", "mtlir.passes", "mtlir.runtime")


def _modules_after(code: str, tmp_path: Path) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (from a directory without mtlir/ in it)."""
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def _loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(m.startswith(name + ".") for m in modules)


def test_import_mtlir_loads_nothing_heavy(tmp_path: Path) -> None:
    modules = _modules_after("import mtlir", tmp_path)
    assert "mtlir" in modules
    assert [name for name in HEAVY if _loaded(modules, name)] == []


def test_graphviz_comes_only_with_a_drawing(tmp_path: Path) -> None:
    modules = _modules_after("import mtlir\nmtlir.to_dot\nmtlir.UOp\nmtlir.parse", tmp_path)
    assert "mtlir.viz" in modules and "mtlir.ir.uop" in modules
    assert [name for name in HEAVY if _loaded(modules, name)] == []
    pytest.importorskip("graphviz")
    modules = _modules_after("import mtlir\nmtlir.to_dot(mtlir.UOp.const(mtlir.dtypes.int32, 1))", tmp_path)
    assert "graphviz" in modules


def test_every_public_name_is_the_object_where_it_lives() -> None:
    assert len(mtlir.__all__) == len(set(mtlir.__all__)) and set(mtlir.__all__) == set(mtlir._WHERE)
    for name in mtlir.__all__:
        assert getattr(mtlir, name) is getattr(importlib.import_module(mtlir._WHERE[name]), name), name
    assert set(mtlir.__all__) <= set(dir(mtlir))
    with pytest.raises(AttributeError, match="no attribute 'Rule'"):
        getattr(mtlir, "Rule")


def test_the_type_checker_sees_the_same_names() -> None:
    """The imports under TYPE_CHECKING (what mypy reads) name exactly the public names, from the same modules."""
    tree = ast.parse(Path(mtlir.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    imported = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imported == mtlir._WHERE


def test_the_subpackages_import_from_the_repository_root() -> None:
    """Started in the repository root (a script, a REPL, ``python -m mtlir``), the root's own mtlir/ folder is the
    package: it finds mtlir.passes, mtlir.runtime and mtlir.tinygrad in the sibling folders the install maps them
    from (a newcomer's ModuleNotFoundError)."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    probe = ("import mtlir, mtlir.passes, mtlir.runtime.sim.device, mtlir.tinygrad.settings\n"
             "print(mtlir.__file__, mtlir.runtime.sim.device.__file__)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=root,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    here, device = proc.stdout.split()
    assert Path(here).parent == root / "mtlir" and Path(device) == root / "runtime" / "sim" / "device.py"
    run = subprocess.run([sys.executable, "-m", "mtlir", "--version"], capture_output=True, text=True, timeout=120,
                         cwd=root, env=env)
    assert run.returncode == 0 and run.stdout.strip(), run.stderr[-2000:]

"""The installed layout: `passes/` and `runtime/` install as `mtlir.passes` and `mtlir.runtime`, and nothing but
`mtlir` lands in site-packages. Run from the repository root the top-level `mtlir/` folder would shadow an installed
package, so this test builds the wheel, installs it into a fresh environment and imports from another directory."""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("mtlir", "passes", "runtime", "clients"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(src)], check=True, capture_output=True, text=True)
    (whl,) = out.glob("mtlir-*.whl")
    return whl


def test_wheel_holds_only_mtlir(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
        names = set(z.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"mtlir"}
    for needed in ("mtlir/py.typed", "mtlir/passes/__init__.py", "mtlir/runtime/__init__.py",
                   "mtlir/runtime/sim/__init__.py"):
        assert needed in names, needed


def test_wheel_imports_from_another_directory(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # the wheel's files go into the fresh environment; its dependencies come from this test's environment through a
    # plain path entry (a .pth line adds a path without running that directory's own .pth files, so the editable
    # install of the checkout stays out of sight)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import mtlir, mtlir.passes, mtlir.runtime, mtlir.runtime.sim; "
            "print(mtlir.__file__); print(mtlir.passes.__file__); print(mtlir.runtime.__file__)")
    got = subprocess.run([str(py), "-c", code], cwd=elsewhere, check=True, capture_output=True, text=True).stdout
    for line in got.split():
        assert line.startswith(site), (line, site)


def _tree_packages() -> set[str]:
    """Every folder of mtlir/, passes/ and runtime/ that holds Python files, as the package name it installs as."""
    names = {"mtlir": "mtlir", "passes": "mtlir.passes", "runtime": "mtlir.runtime", "clients/tinygrad": "mtlir.tinygrad"}
    found = set()
    for top, name in names.items():
        for init in (ROOT / top).rglob("*.py"):
            rel = init.parent.relative_to(ROOT / top)
            if "__pycache__" not in rel.parts:
                found.add(".".join([name, *rel.parts]))
    return found


def test_every_folder_is_a_package_in_pyproject() -> None:
    """A new subpackage cannot be forgotten: pyproject.toml lists exactly the folders that hold Python files, and each
    has an ``__init__.py``."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = _tree_packages()
    assert listed == tree, f"missing from pyproject.toml: {sorted(tree - listed)}; not in the tree: {sorted(listed - tree)}"
    for package in tree:
        parts = package.split(".")[1:]
        folder = (ROOT.joinpath(*parts) if parts and parts[0] in ("passes", "runtime") else
                  ROOT.joinpath("clients", *parts) if parts and parts[0] == "tinygrad" else ROOT.joinpath("mtlir", *parts))
        assert (folder / "__init__.py").is_file(), f"{folder} has Python files but no __init__.py"


def test_wheel_installs_every_folder_of_the_tree(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        packages = {n.rsplit("/", 1)[0].replace("/", ".") for n in z.namelist() if n.endswith("/__init__.py")}
    assert packages == _tree_packages()


def test_the_arm64_harness_installs_every_runtime_dependency() -> None:
    """make test-arm64 runs mtlir in an AArch64 Python whose packages tests/arm64/setup.sh downloads: it must have
    every dependency of pyproject.toml but pyopencl (the kernels run in an x86_64 server); a dependency added without
    it broke that run with 'No module named tqdm'."""
    import re
    import tomllib
    deps = {re.split(r"[<>=!~ ;\[]", d)[0].lower() for d in
            tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    got = re.search(r'^PACKAGES="([^"]*)"', (ROOT / "tests" / "arm64" / "setup.sh").read_text(), re.M)
    assert got is not None
    assert set(got.group(1).split()) == deps - {"pyopencl"}

"""tinygrad's own test/test_tiny.py (from the tinygrad 0.14.0 source distribution on PyPI, the only test file it
ships) on mtlir's METAL device. The file is downloaded at test time into .cache/tinygrad (``pip download
--no-binary :all: --no-deps tinygrad==0.14.0``), never committed; without the network the test is skipped, saying
why. Each expected failure is an xfail with its reason."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "tinygrad"
SDIST = "tinygrad-0.14.0.tar.gz"

# test -> why it fails here (not a fault of the mtlir device)
XFAIL = {
    "test_const": "Tensor(2.0).item() runs a kernel on tinygrad's CPU device, which needs clang (not installed)",
    "test_eye": "Tensor.eye realizes a constant on tinygrad's CPU device, which needs clang (not installed)",
}


def _test_tiny() -> Path:
    target = CACHE / "test_tiny.py"
    if target.is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "tinygrad==0.14.0", "-d", str(CACHE)], check=True, capture_output=True, text=True, timeout=120)
        with tarfile.open(CACHE / SDIST) as tar:
            member = tar.extractfile("tinygrad-0.14.0/test/test_tiny.py")
            assert member is not None
            target.write_bytes(member.read())
    except (subprocess.SubprocessError, OSError, KeyError) as e:
        pytest.skip(f"could not download tinygrad 0.14.0's source distribution from PyPI: {e}")
    return target


def test_tinygrad_test_tiny_passes_on_the_mtlir_device(tmp_path: Path) -> None:
    """Runs test_tiny.py in a child pytest (its unittest classes, our device registered by a conftest) and checks
    every test passed, skipped by tinygrad itself, or failed for a reason listed in XFAIL."""
    src = _test_tiny()
    shutil.copy(src, tmp_path / "test_tiny.py")
    (tmp_path / "conftest.py").write_text("import mtlir.tinygrad\n")
    report = tmp_path / "report.txt"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "--tb=line",
                           str(tmp_path / "test_tiny.py"), "-o", f"cache_dir={tmp_path}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    report.write_text(proc.stdout)
    outcomes = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("PASSED", "FAILED", "SKIPPED", "ERROR") and "::" in parts[1]:
            outcomes[parts[1].rsplit("::", 1)[1]] = parts[0]
    assert len(outcomes) >= 19, proc.stdout[-3000:]  # 21 tests; its two image tests skip (CL only), unparsed
    clang = shutil.which("clang") is not None
    unexpected = {t: o for t, o in outcomes.items() if o in ("FAILED", "ERROR") and (clang or t not in XFAIL)}
    assert not unexpected, f"{unexpected}\n{proc.stdout[-3000:]}"
    assert sum(o == "PASSED" for o in outcomes.values()) >= 17, proc.stdout[-3000:]
    if not clang and any(outcomes.get(t) == "FAILED" for t in XFAIL):
        pytest.xfail("; ".join(f"{t}: {why}" for t, why in XFAIL.items() if outcomes.get(t) == "FAILED"))

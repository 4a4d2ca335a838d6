"""``make test-arm64``: the real-Metal path on AArch64 under qemu-user, against x86_64 and the simulator.

Run with the project's x86_64 Python after tests/arm64/setup.sh (the Makefile does both):
``run_arm64.py [--cache .cache/arm64]``. It

1. builds the fake Metal (tests/native) for AArch64 (gobjc-12-aarch64-linux-gnu) and for x86_64;
2. serves kernels from this process (tests/native/kernel_server.py: the simulator's KernelRunner on PoCL, which
   does not run under qemu);
3. runs arm64_worker.py in the AArch64 Python under ``qemu-aarch64-static -L ROOT`` (no binfmt_misc): every
   Apple7 trace, three lowerings each, through an unmodified MetalBridge;
4. runs the same traces here on the x86_64 build and on the simulated device;
5. checks: every AArch64 run matches and received exactly ``mtlir lower --json --target arm64``'s messages; the
   dispatch records (kernel, grid, threadgroup, bindings, offsets) are identical on AArch64, x86_64 and the
   simulator; MTLSize by pointer and NSRange in two registers arrive intact; and the negative control (MTLSize by
   value as three words on arm64) is caught.

Exit 0 when all holds, 1 otherwise (each failure is printed).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "tests" / "runtime" / "metal"), str(REPO / "tests" / "native")]

import fake_metal as fm  # noqa: E402
from kernel_server import KernelServer, label  # noqa: E402

WORKER_TIMEOUT_S = 1800


def _package_paths(tmp: Path) -> list[str]:
    """The installed package's link tree (pure Python: the AArch64 interpreter imports it as it is) and a folder
    with its metadata alone (``mtlir --version`` reads it)."""
    import importlib.metadata
    import shutil

    import mtlir
    meta = tmp / "meta"
    dist = importlib.metadata.distribution("mtlir")
    info = Path(str(dist.locate_file(""))) / f"mtlir-{dist.version}.dist-info"
    if not meta.exists():
        shutil.copytree(info, meta / info.name)
    return [str(Path(mtlir.__path__[0]).parent), str(meta)]


def _worker(root: Path, site: Path, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    tmp = Path(argv[-1]).parent
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHOME": str(root / "usr"), "PYTHONSAFEPATH": "1",
           "PYTHONPATH": os.pathsep.join([str(site), *_package_paths(tmp), str(REPO / "tests" / "runtime" / "metal"),
                                          str(REPO / "tests" / "native")]),
           "PYTHONDONTWRITEBYTECODE": "1", "FAKE_METAL_KERNELS": os.environ.get("FAKE_METAL_KERNELS", "")}
    cmd = ["qemu-aarch64-static", "-L", str(root), str(root / "usr" / "bin" / "python3.11"),
           str(HERE / "arm64_worker.py"), *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(REPO / ".cache" / "arm64"))
    ap.add_argument("--timeout", type=float, default=WORKER_TIMEOUT_S, help="seconds for the AArch64 worker")
    args = ap.parse_args(argv)
    cache = Path(args.cache).resolve()
    root, site = cache / "root", cache / "site"
    if not (root / ".complete").exists() or not (site / ".complete").exists():
        print(f"test-arm64: {cache} is not set up: run tests/arm64/setup.sh {cache} (make test-arm64 does)")
        return 1
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="mtlir-arm64-"))
    arm = fm.build("aarch64", tmp / "aarch64")
    x86 = fm.build("x86_64", tmp / "x86_64")
    from mtlir.runtime.sim.kernels.runner import KernelRunner
    runner = KernelRunner()
    records: list[dict[str, Any]] = []
    sock = str(tmp / "kernels.sock")
    server = KernelServer(sock, runner, records.append)
    os.environ["FAKE_METAL_KERNELS"] = sock
    failures: list[str] = []
    try:
        done = _worker(root, site, [arm.libobjc, arm.metal, sock, str(tmp / "arm64.json")], args.timeout)
        sys.stdout.write(done.stdout)
        if done.returncode != 0:
            print(done.stderr[-4000:])
            print(f"test-arm64: the AArch64 worker failed (exit {done.returncode})")
            return 1
        results = json.loads((tmp / "arm64.json").read_text())
        if results["machine"] != "aarch64":
            failures.append(f"the worker ran on {results['machine']}, not aarch64")
        for r in results["runs"]:
            name = f"{Path(r['trace']).name} {r['how']}"
            if r["code"] != 0 or not r["doc"].get("match"):
                failures.append(f"arm64 {name}: exit {r['code']}, {r['doc']}\n{r['stderr']}")
            if not r["messages_equal"]:
                failures.append(f"arm64 {name}: the fake did not receive the {r['messages']} messages listed: "
                                f"first difference (received, listed) {r['first_diff']}")
            arm_records = [d for d in records if d.get("run") == f"arm64 {name}"]
            label(sock, f"x86_64 {name}")
            x = fm.run_on_fake(r["trace"], fm.FLAGS[r["how"]], x86, sock, tmp / "x86.jsonl")
            x86_records = [d for d in records if d.get("run") == f"x86_64 {name}"]
            code, sim = fm.run_on_sim(r["trace"], fm.FLAGS[r["how"]], runner)
            if x.code != 0 or code != 0 or not x.doc.get("match"):
                failures.append(f"x86_64/sim {name}: exits {x.code}, {code}")
            a, b, c = fm.canonical(arm_records), fm.canonical(x86_records), fm.canonical(sim)
            if not (a == b == c and len(a) == r["doc"].get("kernels")):
                failures.append(f"{name}: dispatch records differ (arm64 {len(a)}, x86_64 {len(b)}, sim {len(c)})")
            else:
                print(f"{name}: {len(a)} dispatch records identical on arm64, x86_64 and the simulator")
        for what, got in results["structs"].items():
            if got["sent"] != got["arrived"]:
                failures.append(f"arm64 {what}: sent {got['sent']}, arrived {got['arrived']}")
            else:
                print(f"arm64 {what} arrived intact: {got['arrived']}")
        neg = _worker(root, site, ["--negative", arm.libobjc, arm.metal, sock, str(tmp / "neg.json")], 600)
        if "negative control: sending" not in neg.stdout:
            failures.append(f"negative control: the worker did not get to the send (exit {neg.returncode}):\n"
                            f"{neg.stderr[-2000:]}")
        elif neg.returncode == 0:
            failures.append("negative control: MTLSize by value as three words on arm64 was NOT caught")
        else:
            how = "crashed" if neg.returncode < 0 else f"exit {neg.returncode}"
            detail = (tmp / "neg.json").read_text() if (tmp / "neg.json").exists() else "no result (the method died)"
            print(f"negative control caught ({how}): MTLSize by value as three words on arm64: {detail}")
    finally:
        server.close()
    for f in failures:
        print(f"FAILED: {f}")
    print(f"test-arm64: {len(results['runs'])} runs in {time.monotonic() - t0:.0f} s")
    # the closing line in the plain form CI reads: checks that passed (every run, the negative control), failed
    checks = len(results["runs"]) + 1
    print(f"test-arm64: {checks - min(len(failures), checks)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

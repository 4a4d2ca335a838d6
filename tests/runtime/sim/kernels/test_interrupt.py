"""A Ctrl-C while a kernel's OpenCL program builds waits for the build and then arrives as KeyboardInterrupt (it
used to reach PoCL's linker mid-build and abort the process with SIGABRT: no exit line, no JSON)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_CHILD = textwrap.dedent("""
    import os, signal, sys, types
    import pyopencl
    from mtlir.runtime.sim.kernels.runner import KernelRunner

    class Program:  # pyopencl's, with a Ctrl-C arriving as the build starts
        def __init__(self, *args):
            self.program = pyopencl.Program(*args)
        def build(self, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)
            return self.program.build(**kwargs)

    cl = types.SimpleNamespace(**{k: getattr(pyopencl, k) for k in dir(pyopencl) if not k.startswith("__")})
    cl.Program = Program
    runner = KernelRunner(cl=cl)
    try:
        runner.compile(open(sys.argv[1]).read(), "k")
        print("no interrupt")
    except KeyboardInterrupt:
        print("interrupted after", len(runner._programs), "built")
""")



@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_an_interrupt_during_a_build_waits_for_it(tmp_path: Path) -> None:
    body = "    a[i] = a[i] * 2.5f + sin(a[i]);\\n"
    msl = ("#include <metal_stdlib>\\nusing namespace metal;\\nkernel void k(device float* a [[buffer(0)]], "
           "uint i [[thread_position_in_grid]]) {\\n" + body + "}\\n")
    (tmp_path / "k.metal").write_text(msl)
    env = {"POCL_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    import os
    env = {**os.environ, **env}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "k.metal")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "interrupted after 1 built", (proc.stdout, proc.stderr[-500:])

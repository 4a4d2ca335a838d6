"""Checked kernels: a kernel run on Oclgrind, which reports out-of-bounds accesses and data races between work-items.

``SimDevice(checked=True)`` and ``mtlir run --check-kernels`` run every kernel, before the kernel runner runs it as
usual, once more on Oclgrind (Debian's package ``oclgrind``, ``make oclgrind``: an OpenCL device that interprets
the kernel and checks every access). What Oclgrind runs is the kernel translated *without* mtlir's bounds checks
(``msl.translate(bounds_checks=False)``, what ``mtlir translate --no-bounds-checks`` prints): the checks would skip
an out-of-bounds access before Oclgrind saw it. Oclgrind runs in a child process of its own (``check_kernel``):
its ICD is found through ``OCL_ICD_VENDORS`` and reads its options (``OCLGRIND_DATA_RACES=1``: race detection;
``OCLGRIND_UNIFORM_WRITES`` left off, so two work-items writing the same value are not a race) when the context is
made, which a process that already uses PoCL could not arrange. The child works on copies of the buffers; the
results the program sees are the kernel runner's.

Oclgrind writes its reports to the child's file descriptor 2, captured around the kernel with ``stderr``'s
``_native_stderr``; ``parse_reports`` reads each (``Invalid read of size 4 at global memory address ...``,
``Read-write data race at global memory address ...``) into a ``Report`` and maps its OpenCL line (``At line 7
(column 12) of input.cl``) back to the MSL line with the translation's line map (``Translation.msl_position``).
The first report becomes a ``KernelCheckError`` naming the kernel, the MSL line and the kind of problem.
"""
from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtlir.errors import KernelCheckError, NoDeviceError
from mtlir.runtime.sim.msl.translate import Translation, translate

__all__ = ["OCLGRIND_ICD", "Report", "available", "check_kernel", "parse_reports", "check_launch", "checked_runs"]

OCLGRIND_ICD = Path("/usr/lib/oclgrind/liboclgrind-rt-icd.so")  # Debian's package oclgrind
_FAULT_WORDS = 64  # the fault record the translated kernel writes to (unused without the bounds checks)


def available() -> bool:
    """Whether Oclgrind's ICD library is installed."""
    return OCLGRIND_ICD.exists()


@dataclass(frozen=True)
class Report:
    """One problem Oclgrind reported: ``kind`` (``out-of-bounds read``, ``out-of-bounds write``, ``data race``
    with its flavour, or Oclgrind's own first line), the kernel, the OpenCL ``cl_line`` and the ``msl_line`` it
    maps to (None: not known), and Oclgrind's ``text``."""

    kind: str
    kernel: str
    cl_line: int | None
    msl_line: int | None
    text: str


_HEAD = re.compile(r"^(Invalid (read|write) of size \d+|(\w+-\w+) data race|Work-group divergence|"
                   r"Uninitialized value|Invalid [\w ]+|Unaligned [\w ]+)", re.M)
_LINE = re.compile(r"At line (\d+)(?: \(column (\d+)\))?")
_KERNEL = re.compile(r"Kernel: (\w+)")


def parse_reports(text: str, translation: Translation | None = None, msl: str = "") -> list[Report]:
    """The problems in Oclgrind's output ``text``, in order. A report starts at a line such as ``Invalid read of
    size 4 at global memory address 0x...`` or ``Write-write data race at ...`` and runs to the next blank line;
    its ``At line N (column C) of input.cl`` is mapped to the MSL line through ``translation`` (the first column
    of that line that comes from the MSL when no column is given)."""
    starts = [m.start() for m in _HEAD.finditer(text)]
    out = []
    for a, b in zip(starts, starts[1:] + [len(text)]):
        block = text[a:b].split("\n\n")[0].strip()
        head = _HEAD.match(block)
        assert head is not None
        if head.group(2):
            kind = f"out-of-bounds {head.group(2)}"
        elif head.group(3):
            kind = f"data race ({head.group(3).lower()})"
        else:
            kind = head.group(1)
        kernel = _KERNEL.search(block)
        at = _LINE.search(block)
        cl_line = int(at.group(1)) if at else None
        msl_line = None
        if at and translation is not None:
            assert cl_line is not None
            width = len(translation.source.split("\n")[cl_line - 1]) if cl_line <= translation.source.count("\n") + 1 \
                else 0
            cols = [int(at.group(2))] if at.group(2) else list(range(1, width + 1))
            for col in cols:
                pos = translation.msl_position(cl_line, col)
                if pos is not None:
                    msl_line = pos[0]
                    break
        out.append(Report(kind, kernel.group(1) if kernel else "", cl_line, msl_line, block))
    return out


def check_kernel(msl: str, function: str, bindings: dict[int, tuple[np.ndarray, int]],
                 grid: tuple[int, int, int], threadgroup: tuple[int, int, int], *, timeout_s: float = 120.0) -> None:
    """Run kernel ``function`` of the MSL library ``msl`` on Oclgrind (module docstring) with copies of
    ``bindings`` (Metal buffer index -> (storage bytes as a uint8 array, byte offset)), ``grid`` threadgroups of
    ``threadgroup`` threads. Returns when Oclgrind reported nothing.

    Raises ``KernelCheckError`` for the first problem it reports (naming the kernel, the MSL line and the kind),
    ``NoDeviceError`` when Oclgrind is not installed or its device cannot be used, ``TimeoutError`` when the child
    has not finished after ``timeout_s`` seconds (it is killed: nothing waits forever)."""
    if not available():
        raise NoDeviceError(f"checked kernels need Oclgrind ({OCLGRIND_ICD} is missing: install Debian's package "
                            "oclgrind, `make oclgrind`)")
    request = (msl, function, {i: (bytes(s.tobytes()), int(off)) for i, (s, off) in bindings.items()},
               tuple(grid), tuple(threadgroup))
    with tempfile.TemporaryDirectory(prefix="mtlir-oclgrind-") as vendors:
        Path(vendors, "oclgrind.icd").write_text(f"{OCLGRIND_ICD}\n")
        env = dict(os.environ, OCL_ICD_VENDORS=vendors, OCLGRIND_DATA_RACES="1", PYTHONSAFEPATH="1")
        env.pop("OCLGRIND_UNIFORM_WRITES", None)
        try:
            proc = subprocess.run([sys.executable, "-m", "mtlir.runtime.sim.kernels.oclgrind"],
                                  input=pickle.dumps(request), capture_output=True, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"Oclgrind did not finish kernel {function!r} in {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace")[-2000:]
        raise NoDeviceError(f"Oclgrind could not run kernel {function!r} (exit {proc.returncode}): {tail}")
    captured = pickle.loads(proc.stdout)
    assert isinstance(captured, str)
    translation = translate(msl, bounds_checks=False)
    reports = [r for r in parse_reports(captured, translation, msl) if r.kernel in ("", function)]
    if reports:
        raise _error(reports[0], function, msl, len(reports))


def _error(r: Report, function: str, msl: str, count: int) -> KernelCheckError:
    lines = msl.split("\n")
    where = (f"MSL line {r.msl_line}: `{lines[r.msl_line - 1].strip()}`"
             if r.msl_line is not None and 0 < r.msl_line <= len(lines) else "no MSL line known")
    more = f" (and {count - 1} more reports)" if count > 1 else ""
    return KernelCheckError(f"kernel {function!r}: {r.kind} at {where}{more}; Oclgrind: "
                            f"{r.text.splitlines()[0]}", function=function, kind=r.kind, msl_line=r.msl_line,
                            report=r.text)


def check_launch(msl: str, launch: Any, timeout_s: float = 120.0) -> None:
    """The checked-mode hook of the kernel runner: ``check_kernel`` for one ``Launch`` (its kernel, bindings as
    they are on the host now, and its OpenCL sizes turned back into threadgroups), within ``timeout_s`` seconds."""
    local = tuple(launch.local_size) + (1,) * (3 - len(launch.local_size))
    glob = tuple(launch.global_size) + (1,) * (3 - len(launch.global_size))
    grid = tuple(g // t for g, t in zip(glob, local))
    check_kernel(msl, launch.ck.function, launch.bindings, grid, local, timeout_s=timeout_s)


def _msl_of(runner: Any, ck: Any) -> str:
    """The MSL library the runner compiled ``ck`` from (its cache is keyed by (MSL, function))."""
    for (msl, _), compiled in list(runner._kernels.items()):
        if compiled is ck:
            return str(msl)
    raise KeyError(f"kernel {ck.function!r} was not compiled by this runner")


def checked_runs(dev: Any) -> Callable[[Any, Sequence[Any], float, bool], Any]:
    """The kernel runner's checked-mode hook for SimDevice ``dev`` (``KernelRunner.checker``): each launch of a
    batch runs alone, after ``check_launch`` on Oclgrind with the host data as it is then (the runner syncs first,
    so a launch sees what the one before it wrote). A ``KernelCheckError`` is handed to ``dev.defer_error``, so
    the host's next message to the device raises it, and raised: the command buffer ends in status Error."""
    def run(runner: Any, launches: Sequence[Any], timeout_s: float, keep: bool) -> Any:
        hook, runner.checker = runner.checker, None
        try:
            for k, launch in enumerate(launches):
                runner.sync()
                try:
                    check_launch(_msl_of(runner, launch.ck), launch, timeout_s)
                except KernelCheckError as e:
                    dev.defer_error(e)
                    raise
                fault = runner.run_batch([launch], timeout_s, keep)
                if fault is not None:
                    return k + fault[0], fault[1]
            return None
        finally:
            runner.checker = hook
    return run


def _serve() -> None:
    """The child: run one request from stdin on Oclgrind's device, print what it wrote to fd 2 (pickled)."""
    import pyopencl as cl  # the ICD loader sees Oclgrind only (OCL_ICD_VENDORS)

    from mtlir.runtime.sim.kernels.stderr import _native_stderr

    msl, function, bindings, grid, tg = pickle.loads(sys.stdin.buffer.read())
    devices = [d for p in cl.get_platforms() for d in p.get_devices() if "oclgrind" in p.name.lower()]
    if not devices:
        raise SystemExit("no Oclgrind platform")
    ctx = cl.Context(devices[:1])
    queue = cl.CommandQueue(ctx)
    translation = translate(msl, bounds_checks=False)
    info = translation.kernels[function]
    with _native_stderr() as captured:
        program = cl.Program(ctx, translation.source).build()
        kernel = cl.Kernel(program, function)
        mf = cl.mem_flags
        args: list[Any] = []
        block = np.zeros(3 * max(1, len(info.bindings)), np.uint64)
        for b in info.bindings:
            data, offset = bindings[b.arg.index]
            host = np.frombuffer(data, np.uint8).copy()
            args.append(cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host))
            block[3 * b.slot], block[3 * b.slot + 2] = offset, host.nbytes
        args.append(cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=block))
        args.append(cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.zeros(_FAULT_WORDS, np.uint32)))
        if info.simd:
            from mtlir.runtime.sim.msl.simd import scratch_bytes
            args.append(cl.LocalMemory(scratch_bytes(tg[0] * tg[1] * tg[2])))
        kernel.set_args(*args)
        cl.enqueue_nd_range_kernel(queue, kernel, tuple(g * t for g, t in zip(grid, tg)), tuple(tg))
        queue.finish()
    sys.stdout.buffer.write(pickle.dumps(captured.text))


if __name__ == "__main__":
    _serve()

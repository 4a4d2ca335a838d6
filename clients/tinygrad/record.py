"""``mtlir.tinygrad.record``: run a tinygrad program on mtlir's METAL device and write the kernel queue it ran as a
trace (the format of examples/traces: docs/lowering.md, "Traces"; docs/tinygrad.md, "Recording"), with the expected
output computed by another tinygrad device (CPU, or PYTHON, tinygrad's emulator, which needs no compiler).

The script's convention: it defines ``main()`` returning the output ``Tensor`` (any dtype, any shape), built from
inputs made on the host (``Tensor(numpy_array)``, fixed seeds) so that two runs give the same inputs. ``record``
runs the script (as a module named ``__mtlir_record__``, ``sys.argv`` = ``[script, *args]``) twice: once on METAL
with every kernel call and host write captured (``mtlir.tinygrad.device.RECORDERS``), once on the expected device.

What the trace holds: every buffer a kernel touched, its bytes when first used (``init``, left out when all zero),
one program per distinct MSL source, one dispatch per eager kernel call (TinyJit is off while recording: its batches
run as eager calls), the variables of symbolic kernels with their bounds (a grid axis that is exactly a variable is
written as its name in ``grid_expr``; a variable in a more complex grid expression is narrowed to its value), and the
output (the buffer and byte offset of ``main()``'s result).
"""
from __future__ import annotations

import base64
import runpy
import shutil
import sys
from collections.abc import Sequence
from types import FrameType
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtlir.errors import InputError, MtlirError
from mtlir.frontend.checks import param_dtype
from mtlir.frontend.trace import parse_trace
from mtlir.runtime.context import DeviceBuffer
from mtlir.tinygrad import device as metal
from mtlir.tinygrad.settings import SETTINGS, configure

__all__ = ["record", "record_trace", "RecordError", "expected_device"]


class RecordError(InputError):
    """The script cannot be recorded: it fails, has no ``main()``, returns no Tensor, runs no kernel that writes
    its output, or writes a buffer from the host after a kernel used it (the trace copies each buffer in once)."""


@dataclass
class _Buffer:
    id: str
    buf: DeviceBuffer
    init: bytes | None


@dataclass
class _Program:
    key: str
    function: str
    msl: str
    params: list[list[Any]]


@dataclass
class _Recorder:
    """The ``Recorder`` of ``mtlir.tinygrad.device``: keeps buffers (by handle, in order of first use), programs
    (by MSL source), dispatches and variables of one recording."""

    dev: Any
    buffers: dict[int, _Buffer] = field(default_factory=dict)
    programs: dict[str, _Program] = field(default_factory=dict)
    dispatches: list[dict[str, Any]] = field(default_factory=list)
    variables: dict[str, dict[str, int]] = field(default_factory=dict)

    def _buffer(self, buf: DeviceBuffer) -> str:
        b = self.buffers.get(buf.handle)
        if b is None:
            self.dev.ctx.synchronize()
            data = self.dev.ctx.read(buf, 0, buf.nbytes)
            b = self.buffers[buf.handle] = _Buffer(str(len(self.buffers) + 1), buf, data if any(data) else None)
        return b.id

    def _program(self, prog: Any, bufs: tuple[metal.MetalBuffer, ...], names: list[str]) -> str:
        msl = prog.kernel.msl
        p = self.programs.get(msl)
        if p is None:
            function = prog.kernel.function
            taken = {q.key for q in self.programs.values()}
            key = function if function not in taken else f"{function}_v{len(self.programs)}"
            nb = len(prog.kernel.params) - len(names)
            params = [[None if q.var is None else names[q.index - nb], q.index, q.dtype, []]
                      for q in prog.kernel.params]
            p = self.programs[msl] = _Program(key, function, msl, params)
        for q, b in zip(p.params, bufs):  # elements: the fewest the views of the dispatches so far hold
            n = b.size // param_dtype(q[2]).itemsize
            q[3] = [min(q[3][0], n)] if q[3] else [n]
        return p.key

    def dispatch(self, prog: Any, bufs: tuple[metal.MetalBuffer, ...], global_size: tuple[int, ...],
                 local_size: tuple[int, ...], vals: tuple[int | None, ...]) -> None:
        args = [{"buffer": self._buffer(b.buf), "offset": b.offset, "size": b.size} for b in bufs]
        grid = [int(g) for g in global_size] + [1] * (3 - len(global_size))
        local = [int(t) for t in local_size] + [1] * (3 - len(local_size))
        info = _program_info()
        tvars = tuple(getattr(info, "vars", ()))
        params = [q.var for q in prog.kernel.params if q.var is not None]
        # a variable's name: tinygrad's (start_pos), in the order of its ProgramInfo, else the MSL parameter's
        names = [str(v.expr) for v in tvars] if len(tvars) == len(params) else [str(n) for n in params]
        values = [int(v or 0) for v in vals]
        d: dict[str, Any] = {"kernel": self._program(prog, bufs, names), "grid": grid, "threadgroup": local,
                             "args": args, "vars": values}
        bounds = {str(v.expr): (int(v.vmin), int(v.vmax)) for v in tvars}
        exact: list[int | str] = list(grid)
        narrowed: set[str] = set()
        for axis, size in enumerate(tuple(getattr(info, "global_size", ()))[:3]):
            if isinstance(size, int):
                continue
            name = str(size.expr) if _is_variable(size) else ""
            if name in names:
                exact[axis] = name
            else:  # a size the format cannot write as one name: valid at the recorded value only
                nodes = size.toposort() if callable(size.toposort) else size.toposort
                narrowed.update(str(u.expr) for u in nodes if _is_variable(u))
        if exact != grid:
            d["grid_expr"] = exact
        for name, value in zip(names, values):
            lo, hi = (value, value) if name in narrowed or name not in bounds else bounds[name]
            old = self.variables.get(name)
            if old is not None and old["value"] != value:
                raise RecordError(f"variable {name!r} took two values ({old['value']}, then {value}) in one "
                                  "recording: a trace binds each variable once")
            self.variables[name] = {"value": value, "min": max(lo, old["min"]) if old else lo,
                                    "max": min(hi, old["max"]) if old else hi}
        self.dispatches.append(d)

    def copyin(self, dest: metal.MetalBuffer) -> None:
        b = self.buffers.get(dest.buf.handle)
        if b is not None:
            raise RecordError(f"the script writes buffer {b.id} ({dest.buf.nbytes} bytes) from the host after a kernel "
                              "used it: a trace copies each buffer in once, before the first dispatch (make every "
                              "input before main() realizes anything)")


def _is_variable(u: Any) -> bool:
    """Whether tinygrad's UOp ``u`` is a variable (0.14: a PARAM of the ALU address space; older: DEFINE_VAR)."""
    return getattr(u.op, "name", "") in ("PARAM", "DEFINE_VAR") and hasattr(u, "expr")


def _program_info() -> Any:
    """tinygrad's ``ProgramInfo`` of the kernel being called (the ``ast.arg`` of tinygrad 0.14's ``exec_kernel``,
    a few frames up): its symbolic grid and its variables with their bounds; None when not found."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            break
        arg = getattr(frame.f_locals.get("ast"), "arg", None)
        if hasattr(arg, "vars") and hasattr(arg, "global_size"):
            return arg
        frame = frame.f_back
    return None


def _context(**values: int | str) -> Any:
    """tinygrad's ``Context`` (untyped in tinygrad): its settings changed for a ``with`` block."""
    from tinygrad.helpers import Context
    make: Any = Context
    return make(**values)


def expected_device() -> str:
    """The device the expected output is computed on by default: ``CPU`` when ``clang`` is installed, else
    ``PYTHON`` (tinygrad's emulator: slow, but needs no compiler)."""
    return "CPU" if shutil.which("clang") else "PYTHON"


def _run_main(script: Path, args: Sequence[str]) -> Any:
    """Runs ``script`` and its ``main()``; returns the realized output Tensor. Raises ``RecordError``."""
    from tinygrad.tensor import Tensor
    argv = sys.argv
    sys.argv = [str(script), *args]
    try:
        try:
            ns = runpy.run_path(str(script), run_name="__mtlir_record__")
            main = ns.get("main")
            if not callable(main):
                raise RecordError(f"{script}: defines no main() returning the output Tensor (docs/tinygrad.md, "
                                  "\"Recording\")")
            out = main()
            if not isinstance(out, Tensor):
                raise RecordError(f"{script}: main() returned {type(out).__name__}, not the output Tensor")
            return out.contiguous().realize()
        except MtlirError:  # mtlir's own (an unsupported kernel, a GPU error) keep their exit codes
            raise
        except SystemExit as e:
            raise RecordError(f"{script}: exited with status {e.code} before main() returned") from None
        except Exception as e:
            raise RecordError(f"{script}: {type(e).__name__}: {e}") from e
    finally:
        sys.argv = argv


def record_trace(script: str | Path, args: Sequence[str] = (), *, family: str | None = None,
                 tensor_cores: bool | None = None, expected: str | None = None,
                 workload: str | None = None) -> dict[str, Any]:
    """Record ``script`` (a tinygrad program defining ``main()``; ``args`` its command line) and return the trace as
    a JSON-ready dict, validated by ``mtlir.frontend.trace.parse_trace``.

    ``family``: the GPU family the kernels are rendered for (``"Apple7"``, ``"Apple9"``; default the device's,
    ``mtlir.tinygrad.configure``); ``tensor_cores``: whether tinygrad renders SIMD-group matrix code (default: off
    for Apple7, on otherwise, as examples/traces); ``expected``: the tinygrad device of the expected output
    (default ``expected_device()``); ``workload``: the trace's name (default the script's stem).

    Raises ``RecordError`` (exit 2 in the CLI) for a script that fails, has no ``main()``, or runs no kernel that
    writes its output, or when the METAL device is already open with another family (one process renders for one
    family); mtlir's own errors (an unsupported kernel, a GPU error) pass through."""
    from tinygrad.device import Device
    path = Path(script)
    if not path.is_file():
        raise RecordError(f"{path}: no such script")
    if family is not None:
        if "METAL" in Device._opened_devices and Device["METAL"].arch.lower() != family.lower():
            raise RecordError(f"the METAL device is open for {Device['METAL'].arch}: it cannot record {family} in "
                               "this process (run mtlir record once per family)")
        configure(family=family)
    family = SETTINGS.family
    tc = tensor_cores if tensor_cores is not None else family != "Apple7"
    dev: Any = Device["METAL"]
    rec = _Recorder(dev)
    metal.RECORDERS.append(rec)
    try:
        with _context(DEV="METAL", JIT=0, TC=int(tc)):
            out = _run_main(path, args)
        dev.synchronize()
    finally:
        metal.RECORDERS.remove(rec)
    ubuf = out.uop.buffer
    if not str(ubuf.device).startswith("METAL"):
        raise RecordError(f"{path}: main()'s Tensor is on {ubuf.device}, not METAL")
    mb: metal.MetalBuffer = ubuf._buf
    outb = rec.buffers.get(mb.buf.handle)
    if not rec.dispatches or outb is None:
        raise RecordError(f"{path}: no kernel of the recording wrote main()'s output (a Tensor made on the host "
                          "needs no GPU: compute something)")
    exp_dev = expected or expected_device()
    with _context(DEV=exp_dev, JIT=0):
        ref = _run_main(path, args)
    expected_bytes = ref.to("CPU" if exp_dev != "PYTHON" else exp_dev).numpy().tobytes()
    if len(expected_bytes) != mb.size:
        raise RecordError(f"{path}: the output on {exp_dev} has {len(expected_bytes)} bytes, on METAL {mb.size}")
    trace: dict[str, Any] = {
        "workload": workload or path.stem,
        "arch": family,
        "made_with": f"mtlir record of {path.name}: tinygrad on mtlir's METAL device (arch {family}, tensor cores "
                     f"{'on' if tc else 'off'}); expected output from tinygrad's {exp_dev} device",
        "variables": rec.variables,
        "buffers": {b.id: {"size": b.buf.nbytes, "init": None if b.init is None else
                           {"offset": 0, "b64": base64.b64encode(b.init).decode()}} for b in rec.buffers.values()},
        "programs": {p.key: {"function": p.function, "msl": p.msl, "signature": p.params}
                     for p in rec.programs.values()},
        "dispatches": rec.dispatches,
        "output": {"buffer": outb.id, "offset": mb.offset, "dtype": f"dtypes.{out.dtype.name}",
                   "shape": [int(s) for s in out.shape], "expected_b64": base64.b64encode(expected_bytes).decode()},
    }
    parse_trace(trace, str(path))
    return trace


def record(script: str | Path, args: Sequence[str] = (), output: str | Path | None = None, **kw: Any) -> dict[str, Any]:
    """``record_trace(script, args, **kw)``, written as JSON to ``output`` when given; returns the trace."""
    import json
    trace = record_trace(script, args, **kw)
    if output is not None:
        Path(output).write_text(json.dumps(trace, indent=1) + "\n")
    return trace

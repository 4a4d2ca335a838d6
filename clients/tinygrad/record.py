"""``mtlir.tinygrad.record``: run a tinygrad program on mtlir's METAL device and write the kernel queue it ran as a
trace (the format of examples/traces: docs/lowering.md, "Traces"; docs/tinygrad.md, "Recording"), with the expected
output computed by another tinygrad device (CPU, or PYTHON, tinygrad's emulator, which needs no compiler).

The script's convention: it defines ``main()`` returning the output ``Tensor`` (any dtype, any shape), built from
inputs made on the host (``Tensor(numpy_array)``, fixed seeds) so that two runs give the same inputs. ``record``
runs the script (as a module named ``__mtlir_record__``, ``sys.argv`` = ``[script, *args]``) twice: once on METAL
with every kernel call and host write captured (``mtlir.tinygrad.device.RECORDERS``), once on the expected device.

What the trace holds: every buffer a kernel touched, its bytes when first used (``init``, left out when all zero):
of a buffer made during the recording, the bytes the host wrote into it and, when its first kernel only writes it,
0xFF everywhere else (``POISON``: never the stale bytes tinygrad's buffer cache hands back, which could be the
answer itself); one program per distinct MSL source; one dispatch per eager kernel call (TinyJit is off while
recording: its batches run as eager calls); the variables of symbolic kernels with their bounds (a grid axis that is
exactly a variable is written as its name in ``grid_expr``; a variable in a more complex grid expression is narrowed
to its value); and the output (the buffer and byte offset of ``main()``'s result, copied into a buffer of its own by
a kernel when it is a constant or a view; its dtype in mtlir's names), refused when METAL's output and the expected
one differ. The script runs as ``python SCRIPT`` would run it (its folder first on ``sys.path``).
"""
from __future__ import annotations

import base64
import math
import os
import runpy
import shutil
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from mtlir.errors import ArgumentError, InputError, MtlirError
from mtlir.frontend.checks import param_dtype
from mtlir.frontend.trace import parse_trace
from mtlir.metal import FAMILIES
from mtlir.runtime.context import DeviceBuffer
from mtlir.tinygrad import device as metal
from mtlir.tinygrad.settings import SETTINGS, configure

__all__ = ["record", "record_trace", "RecordError", "expected_device"]


# up to this many times the tolerance, record calls a difference a rounding difference between the two devices
# rather than different inputs
_ROUNDING_FACTOR = 16


class RecordError(InputError):
    """The script cannot be recorded: it fails or ends the process (``os._exit``), has no ``main()``, returns no
    Tensor or one of no elements or of a dtype the trace format lacks, runs no kernel that writes its output, writes a
    buffer from the host after a kernel used it (the trace copies each buffer in once), or computes another output
    on METAL than on the expected device (an unseeded RNG); or the output file's folder does not exist."""


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


# the byte a recorded buffer holds where its first kernel writes before anything reads (and the host wrote nothing):
# a NaN of float16 and float32, -1 of every signed integer, the largest unsigned one, so that a kernel that does not
# write what it should is caught by the replay's comparison
POISON = 0xFF


@dataclass
class _Recorder:
    """The ``Recorder`` of ``mtlir.tinygrad.device``: keeps buffers (``trace``, in order of first use; ``buffers``
    the live ones by handle), programs (by MSL source), dispatches and variables of one recording of ``script``.

    A buffer tinygrad frees leaves ``buffers``: when its memory comes back (tinygrad's LRU cache hands it to a new
    Tensor) it is a new trace buffer. ``fresh``: the buffers allocated (or handed back) during the recording and not
    yet used by a kernel, each with the byte ranges the host wrote into it since. Their other bytes mean nothing (a
    new buffer's zeros, or what the cache's last Tensor left there, possibly the very answer of the kernel about to
    run): when the first kernel using such a buffer only writes it (tinygrad's ``ProgramInfo.ins``/``outs``), those
    bytes become ``POISON``, in the live buffer too (the recording sees what the replay will) and in the trace's
    ``init``; a buffer its first kernel reads, or one made before the recording, keeps its bytes."""

    dev: Any
    script: Path
    trace: list[_Buffer] = field(default_factory=list)
    buffers: dict[int, _Buffer] = field(default_factory=dict)
    fresh: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    programs: dict[str, _Program] = field(default_factory=dict)
    dispatches: list[dict[str, Any]] = field(default_factory=list)
    variables: dict[str, dict[str, int]] = field(default_factory=dict)

    def _buffer(self, buf: DeviceBuffer, read: bool | None) -> str:
        """The trace id of ``buf``, a new trace buffer at its first use; ``read``: whether this dispatch reads it
        (None: not known, the bytes are kept)."""
        b = self.buffers.get(buf.handle)
        if b is None:
            self.dev.ctx.synchronize()
            data = self.dev.ctx.read(buf, 0, buf.nbytes)
            host = self.fresh.pop(buf.handle, None)
            if host is not None and read is False:
                data = _poisoned(data, host)
                self.dev.ctx.write(buf, data)
            b = self.buffers[buf.handle] = _Buffer(str(len(self.trace) + 1), buf, data if any(data) else None)
            self.trace.append(b)
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
        info = _program_info()
        reads = _reads(info, bufs)
        args = [{"buffer": self._buffer(b.buf, reads.get(b.buf.handle)), "offset": b.offset, "size": b.size}
                for b in bufs]
        grid = [int(g) for g in global_size] + [1] * (3 - len(global_size))
        local = [int(t) for t in local_size] + [1] * (3 - len(local_size))
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
                narrowed.update(str(u.expr) for u in _nodes(size) if _is_variable(u))
        if exact != grid:
            d["grid_expr"] = exact
        for name, value in zip(names, values):
            lo, hi = (value, value) if name in narrowed or name not in bounds else bounds[name]
            old = self.variables.get(name)
            if old is not None and old["value"] != value:
                raise RecordError(f"{self.script}: variable {name!r} took two values ({old['value']}, then {value}) "
                                  "in one recording: a trace binds each variable once")
            self.variables[name] = {"value": value, "min": max(lo, old["min"]) if old else lo,
                                    "max": min(hi, old["max"]) if old else hi}
        self.dispatches.append(d)

    def alloc(self, opaque: metal.MetalBuffer) -> None:
        self.buffers.pop(opaque.buf.handle, None)
        self.fresh[opaque.buf.handle] = []

    def copyin(self, dest: metal.MetalBuffer) -> None:
        b = self.buffers.get(dest.buf.handle)
        if b is not None:
            raise RecordError(f"{self.script}: the script writes buffer {b.id} ({dest.buf.nbytes} bytes) from the host "
                              "after a kernel used it: a trace copies each buffer in once, before the first dispatch "
                              "(make every input before main() realizes anything)")
        host = self.fresh.get(dest.buf.handle)
        if host is not None:
            host.append((dest.offset, dest.offset + dest.size))

    def free(self, opaque: metal.MetalBuffer) -> None:
        self.buffers.pop(opaque.buf.handle, None)
        self.fresh.pop(opaque.buf.handle, None)


def _reads(info: Any, bufs: tuple[metal.MetalBuffer, ...]) -> dict[int, bool]:
    """Whether the kernel being called reads each buffer of ``bufs`` (by handle; two views of one buffer: read when
    either is), from tinygrad's ``ProgramInfo`` ``info``: ``bufs[k]`` is its parameter slot ``globals[k]``, read
    when the slot is in ``ins`` (a LOAD), only written when it is in ``outs`` alone (a STORE). Empty when ``info``
    does not say (not found, or another count of buffers): then nothing is known."""
    slots, ins = tuple(getattr(info, "globals", ())), set(getattr(info, "ins", ()))
    if len(slots) != len(bufs) or not hasattr(info, "outs"):
        return {}
    reads: dict[int, bool] = {}
    for slot, b in zip(slots, bufs):
        reads[b.buf.handle] = reads.get(b.buf.handle, False) or slot in ins
    return reads


def _poisoned(data: bytes, host: list[tuple[int, int]]) -> bytes:
    """``data`` (a buffer's bytes) with ``POISON`` in every byte outside the ranges ``host`` (byte start, end)."""
    out = bytearray([POISON]) * len(data)
    for start, end in host:
        out[start:end] = data[start:end]
    return bytes(out)


def _is_variable(u: Any) -> bool:
    """Whether tinygrad's UOp ``u`` is a variable (0.14: a PARAM of the ALU address space; older: DEFINE_VAR)."""
    return getattr(u.op, "name", "") in ("PARAM", "DEFINE_VAR") and hasattr(u, "expr")


def _nodes(u: Any) -> Any:
    """The nodes of tinygrad's UOp ``u`` (``toposort``: a method in tinygrad 0.14, a property before)."""
    return u.toposort() if callable(u.toposort) else u.toposort


def _variable_names(size: Any) -> list[str]:
    """The names of the variables a symbolic size (tinygrad's UOp) depends on (``UOp.variables()``, else its
    variable nodes); empty when tinygrad says none."""
    try:
        return [str(v.expr) for v in size.variables()]
    except Exception:  # another tinygrad: its nodes
        return [str(u.expr) for u in _nodes(size) if _is_variable(u)]


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


# the trace format's element type of each tinygrad dtype, by its struct format character (tinygrad's names are C's:
# "unsigned char"); bfloat16 has none (below); the fp8 types have no mtlir dtype
_TRACE_DTYPES = {"?": "bool", "b": "int8", "B": "uint8", "h": "int16", "H": "uint16", "i": "int32", "I": "uint32",
                 "q": "int64", "Q": "uint64", "e": "float16", "f": "float32", "d": "float64"}


def trace_dtype(dt: Any) -> str:
    """The trace's ``output.dtype`` (``"dtypes.uint8"``, ``"dtypes.float32"``, ``"dtypes.bfloat16"``) of tinygrad's
    DType ``dt``. Raises ``RecordError`` for a dtype the trace format has no element type for (the fp8 types)."""
    name = _TRACE_DTYPES.get(getattr(dt, "fmt", None) or "")
    if name is None and _is_bfloat16(dt):  # tinygrad names it "__bf16" and gives it no struct format
        name = "bfloat16"
    if name is None:
        raise RecordError(f"main()'s output is {dt}: the trace format has no such element type (bool, int8..uint64, "
                          "float16, bfloat16, float32): cast the output")
    return f"dtypes.{name}"


def _is_bfloat16(dt: Any) -> bool:
    return str(dt) == "dtypes.bfloat16"


def _output_bytes(t: Any, device: str) -> bytes:
    """The bytes of the realized Tensor ``t`` as they lie in its buffer (a bfloat16 Tensor's through a bitcast to
    uint16: tinygrad's ``numpy()`` gives float32 for it), read on ``device`` (CPU for METAL and CPU: tinygrad's
    own copy; PYTHON reads itself)."""
    from tinygrad.dtype import dtypes as tdt
    if _is_bfloat16(t.dtype):
        t = t.bitcast(tdt.uint16)
    data: bytes = t.to(device).numpy().tobytes()
    return data


def _plain_output(out: Any, script: Path) -> Any:
    """``out`` realized into a buffer of its own, its elements contiguous from its byte offset: a weak dtype (a
    Python number's) cast to its strong one; a view (a slice, a strided or broadcast view of a realized buffer) or a
    constant tinygrad folds copied by a kernel into a fresh buffer (an ``assign`` tinygrad cannot elide).
    Raises ``RecordError`` for an output of no elements."""
    from tinygrad.device import Device
    from tinygrad.dtype import strong_dtype
    from tinygrad.tensor import Tensor
    symbolic = [i for i, s in enumerate(out.shape) if not isinstance(s, int)]
    if symbolic:
        names = sorted({name for i in symbolic for name in _variable_names(out.shape[i])})
        raise RecordError(f"{script}: main()'s output has a symbolic shape (axis {', '.join(map(str, symbolic))} "
                          f"depends on {', '.join(names) or 'a variable'}): a trace's output has a fixed shape; "
                          "return a Tensor of fixed shape: pad it to the variable's maximum (t.pad(((0, MAX - v),))) "
                          "or shrink it to a number (t.shrink(((0, N),)))")
    if any(int(s) == 0 for s in out.shape):
        raise RecordError(f"{script}: main()'s output has shape {tuple(int(s) for s in out.shape)}: no elements "
                          "(a trace's output holds at least one)")
    if out.dtype != strong_dtype(out.dtype):
        out = out.cast(strong_dtype(out.dtype))
    done = out.contiguous().realize()
    if done.uop.has_buffer_identity():
        return done
    dev = out.device if isinstance(out.device, str) else Device.DEFAULT
    return Tensor.empty(*out.shape, dtype=out.dtype, device=dev).assign(out).realize()


def _no_process_exit(script: Path) -> Callable[[int], NoReturn]:
    """What ``os._exit`` is while ``script`` runs: it would end the process with nothing written; raises
    ``RecordError`` instead."""
    def refuse(status: int) -> NoReturn:
        raise RecordError(f"{script}: called os._exit({status}), ending the process before main() returned")
    return refuse


def _run_main(script: Path, args: Sequence[str]) -> Any:
    """Runs ``script`` and its ``main()`` as ``python SCRIPT`` would (``sys.argv`` = ``[script, *args]``, the
    script's folder first on ``sys.path``, so that it imports the modules beside it); returns the realized output
    Tensor (``_plain_output``). Afterwards ``sys.argv``, ``sys.path`` and ``os._exit`` are as before, and the
    modules the run imported from the script's folder are forgotten (the next run imports them afresh, their
    Tensors on its device). Raises ``RecordError``, also for a script calling ``os._exit`` (caught while it runs: it
    would end the process)."""
    from tinygrad.tensor import Tensor
    argv, exit_, path, modules = sys.argv, os._exit, list(sys.path), set(sys.modules)
    folder = script.resolve().parent
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(folder))
    setattr(os, "_exit", _no_process_exit(script))  # a function of the same call (status), typed apart
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
            return _plain_output(out, script)
        except MtlirError:  # mtlir's own (an unsupported kernel, a GPU error) keep their exit codes
            raise
        except SystemExit as e:
            raise RecordError(f"{script}: exited with status {e.code} before main() returned") from None
        except Exception as e:
            raise RecordError(f"{script}: {type(e).__name__}: {e}") from e
    finally:
        sys.argv, os._exit = argv, exit_
        sys.path[:] = path
        for name in _script_modules(set(sys.modules) - modules, folder, path):
            del sys.modules[name]


def _script_modules(names: set[str], folder: Path, path: list[str]) -> list[str]:
    """Of the modules ``names``, those loaded from a file in the script's ``folder`` (and not in a folder of the
    usual ``path`` inside it, such as a virtual environment's site-packages)."""
    others = [Path(p).resolve() for p in path if p and Path(p).resolve().is_relative_to(folder)]
    mine = []
    for name in names:
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file:
            continue
        where = Path(file).resolve()
        if where.is_relative_to(folder) and not any(where.is_relative_to(o) for o in others if o != folder):
            mine.append(name)
    return mine


def _check_agree(path: Path, out: Any, expected: bytes, exp_dev: str, bfloat_kernels: bool = False) -> None:
    """Refuses a recording whose METAL output differs from the expected device's beyond the tolerance of its dtype
    (``mtlir run``'s comparison, ``mtlir.cli.compare.compare_output``: a few ulp for half, rtol 1e-4 for float32,
    exact for integers): the replay would report a mismatch. Raises ``RecordError`` naming the largest error in
    the dtype's units in the last place and the tolerance; the cause it suggests depends on the size: within
    ``_ROUNDING_FACTOR`` times the tolerance the two devices round differently (the other expected device may agree), beyond that
    the inputs usually differ between the two runs (an unseeded ``Tensor.rand``)."""
    import numpy as np
    from mtlir.cli.compare import compare_output
    from mtlir.ir.dtypes import dtypes
    if _is_bfloat16(out.dtype):  # compared as bfloat16 (ml_dtypes), as ``mtlir run`` compares the replay
        bf16 = dtypes.to_numpy(dtypes.bfloat16)
        got = np.frombuffer(_output_bytes(out, "CPU"), dtype=bf16)
    else:
        got = out.numpy().reshape(-1)  # flat: a 0-d output (a scalar) compares as one element
    cmp = compare_output(got, np.frombuffer(expected, dtype=got.dtype))
    if cmp.match:
        return
    ulps = f", {cmp.max_ulp_err:.3g} ulp of {cmp.dtype}" if cmp.rtol and math.isfinite(cmp.max_ulp_err) else ""
    head = (f"{path}: the output on METAL differs from the one on {exp_dev} in {cmp.mismatches} of {got.size} "
            f"elements (max error {cmp.max_abs_err:g}{ulps}; tolerance {cmp.describe_tolerance()}): ")
    other = "PYTHON" if exp_dev.upper() == "CPU" else "CPU"
    if bfloat_kernels and exp_dev.upper() == "PYTHON":
        raise RecordError(head + "the recorded kernels compute in bfloat16, which tinygrad's PYTHON device does not "
                          "round after every operation as Metal does (mtlir does: docs/tinygrad.md), so a chain of "
                          "bfloat16 operations drifts apart; return a float32 output (.cast(dtypes.float32)) and "
                          "record it with --expected cpu, whose kernels compute bfloat16 as Metal does (only a "
                          "bfloat16 output is beyond its compiler here), or keep the bfloat16 chain short")
    if cmp.rtol and cmp.max_ulp_err * cmp.epsilon <= _ROUNDING_FACTOR * cmp.rtol:
        raise RecordError(head + "a rounding difference between the two devices (a math function computed to "
                          f"another precision); try --expected {other.lower()}")
    raise RecordError(head + "the two runs must compute the same; seed the RNG (Tensor.manual_seed) and make the "
                      "inputs deterministic")


_EXPECTED = ("CPU", "PYTHON")


def _checked_arguments(script: object, args: object, family: object, tensor_cores: object, expected: object,
                       workload: object) -> str | None:
    """The arguments of ``record_trace`` checked as the command line checks them, before anything runs; returns
    ``expected`` in capitals. Raises ``TypeError`` for a value of the wrong type (``args`` a str: it would be split
    into letters) and ``ArgumentError`` (a ``ValueError``) for an unknown family or expected device."""
    if not isinstance(script, (str, os.PathLike)):
        raise TypeError(f"record: script={script!r}: expected a path (str or Path)")
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence) or not all(isinstance(a, str) for a in args):
        hint = f" (write [{args!r}])" if isinstance(args, str) else ""
        raise TypeError(f"record: args={args!r}: expected the script's arguments as a list of str{hint}")
    if family is not None:
        if not isinstance(family, str):
            raise TypeError(f"record: family={family!r}: expected a GPU family name (str) or None")
        if family.lower() not in {f.lower() for f in FAMILIES}:
            raise ArgumentError(f"record: unknown GPU family {family!r}: expected one of {', '.join(FAMILIES)}")
    if tensor_cores is not None and not isinstance(tensor_cores, bool):
        raise TypeError(f"record: tensor_cores={tensor_cores!r}: expected True, False or None")
    if workload is not None and not isinstance(workload, str):
        raise TypeError(f"record: workload={workload!r}: expected a name (str) or None")
    if expected is None:
        return None
    if not isinstance(expected, str):
        raise TypeError(f"record: expected={expected!r}: expected a tinygrad device name (str) or None")
    if expected.upper() not in _EXPECTED:
        raise ArgumentError(f"record: expected={expected!r}: choose from {', '.join(map(repr, _EXPECTED))} (the "
                            "tinygrad device of the expected output)")
    return expected.upper()


def record_trace(script: str | Path, args: Sequence[str] = (), *, family: str | None = None,
                 tensor_cores: bool | None = None, expected: str | None = None,
                 workload: str | None = None) -> dict[str, Any]:
    """Record ``script`` (a tinygrad program defining ``main()``; ``args`` its command line) and return the trace as
    a JSON-ready dict, validated by ``mtlir.frontend.trace.parse_trace``.

    ``family``: the GPU family the kernels are rendered for (``"Apple7"``, ``"Apple9"``; default the device's,
    ``mtlir.tinygrad.configure``); ``tensor_cores``: whether tinygrad renders SIMD-group matrix code (default: off
    for Apple7, on otherwise, as examples/traces); ``expected``: the tinygrad device of the expected output
    (default ``expected_device()``); ``workload``: the trace's name (default the script's stem).

    Raises, before the script runs, ``TypeError`` for an argument of the wrong type (``args`` a str rather than a
    list of str) and ``ArgumentError`` (a ``ValueError``) for an unknown ``family`` or ``expected`` (CPU or PYTHON,
    any case); ``RecordError`` (exit 2 in the CLI) for a script that fails, has no ``main()``, or runs no kernel that
    writes its output, or when the METAL device is already open with another family (one process renders for one
    family); mtlir's own errors (an unsupported kernel, a GPU error) pass through."""
    from tinygrad.device import Device
    expected = _checked_arguments(script, args, family, tensor_cores, expected, workload)
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
    rec = _Recorder(dev, path)
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
    try:
        dtype = trace_dtype(out.dtype)
    except RecordError as e:
        raise RecordError(f"{path}: {e}") from None
    # a bfloat16 output's expected values come from the PYTHON device unless told otherwise: tinygrad's CPU device
    # cannot compile a kernel storing bfloat16 with Debian 12's clang (one computing in bfloat16 and storing float32
    # compiles)
    exp_dev = expected or ("PYTHON" if _is_bfloat16(out.dtype) else expected_device())
    with _context(DEV=exp_dev, JIT=0):
        try:
            ref = _run_main(path, args)
            expected_bytes = _output_bytes(ref, "CPU" if exp_dev != "PYTHON" else exp_dev)
        except Exception as e:
            if not _is_bfloat16(out.dtype) or exp_dev == "PYTHON":
                raise
            why = (str(e).splitlines()[0] if str(e) else type(e).__name__).removeprefix(f"{path}: ")
            raise RecordError(f"{path}: the expected output of a bfloat16 main() on tinygrad's {exp_dev} device "
                              f"failed ({why}): its compiler may not store bfloat16; try --expected python "
                              "(the default for a bfloat16 output)") from None
    if len(expected_bytes) != mb.size:
        raise RecordError(f"{path}: the output on {exp_dev} has {len(expected_bytes)} bytes, on METAL {mb.size}")
    _check_agree(path, out, expected_bytes, exp_dev,
                 bfloat_kernels=any("bfloat" in p.msl for p in rec.programs.values()))
    trace: dict[str, Any] = {
        "workload": workload or path.stem,
        "arch": family,
        "made_with": f"mtlir record of {path.name}: tinygrad on mtlir's METAL device (arch {family}, tensor cores "
                     f"{'on' if tc else 'off'}); expected output from tinygrad's {exp_dev} device",
        "variables": rec.variables,
        "buffers": {b.id: {"size": b.buf.nbytes, "init": None if b.init is None else
                           {"offset": 0, "b64": base64.b64encode(b.init).decode()}} for b in rec.trace},
        "programs": {p.key: {"function": p.function, "msl": p.msl, "signature": p.params}
                     for p in rec.programs.values()},
        "dispatches": rec.dispatches,
        "output": {"buffer": outb.id, "offset": mb.offset, "dtype": dtype,
                   "shape": [int(s) for s in out.shape], "expected_b64": base64.b64encode(expected_bytes).decode()},
    }
    parse_trace(trace, str(path))
    return trace


def record(script: str | Path, args: Sequence[str] = (), output: str | Path | None = None, **kw: Any) -> dict[str, Any]:
    """``record_trace(script, args, **kw)``, written as JSON to ``output`` when given; returns the trace. Raises,
    before recording, ``TypeError``/``ArgumentError`` for arguments ``record_trace`` refuses (checked first) and
    ``RecordError`` when ``output``'s folder does not exist or ``output`` is a folder."""
    import json
    if output is not None and not isinstance(output, (str, os.PathLike)):
        raise TypeError(f"record: output={output!r}: expected a path (str or Path) or None")
    _checked_arguments(script, args, kw.get("family"), kw.get("tensor_cores"), kw.get("expected"), kw.get("workload"))
    if output is not None and not Path(output).parent.is_dir():
        raise RecordError(f"output {output}: no folder {Path(output).parent} to write it in")
    if output is not None and Path(output).is_dir():
        raise RecordError(f"output {output}: is a folder, not a file")
    trace = record_trace(script, args, **kw)
    if output is not None:
        Path(output).write_text(json.dumps(trace, indent=1) + "\n")
    return trace

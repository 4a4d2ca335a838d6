"""Recorded kernel queues (the JSON format the traces of examples/traces are in: docs/lowering.md, "Traces").

``load_trace(path)`` reads and validates one trace; ``Trace.queue(device)`` builds its queue graph (every dispatch
an EXEC, sizes from ``grid_expr``/``threadgroup_expr`` as expressions of the trace's variables, then a signal of
the timeline); ``Trace.initial_data()`` gives the bytes link copies into each buffer. Every problem raises
``TraceError`` naming the field (``dispatches[3].args[1].offset``) and so the dispatch index; a field the format
(the recorder's README; docs/lowering.md, "Traces") does not list is refused too, so a typo is not silently ignored.

Loading keeps each buffer's recorded bytes and their offset, never a buffer-sized copy: a 4 GiB buffer costs nothing
until ``initial_data()`` is asked for full buffers (``initial_data(full=False)`` gives link ``(offset, bytes)``).
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtlir.ir.dtypes import DType, dtypes
from mtlir.errors import InputError
from mtlir.metal import FAMILIES, DeviceSpec, Kernel, KernelParam
from mtlir.msl import KernelSignatureError
from mtlir.frontend.nodes import MAX_BUFFER_BYTES, QueueError, buffer, timeline_value, view
from mtlir.frontend.checks import param_dtype
from mtlir.frontend.queue import Queue
from mtlir.ir.uop import UOp, gc_paused

__all__ = ["load_trace", "loads_trace", "parse_trace", "Trace", "TraceError", "TraceBuffer", "TraceVariable", "Dispatch",
           "BufferArg", "OutputSpec"]

# the fields of each object of the format (docs/lowering.md, "Traces"); anything else is refused. The format calls
# the kernels "programs" (the recorder's word): the code calls them kernels, keyed by their key (``Kernel.key``)
_TOP = frozenset({"workload", "arch", "made_with", "variables", "buffers", "programs", "dispatches", "output"})
_VARIABLE = frozenset({"value", "min", "max"})
_BUFFER = frozenset({"size", "init"})
_INIT = frozenset({"offset", "b64"})
_KERNEL = frozenset({"function", "msl", "signature"})
_DISPATCH = frozenset({"kernel", "grid", "threadgroup", "grid_expr", "threadgroup_expr", "args", "vars"})
_ARG = frozenset({"buffer", "offset", "size"})
_OUTPUT = frozenset({"buffer", "offset", "dtype", "shape", "expected_b64"})


class TraceError(InputError, ValueError):
    """A malformed trace; ``field`` is the JSON path of the bad field (``dispatches[2].grid[0]``)."""

    def __init__(self, field_path: str, problem: str, source: str = "") -> None:
        super().__init__(f"{source + ': ' if source else ''}{field_path}: {problem}")
        self.field = field_path
        self.problem = problem


@dataclass(frozen=True)
class TraceVariable:
    """A run-time variable: its recorded ``value`` and inclusive bounds ``[min, max]``."""

    name: str
    value: int
    min: int
    max: int

    def uop(self) -> UOp:
        """The variable as a DEFINE_VAR (int32, the type of ``constant int&``)."""
        return UOp.variable(self.name, self.min, self.max)


@dataclass(frozen=True)
class TraceBuffer:
    """A device buffer: ``size`` bytes; ``init`` the bytes copied in at byte ``init_offset`` (None: zeros)."""

    id: str
    size: int
    init: bytes | None = None
    init_offset: int = 0

    @property
    def placeholder(self) -> str:
        """The name of the placeholder link creates (``buffer:<id>``)."""
        return f"buffer:{self.id}"


@dataclass(frozen=True)
class BufferArg:
    """One buffer argument of a dispatch: ``size`` bytes of buffer ``buffer`` from byte ``offset``."""

    buffer: str
    offset: int
    size: int


@dataclass(frozen=True)
class Dispatch:
    """One recorded dispatch: ``kernel``, the key of its kernel in ``Trace.kernels``; sizes (grid in threadgroups,
    threadgroup in threads) at the recorded values, their expressions (an int or a variable name per axis), buffer
    args and variable values."""

    kernel: str
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    grid_expr: tuple[int | str, ...]
    threadgroup_expr: tuple[int | str, ...]
    args: tuple[BufferArg, ...]
    vars: tuple[int, ...]


@dataclass(frozen=True)
class OutputSpec:
    """The workload's output: ``shape`` elements of ``dtype`` in buffer ``buffer`` from byte ``offset``; the
    ``expected`` bytes (computed by another executor: compare with ~1e-4 relative / 1e-5 absolute tolerance)."""

    buffer: str
    offset: int
    dtype: DType
    shape: tuple[int, ...]
    expected: bytes

    @property
    def nbytes(self) -> int:
        """Bytes of the output: the elements of ``shape`` times the dtype's size."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def placeholder(self) -> str:
        """The name of the placeholder of the output's buffer (``buffer:<id>``)."""
        return f"buffer:{self.buffer}"

    def expected_array(self) -> Any:
        """The expected values as a numpy array of ``shape``."""
        import numpy as np
        return np.frombuffer(self.expected, dtype=dtypes.to_numpy(self.dtype)).reshape(self.shape)


@dataclass
class Trace:
    """A loaded trace. ``kernels`` by key (the format's ``programs``); ``buffers`` by id; ``variables`` by name;
    ``dispatches`` in queue order; ``arch`` the GPU family the kernels were rendered for (``Apple7``, ``Apple9``).
    ``unused_variables``: variables no dispatch uses (as a size or a kernel argument); ``unused_buffers``: buffer ids
    no dispatch binds and the output does not name. Both are accepted and noted here; unused buffers get no initial
    data (nothing would read it)."""

    workload: str
    arch: str
    kernels: dict[str, Kernel]
    buffers: dict[str, TraceBuffer]
    variables: dict[str, TraceVariable]
    dispatches: list[Dispatch]
    output: OutputSpec
    made_with: str = ""
    source: str = ""
    unused_variables: tuple[str, ...] = ()
    unused_buffers: tuple[str, ...] = ()
    _queue_cache: dict[DeviceSpec, UOp] = field(default_factory=dict, repr=False)

    @property
    def values(self) -> dict[str, int]:
        """The recorded value of every variable, by name (``{"start_pos": 11}``)."""
        return {v.name: v.value for v in self.variables.values()}

    def device(self) -> DeviceSpec:
        """The device the trace was recorded for: its ``arch``, with residency sets and ICB support."""
        return DeviceSpec(self.arch)

    def initial_data(self, full: bool = True) -> dict[str, Any]:
        """The initial contents of every buffer that has some, by placeholder name (``"buffer:1"``). ``full``: the
        whole buffer as bytes (``size`` bytes, zeros around the recorded bytes); else ``(offset, recorded bytes)``,
        which ``runtime.link`` writes at that offset into a buffer it created zeroed, so nothing buffer-sized is
        allocated here. Buffers without recorded bytes are left out (they start as zeros) in both forms."""
        out: dict[str, Any] = {}
        unused = set(self.unused_buffers)
        for bid, b in self.buffers.items():
            if b.init is None or bid in unused:
                continue
            if not full:
                out[b.placeholder] = (b.init_offset, b.init)
                continue
            data = bytearray(b.size)
            data[b.init_offset:b.init_offset + len(b.init)] = b.init
            out[b.placeholder] = bytes(data)
        return out

    def queue(self, device: DeviceSpec | None = None) -> UOp:
        """The queue graph of the trace for ``device`` (default: ``self.device()``): every dispatch an EXEC, then a
        signal of the timeline with the run-time value ``timeline``."""
        dev = device or self.device()
        if (got := self._queue_cache.get(dev)) is not None:
            return got
        with gc_paused():  # many nodes at once (mtlir.ir.uop.gc_paused)
            graph = self._build_queue(dev)
        self._queue_cache[dev] = graph
        return graph

    def _build_queue(self, dev: DeviceSpec) -> UOp:
        """The queue graph of ``queue`` for ``dev``, built. Raises ``TraceError`` naming the dispatch at fault."""
        q = Queue(dev)
        bufs = {bid: buffer(bid, b.size) for bid, b in self.buffers.items()}
        var_nodes = {name: v.uop() for name, v in self.variables.items()}
        for i, d in enumerate(self.dispatches):
            kernel = self.kernels[d.kernel]
            args = [bufs[a.buffer] if a.offset == 0 and a.size == self.buffers[a.buffer].size
                    else view(bufs[a.buffer], a.offset, a.size) for a in d.args]
            vals: list[UOp | int] = [var_nodes[p.var] if p.var in var_nodes else val
                                     for p, val in zip(kernel.var_params, d.vars)]
            grid = [var_nodes[e] if isinstance(e, str) else e for e in d.grid_expr]
            tg = [var_nodes[e] if isinstance(e, str) else e for e in d.threadgroup_expr]
            try:
                q.exec(kernel, args, vals, grid, tg)
            except QueueError as e:
                raise TraceError(f"dispatches[{i}]", str(e), self.source) from None
        q.signal(q.timeline, timeline_value())
        return q.submit()


# ---- parsing and validation


class _Reader:
    """Typed access to the JSON with errors naming the field path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> TraceError:
        return TraceError(path, problem, self.source)

    def fields(self, obj: Any, path: str, allowed: frozenset[str]) -> None:
        """Refuse a key of the object at ``path`` that the format does not list (a typo would be ignored)."""
        self.check(obj, path or "(top level)", dict)
        for key in obj:
            if key not in allowed:
                name = str(key) or "''"  # an empty key still names a field
                where = f"{path}.{name}" if path else name
                raise self.fail(where, f"unknown field {key!r}: the trace format (docs/lowering.md, \"Traces\") has "
                                       f"{', '.join(sorted(allowed))} here")

    def get(self, obj: Any, key: str, path: str, types: type | tuple[type, ...], optional: bool = False) -> Any:
        if not isinstance(obj, dict):
            raise self.fail(path, f"expected an object, got {type(obj).__name__}")
        if key not in obj:
            if optional:
                return None
            raise self.fail(f"{path}.{key}" if path else key, "missing field")
        return self.check(obj[key], f"{path}.{key}" if path else key, types)

    def check(self, val: Any, path: str, types: type | tuple[type, ...]) -> Any:
        ok = isinstance(val, types) and not (isinstance(val, bool) and bool not in _as_tuple(types))
        if not ok:
            names = " or ".join(t.__name__ for t in _as_tuple(types))
            raise self.fail(path, f"expected {names}, got {type(val).__name__} {str(val)[:40]!r}")
        return val

    def b64(self, text: Any, path: str) -> bytes:
        self.check(text, path, str)
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as e:
            raise self.fail(path, f"bad base64 ({e})") from None

    def sizes(self, val: Any, path: str) -> tuple[int, int, int]:
        self.check(val, path, list)
        if len(val) != 3:
            raise self.fail(path, f"expected 3 sizes (x, y, z), got {len(val)}")
        out = []
        for j, v in enumerate(val):
            self.check(v, f"{path}[{j}]", int)
            if v < 1:
                raise self.fail(f"{path}[{j}]", f"size {v} is below 1")
            out.append(v)
        return (out[0], out[1], out[2])


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


class _DuplicateKeys(dict[str, Any]):
    """A JSON object that repeated a key (``json`` would silently keep the last value): ``parse_trace`` refuses it,
    naming the object and the key."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json``'s ``object_pairs_hook``: a dict, or a ``_DuplicateKeys`` when a key repeats."""
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            return _DuplicateKeys(pairs, k)
        seen.add(k)
    return dict(pairs)


def _bad_char(text: str, names: bool) -> str | None:
    """The first character of ``text`` that a trace may not hold, or None: a lone surrogate anywhere (valid JSON,
    ``"\\ud800"``, but not Unicode text: printing it fails); in a name (a key, the workload, a function) also a
    control character or line break, which would break the one-line listing and error messages."""
    if text.isascii() and (not names or text.isprintable()):
        return None
    bad = {"Cs", "Cc", "Zl", "Zp"} if names else {"Cs"}
    return next((c for c in text if unicodedata.category(c) in bad), None)


def _check_text(r: _Reader, data: Any) -> None:
    """Refuse a duplicate key, a lone surrogate in any string and a control character in any key (every key is a
    field name or a name: a buffer id, a program key, a variable), naming the field. Iterative: nesting is as deep
    as the JSON's."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        obj, path = stack.pop()
        if isinstance(obj, dict):
            where = path or "(top level)"
            if isinstance(obj, _DuplicateKeys):
                raise r.fail(where, f"duplicate key {ascii(obj.key)}: a JSON object must not repeat a key (the "
                                    "last value would silently win)")
            for key in obj:
                if isinstance(key, str) and (c := _bad_char(key, names=True)) is not None:
                    raise r.fail(where, f"key {ascii(key)} holds the character {ascii(c)}: a name must be "
                                        "printable Unicode text on one line")
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in obj.items())
        elif isinstance(obj, list):
            stack.extend((v, f"{path}[{j}]") for j, v in enumerate(obj))
        elif isinstance(obj, str) and (c := _bad_char(obj, names=False)) is not None:
            raise r.fail(path, f"holds the character {ascii(c)}, a lone surrogate: not Unicode text")


def _name(r: _Reader, text: str, path: str) -> str:
    """``text``, a name printed on one line (the workload, a function, a parameter): refuses a control character or
    a line break."""
    if (c := _bad_char(text, names=True)) is not None:
        raise r.fail(path, f"{ascii(text[:40])} holds the character {ascii(c)}: a name must be printable Unicode "
                           "text on one line")
    return text


def _buffer_id(r: _Reader, raw: Any, path: str, buffers: dict[str, TraceBuffer]) -> str:
    """The id of the buffer an argument or the output names (an int, or a string that is a key of ``buffers``),
    quoted as written in the error when no buffer has it."""
    bid = str(r.check(raw, path, (int, str)))
    if bid not in buffers:
        known = ", ".join(repr(k) for k in list(buffers)[:8]) + (", ..." if len(buffers) > 8 else "")
        raise r.fail(path, f"unknown buffer {raw!r}: the trace's buffers are {known or 'none'}")
    return bid


def load_trace(path: str | Path) -> Trace:
    """Load and validate the trace at ``path``.

    Raises ``TraceError`` (naming the field and the dispatch index) for a malformed trace and ``OSError`` when the
    file cannot be read."""
    p = Path(path)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError("(file)", f"not a JSON trace: byte {e.start} is not UTF-8 text ({e.reason})",
                         str(p)) from None
    return loads_trace(text, str(p))


def loads_trace(text: str, source: str = "") -> Trace:
    """Parse and validate a trace's JSON ``text`` (``source`` names it in errors). Raises ``TraceError``: for text
    that is not JSON, JSON nested too deep, a key repeated in one object, and what ``parse_trace`` refuses."""
    try:
        data = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as e:
        raise TraceError("(file)", f"not valid JSON: {e}", source) from None
    except RecursionError:
        raise TraceError("(file)", "not a trace: JSON nested deeper than Python's recursion limit", source) from None
    return parse_trace(data, source)


def parse_trace(data: Any, source: str = "") -> Trace:
    """Validate a trace already parsed from JSON (a dict) and build the ``Trace``. Raises ``TraceError``."""
    r = _Reader(source)
    r.fields(data, "", _TOP)
    _check_text(r, data)
    workload = _name(r, r.get(data, "workload", "", str), "workload")
    if not workload:
        raise r.fail("workload", "an empty workload name")
    arch = r.get(data, "arch", "", str)
    if arch.lower() not in {f.lower() for f in FAMILIES}:
        raise r.fail("arch", f"unknown GPU family {arch!r}: expected one of {', '.join(FAMILIES)}")
    variables = _variables(r, r.get(data, "variables", "", dict))
    buffers = _buffers(r, r.get(data, "buffers", "", dict))
    kernels = _kernels(r, r.get(data, "programs", "", dict))
    raw_dispatches = r.get(data, "dispatches", "", list)
    if not raw_dispatches:
        raise r.fail("dispatches", "no dispatches: nothing produces the output")
    dispatches = [_dispatch(r, d, f"dispatches[{i}]", kernels, buffers, variables)
                  for i, d in enumerate(raw_dispatches)]
    output = _output(r, r.get(data, "output", "", dict), buffers)
    if output.buffer not in {a.buffer for d in dispatches for a in d.args}:
        raise r.fail("output.buffer", f"no dispatch binds buffer {output.buffer}: nothing produces the output")
    used = {e for d in dispatches for e in (*d.grid_expr, *d.threadgroup_expr) if isinstance(e, str)}
    used |= {p.var for d in dispatches for p in kernels[d.kernel].var_params if p.var is not None}
    bound = {a.buffer for d in dispatches for a in d.args} | {output.buffer}
    return Trace(workload=workload, arch=DeviceSpec(arch).family, kernels=kernels, buffers=buffers,
                 variables=variables, dispatches=dispatches, output=output,
                 made_with=_name(r, r.get(data, "made_with", "", str, optional=True) or "", "made_with"),
                 source=source,
                 unused_variables=tuple(name for name in variables if name not in used),
                 unused_buffers=tuple(bid for bid in buffers if bid not in bound))


def _variables(r: _Reader, raw: dict[str, Any]) -> dict[str, TraceVariable]:
    out = {}
    for name, v in raw.items():
        path = f"variables.{name}"
        r.fields(v, path, _VARIABLE)
        value, lo, hi = (r.get(v, k, path, int) for k in ("value", "min", "max"))
        if lo > hi:
            raise r.fail(path, f"min {lo} > max {hi}")
        if not lo <= value <= hi:
            raise r.fail(f"{path}.value", f"value {value} is outside its bounds [{lo}, {hi}]")
        if not (-2**31 <= lo and hi < 2**31):
            raise r.fail(path, "bounds must fit an int32 (a constant int& kernel parameter)")
        out[name] = TraceVariable(name, value, lo, hi)
    return out


def _buffers(r: _Reader, raw: dict[str, Any]) -> dict[str, TraceBuffer]:
    out = {}
    for bid, b in raw.items():
        path = f"buffers.{bid}"
        r.fields(b, path, _BUFFER)
        size = r.get(b, "size", path, int)
        if size < 1:
            raise r.fail(f"{path}.size", f"size {size} is below 1")
        if size > MAX_BUFFER_BYTES:
            raise r.fail(f"{path}.size", f"size {size} bytes is above 2**36 (64 GiB), more than any Apple GPU has: "
                                         f"buffer {bid} cannot be created")
        init = r.get(b, "init", path, (dict, type(None)))
        data, off = None, 0
        if init is not None:
            r.fields(init, f"{path}.init", _INIT)
            off = r.get(init, "offset", f"{path}.init", int)
            if off < 0:
                raise r.fail(f"{path}.init.offset", f"negative offset {off}")
            data = r.b64(r.get(init, "b64", f"{path}.init", str), f"{path}.init.b64")
            if off + len(data) > size:
                raise r.fail(f"{path}.init", f"{len(data)} bytes at offset {off} run past the end of the "
                                             f"{size}-byte buffer")
        out[str(bid)] = TraceBuffer(str(bid), size, data, off)
    return out


def _kernels(r: _Reader, raw: dict[str, Any]) -> dict[str, Kernel]:
    """The kernels of the format's ``programs`` object, by key."""
    out = {}
    for key, spec in raw.items():
        path = f"programs.{key}"
        r.fields(spec, path, _KERNEL)
        function = _name(r, r.get(spec, "function", path, str), f"{path}.function")
        msl = r.get(spec, "msl", path, str)
        if not msl.strip():  # no kernel for a device to build (it failed at link: "Metal returned nil")
            raise r.fail(f"{path}.msl", "empty MSL source: the program's kernel needs its MSL")
        params = []
        seen_var = False
        for j, entry in enumerate(r.get(spec, "signature", path, list)):
            ppath = f"{path}.signature[{j}]"
            r.check(entry, ppath, list)
            if not 3 <= len(entry) <= 4:
                raise r.fail(ppath, f"expected [name or null, parameter index, dtype, [elements]], got {len(entry)} "
                                    "entries")
            var = r.check(entry[0], f"{ppath}[0]", (str, type(None)))
            if var is not None:
                _name(r, var, f"{ppath}[0]")
            index = r.check(entry[1], f"{ppath}[1]", int)
            dt_name = r.check(entry[2], f"{ppath}[2]", str)
            elems = r.check(entry[3], f"{ppath}[3]", list) if len(entry) > 3 else []
            if index != j:
                raise r.fail(f"{ppath}[1]", f"parameter index {index}, expected {j} (parameters in order)")
            if var is None and seen_var:
                raise r.fail(ppath, "a buffer parameter after a variable (buffers come first)")
            seen_var = seen_var or var is not None
            try:
                dt = param_dtype(dt_name)
            except QueueError as e:
                raise r.fail(f"{ppath}[2]", str(e)) from None
            if len(elems) > 1:
                raise r.fail(f"{ppath}[3]", f"expected [elements] or [], got {len(elems)} entries")
            for count in elems:
                r.check(count, f"{ppath}[3][0]", int)
                if count < 1:
                    raise r.fail(f"{ppath}[3][0]", f"elements {count} is below 1")
            try:
                params.append(KernelParam(var, index, dt.name, elems[0] if elems else None))
            except ValueError as e:  # an empty variable name, an element type Metal does not have (double)
                raise r.fail(ppath, str(e)) from None
        try:
            out[key] = Kernel(key, function, msl, tuple(params))
        except KernelSignatureError as e:  # the signature disagrees with the MSL (docs/lowering.md, "Traces")
            raise r.fail(path if e.param is None else f"{path}.signature[{e.param}]", str(e)) from None
        except (TypeError, ValueError) as e:
            raise r.fail(path, str(e)) from None
    return out


def _dispatch(r: _Reader, d: Any, path: str, kernels: dict[str, Kernel], buffers: dict[str, TraceBuffer],
              variables: dict[str, TraceVariable]) -> Dispatch:
    r.fields(d, path, _DISPATCH)
    key = r.get(d, "kernel", path, str)
    kernel = kernels.get(key)
    if kernel is None:
        raise r.fail(f"{path}.kernel", f"unknown program {key!r}")
    grid = r.sizes(r.get(d, "grid", path, list), f"{path}.grid")
    tg = r.sizes(r.get(d, "threadgroup", path, list), f"{path}.threadgroup")
    gexpr = _size_expr(r, d, "grid_expr", path, grid, variables)
    texpr = _size_expr(r, d, "threadgroup_expr", path, tg, variables)
    raw_args = r.get(d, "args", path, list)
    if len(raw_args) != len(kernel.buffer_params):
        raise r.fail(f"{path}.args", f"program {key!r} takes {len(kernel.buffer_params)} buffers, got "
                                     f"{len(raw_args)}")
    args = []
    for j, a in enumerate(raw_args):
        apath = f"{path}.args[{j}]"
        r.fields(a, apath, _ARG)
        bid = _buffer_id(r, r.get(a, "buffer", apath, (int, str)), f"{apath}.buffer", buffers)
        off, size = r.get(a, "offset", apath, int), r.get(a, "size", apath, int)
        if off < 0:
            raise r.fail(f"{apath}.offset", f"offset {off} is negative")
        param = kernel.buffer_params[j]
        elem = param_dtype(param.dtype).itemsize or 1
        if off % elem:
            raise r.fail(f"{apath}.offset", f"offset {off} is not a multiple of the element size {elem} of "
                                            f"parameter {param.index} of {key!r} ({param.dtype}), METAL.md §1")
        if size < 1:
            raise r.fail(f"{apath}.size", f"size {size} is below 1")
        if param.elements is not None and size < param.elements * elem:
            raise r.fail(f"{apath}.size", f"size {size} bytes is below the {param.elements} elements of {param.dtype} "
                                          f"({param.elements * elem} bytes) that parameter {param.index} of {key!r} "
                                          f"takes (programs.{key}.signature): the kernel would read past the view")
        if off + size > buffers[bid].size:
            raise r.fail(apath, f"view [{off}, {off + size}) runs past the end of buffer {bid} "
                                f"({buffers[bid].size} bytes)")
        args.append(BufferArg(bid, off, size))
    vals = r.get(d, "vars", path, list)
    if len(vals) != len(kernel.var_params):
        raise r.fail(f"{path}.vars", f"program {key!r} takes {len(kernel.var_params)} variables "
                                     f"({', '.join(str(p.var) for p in kernel.var_params) or 'none'}), "
                                     f"got {len(vals)}")
    for j, (p, v) in enumerate(zip(kernel.var_params, vals)):
        r.check(v, f"{path}.vars[{j}]", int)
        var = variables.get(p.var or "")
        if var is not None and v != var.value:
            raise r.fail(f"{path}.vars[{j}]", f"value {v} of {p.var!r} differs from the variable's recorded value "
                                              f"{var.value}")
        if not -2**31 <= v < 2**31:
            raise r.fail(f"{path}.vars[{j}]", f"value {v} does not fit an int32")
    return Dispatch(key, grid, tg, gexpr, texpr, tuple(args), tuple(vals))


def _size_expr(r: _Reader, d: Any, key: str, path: str, sizes: tuple[int, int, int],
               variables: dict[str, TraceVariable]) -> tuple[int | str, ...]:
    raw = r.get(d, key, path, list, optional=True)
    if raw is None:
        return sizes
    epath = f"{path}.{key}"
    if len(raw) != 3:
        raise r.fail(epath, f"expected 3 entries (x, y, z), got {len(raw)}")
    for j, (e, s) in enumerate(zip(raw, sizes)):
        r.check(e, f"{epath}[{j}]", (int, str))
        if isinstance(e, str) and e not in variables:
            raise r.fail(f"{epath}[{j}]", f"{e!r} is not a variable of the trace: an entry is an int or the name of "
                                          f"a variable ({', '.join(map(repr, variables)) or 'there are none'})")
        if isinstance(e, str) and variables[e].min < 1:
            raise r.fail(f"{epath}[{j}]", f"variable {e!r} can be {variables[e].min}, a size below 1")
        at = variables[e].value if isinstance(e, str) else e
        if at != s:
            raise r.fail(f"{epath}[{j}]", f"{e!r} is {at} at the recorded values, but the size is {s}")
    return tuple(raw)


def _output(r: _Reader, o: dict[str, Any], buffers: dict[str, TraceBuffer]) -> OutputSpec:
    r.fields(o, "output", _OUTPUT)
    bid = _buffer_id(r, r.get(o, "buffer", "output", (int, str)), "output.buffer", buffers)
    off = r.get(o, "offset", "output", int)
    dt_name = r.get(o, "dtype", "output", str)
    try:
        dt = param_dtype(dt_name)
    except QueueError as e:
        raise r.fail("output.dtype", str(e)) from None
    shape = tuple(r.check(s, f"output.shape[{j}]", int) for j, s in enumerate(r.get(o, "shape", "output", list)))
    for j, extent in enumerate(shape):
        if extent < 1:  # two negative extents would multiply to a positive size
            raise r.fail(f"output.shape[{j}]", f"extent {extent} is below 1")
    expected = r.b64(r.get(o, "expected_b64", "output", str), "output.expected_b64")
    spec = OutputSpec(bid, off, dt, shape, expected)
    if len(expected) != spec.nbytes:
        raise r.fail("output.expected_b64", f"{len(expected)} bytes, but shape {list(shape)} of {dt.name} is "
                                            f"{spec.nbytes} bytes")
    if off < 0 or off + spec.nbytes > buffers[bid].size:
        raise r.fail("output", f"{spec.nbytes} bytes at offset {off} run past the end of buffer {bid}")
    return spec

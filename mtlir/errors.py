"""The errors mtlir raises on purpose: one family under ``MtlirError``.

Every exception class defined in mtlir derives from ``MtlirError``, through one of the roots below; the command
line's exit codes come from the roots (``mtlir.cli.report.exit_code``):

- ``InputError`` (exit 2): something the user gives or can change is wrong or missing: a flag (``UsageError``), a
  trace (``TraceError``), a queue (``QueueError``), a kernel whose parameters disagree with its MSL
  (``KernelSignatureError``), IR text (``ParseError``), a pass pipeline (``PipelineError``),
  a graph a pass refuses (``LoweringError``: ``VerifyError``, ``EncodeError``, ``AbiError``, ``LinearizeError``),
  MSL that does not compile (``KernelCompileError``; ``InvalidMslError`` where OpenCL's compiler says why at a place
  of the MSL), Graphviz's ``dot`` missing or failing (``GraphvizNotFoundError``, ``GraphvizError``), an argument of
  the Python API out of its range (``ArgumentError``: a variable's value, a timeline value no submit signals), a
  call the object's state refuses (``StateError``: a closed Session; ``DeviceClosedError``: a closed device).
- ``LinkError`` (exit 2): link could not make a device object (Metal answered nil, a function is missing, the
  initial data does not fit, the host cannot allocate a buffer).
- ``BridgeError`` (exit 2): a call the Bridge refuses (an unknown selector or object, an argument that does not
  fit the prototype), or no device to run on (``NoDeviceError``).
- ``DeviceError`` (exit 3): the GPU failed: a command buffer in status Error (``GPUExecutionError``), Metal's
  validation layer (``MetalValidationError``), a wait past its timeout (``WaitTimeoutError``), a fault of the
  simulated GPU (``GPUFault``, ``KernelAccessError``).
- ``UnsupportedError`` (exit 4): something valid that mtlir cannot do yet (``UnsupportedKernelError``,
  ``KernelBuildError``, ``GraphvizTimeoutError``: a picture ``dot`` cannot lay out within its timeout).

The others derive from ``MtlirError`` directly and say a bug, of mtlir or of the code calling it (exit 5): a
malformed Program (``ProgramError``), a rule set that is wrong (``RuleError``) or never ends
(``RewriteLoopError``), a value the Metal bridge failed to check (``Unfit``).

Where a class has a Python base of its own (``ValueError``, ``RuntimeError``, ``TypeError``) it keeps it, so
``except ValueError`` catches what it caught before. The classes of the roots and of the runtime live here; the
others live in the module that raises them (``TraceError`` in ``mtlir.frontend.trace``, ...). This module imports
nothing of mtlir.
"""
from __future__ import annotations

from typing import Self

__all__ = ["MtlirError", "InputError", "ArgumentError", "StateError", "LoweringError", "LinkError", "BridgeError",
           "NoDeviceError", "DeviceError", "WaitTimeoutError", "GPUExecutionError", "MetalValidationError", "KernelAccessError", "KernelCheckError", "UnsupportedError",
           "UnsupportedKernelError", "KernelCompileError", "InvalidMslError", "KernelBuildError",
           "DeviceClosedError"]

class MtlirError(Exception):
    """The base of every error mtlir raises on purpose. ``where`` is the place ``locate`` put in front of the
    message ("" until then)."""

    where: str = ""

    def locate(self, where: str) -> Self:
        """Put ``where`` (e.g. ``program 'k', kernel function 'k'``) in front of the message, once, and remember it
        in ``where``; returns the error itself, for ``raise e.locate(...)``."""
        if self.where:
            return self
        self.where = where
        if self.args:
            self.args = (f"{where}: {self.args[0]}", *self.args[1:])
        return self


# ---- the roots, by what the user can do about them (the CLI's exit codes)


class InputError(MtlirError):
    """Something the user gives or can change is wrong or missing (a flag, a trace, a queue, IR text, a pass
    pipeline, MSL, a program mtlir runs); the message names it. The CLI exits with 2."""


class ArgumentError(InputError, ValueError):
    """A value given to mtlir's Python API is outside its range or names nothing: a variable's value outside its
    bounds, a variable or buffer that does not exist, a timeline value no submit signals, an unknown target. The
    message names the argument and what it may be. The CLI exits with 2."""


class StateError(InputError, RuntimeError):
    """A call that the object's state does not allow (a submit or a wait on a closed Session); the message names
    the object and its state. The CLI exits with 2."""


class DeviceClosedError(StateError):
    """A call to a device after its ``close()`` (``SimDevice.close()``): a message or C call to it, or a Session's
    or DeviceContext's submit, wait or read on it. The message names the device and the call. The CLI exits
    with 2."""


class LoweringError(InputError, ValueError):
    """A pass refuses the graph it is given (the verifier, encode, abi, linearize); the message names the pass and
    the node or command. The CLI exits with 2."""


class LinkError(MtlirError, RuntimeError):
    """link() could not create a device object (nil from Metal, a missing function, bad initial data). The CLI
    exits with 2."""


class BridgeError(MtlirError, RuntimeError):
    """A call a Bridge refuses: unknown selector or object, an argument that does not fit the prototype (a
    64-bit value cut to 32 bits, an MTLSize by value on arm64), a call into freed memory. The CLI exits with 2."""


class NoDeviceError(BridgeError):
    """There is no device to run on: Metal is not on this machine, or the simulated device finds no OpenCL platform,
    no OpenCL device or no pyopencl; the message says what to install. The CLI exits with 2."""


class DeviceError(MtlirError, RuntimeError):
    """The GPU (real or simulated) failed while it ran the Program. The CLI exits with 3."""


class WaitTimeoutError(DeviceError, TimeoutError):
    """A wait on the device passed its timeout (a timeline value, a command buffer, a kernel, a queue at its
    in-flight limit); the message says what was awaited and where it stands. Every wait mtlir makes has a timeout.
    The CLI exits with 3."""


class UnsupportedError(MtlirError):
    """Something valid that mtlir cannot do yet; the message names it. The CLI exits with 4."""


# ---- the device's errors


class MetalValidationError(DeviceError):
    """Misuse of Metal caught at the offending call, as Metal's API validation layer (MTL_DEBUG_LAYER=1) does;
    the message is Metal's where it is known (METAL.md §3)."""


class GPUExecutionError(DeviceError):
    """A command buffer ended in status Error: ``code`` is the MTLCommandBufferError value, ``name`` its name;
    where the Session knows them, ``submit`` (its index), ``command_buffer`` (the failed one's cbslots slot) and
    ``command_buffers`` (slot -> final status of every command buffer of that submit: ``"Completed"`` ran,
    ``"Error (Timeout)"`` failed, ``"Committed"``/``"Scheduled"`` still in flight at the wait's timeout)."""

    def __init__(self, message: str, code: int, name: str, *, submit: int | None = None,
                 command_buffer: int | None = None, command_buffers: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.submit, self.command_buffer = submit, command_buffer
        self.command_buffers = dict(command_buffers or {})

    def details(self) -> dict[str, object]:
        """The fields above for a JSON report (``mtlir run --json``): code, name, and what the Session knew."""
        out: dict[str, object] = {"code": self.code, "name": self.name}
        if self.submit is not None:
            out["submit"] = self.submit
        if self.command_buffer is not None:
            out["command_buffer"] = self.command_buffer
        if self.command_buffers:
            out["command_buffers"] = {str(k): v for k, v in sorted(self.command_buffers.items())}
        return out


class KernelAccessError(DeviceError):
    """A kernel reached memory outside the MTLBuffer bound to one of its parameters; the simulated device's bounds
    checks skipped the access (docs/kernels.md) and this reports the first one. ``function`` is the kernel,
    ``param`` the parameter's MSL name and ``index`` its Metal buffer index, ``write`` whether it was a store,
    ``offset`` the access's byte offset from the start of the parameter's view (negative: before it),
    ``element`` that offset in elements of the parameter's type (None when the element size is unknown),
    ``size`` the bytes accessed, ``buffer_bytes`` the MTLBuffer's length and ``view_offset`` where the view
    starts in it. Metal reports such an access as a GPU fault (PageFault) or, within the allocation's pages, not
    at all. ``memory`` is ``buffer``, or ``threadgroup``/``thread`` for an access past one of the kernel's own
    fixed-size arrays (then ``param`` names the array, ``index`` is -1 and ``offset`` counts from its start)."""

    def __init__(self, message: str, *, function: str, param: str, index: int, write: bool, offset: int,
                 element: int | None, size: int, buffer_bytes: int, view_offset: int, memory: str = "buffer") -> None:
        super().__init__(message)
        self.function, self.param, self.index, self.write = function, param, index, write
        self.offset, self.element, self.size = offset, element, size
        self.buffer_bytes, self.view_offset, self.memory = buffer_bytes, view_offset, memory


class KernelCheckError(DeviceError):
    """Checked mode (``SimDevice(checked=True)``, ``mtlir run --check-kernels``): Oclgrind ran a kernel translated
    without mtlir's bounds checks and reported a problem (docs/simulator.md "Checked kernels"). ``function`` is the
    kernel, ``kind`` the problem (``out-of-bounds read``, ``out-of-bounds write``, ``data race``, ...), ``msl_line``
    the line of the kernel's MSL it happened at (None when Oclgrind names no line that comes from the MSL),
    ``report`` Oclgrind's own text. The CLI exits with 3, as for the GPU fault the access would be on Metal."""

    def __init__(self, message: str, *, function: str, kind: str, msl_line: int | None, report: str) -> None:
        super().__init__(message)
        self.function, self.kind, self.msl_line, self.report = function, kind, msl_line, report


# ---- kernels the simulated device compiles


class KernelCompileError(InputError, RuntimeError):
    """A kernel's MSL could not be compiled: MSL that is not valid at the token level, a missing kernel function,
    or (``KernelBuildError``) an OpenCL build failure of its translation."""


class UnsupportedKernelError(UnsupportedError, RuntimeError):
    """MSL the simulated device cannot translate yet; ``construct`` names it (e.g. ``simdgroup_float8x8``)."""

    def __init__(self, message: str, construct: str = "") -> None:
        super().__init__(message)
        self.construct = construct


class InvalidMslError(KernelCompileError):
    """OpenCL's compiler rejected the translation of MSL ``kernels`` at places that all come from the MSL itself (a
    missing ``;``, an undeclared identifier): the MSL is invalid, the user's to fix (the CLI exits with 2).
    ``errors`` are ``(MSL line, MSL column, text)``; ``summary`` the first of them in one line; ``quote`` that MSL
    line with a caret under the column, as clang shows it; ``log`` and ``source`` OpenCL's build log and the
    translation. ``mtlir.runtime.sim.kernels.buildlog.build_error`` makes one."""

    def __init__(self, message: str, *, kernels: tuple[str, ...], log: str, source: str,
                 errors: list[tuple[int | None, int | None, str]], summary: str, quote: str) -> None:
        super().__init__(message)
        self.kernels, self.log, self.source = tuple(kernels), log, source
        self.errors, self.summary, self.quote = errors, summary, quote

    def locate(self, where: str) -> Self:
        """``MtlirError.locate``, for the one-line ``summary`` too."""
        if not self.where:
            self.summary = f"{where}: {self.summary}"
        return super().locate(where)


class KernelBuildError(KernelCompileError, UnsupportedError):
    """OpenCL could not build the translation of MSL ``kernels``: the simulated device cannot run them. Either the
    MSL is invalid or it uses something the translator does not handle; from the translation alone the two cannot
    be told apart, so the simulated device raises this (an ``UnsupportedError``: the CLI exits with 4) rather than
    answer as Metal would.

    ``log`` is OpenCL's whole build log and ``source`` the translated OpenCL C; ``errors`` the compiler's errors
    as ``(line, column, text)`` in the translation (line and column None when the log gives none); ``summary`` one
    line saying what failed (what the CLI prints). ``message`` is the whole text (``summary``, then the first
    errors with their lines of the translation); ``mtlir.runtime.sim.kernels.buildlog.build_error`` reads a build
    log into one."""

    def __init__(self, message: str, *, kernels: tuple[str, ...], log: str, source: str,
                 errors: list[tuple[int | None, int | None, str]], summary: str) -> None:
        super().__init__(message)
        self.kernels, self.log, self.source = tuple(kernels), log, source
        self.errors = errors
        self.summary = summary

    def locate(self, where: str) -> Self:
        """``MtlirError.locate``, for the one-line ``summary`` too."""
        if not self.where:
            self.summary = f"{where}: {self.summary}"
        return super().locate(where)

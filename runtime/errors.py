"""Errors the runtime and the devices raise."""
from __future__ import annotations

__all__ = ["BridgeError", "MetalValidationError", "GPUExecutionError", "UnsupportedKernelError", "LinkError",
           "KernelCompileError", "KernelBuildError", "KernelAccessError"]


class BridgeError(RuntimeError):
    """A call a Bridge refuses: unknown selector or object, an argument that does not fit the prototype (a
    64-bit value cut to 32 bits, an MTLSize by value on arm64), a call into freed memory."""


class MetalValidationError(RuntimeError):
    """Misuse of Metal caught at the offending call, as Metal's API validation layer (MTL_DEBUG_LAYER=1) does;
    the message is Metal's where it is known (METAL.md §3)."""


class GPUExecutionError(RuntimeError):
    """A command buffer ended in status Error: ``code`` is the MTLCommandBufferError value, ``name`` its name."""

    def __init__(self, message: str, code: int, name: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name


class UnsupportedKernelError(RuntimeError):
    """MSL the simulated device cannot translate yet; ``construct`` names it (e.g. ``simdgroup_float8x8``)."""

    def __init__(self, message: str, construct: str = "") -> None:
        super().__init__(message)
        self.construct = construct


class KernelCompileError(RuntimeError):
    """A kernel's MSL could not be compiled: MSL that is not valid at the token level, a missing kernel function,
    or (``KernelBuildError``) an OpenCL build failure of its translation."""


class KernelBuildError(KernelCompileError):
    """OpenCL could not build the translation of MSL ``kernels``: the simulated device cannot run them. Either the
    MSL is invalid or it uses something the translator does not handle; from the translation alone the two cannot
    be told apart, so the simulated device raises this (the CLI exits with 4) rather than answer as Metal would.
    ``log`` is OpenCL's build log, ``source`` the translated OpenCL C; ``summary`` is one line for the CLI."""

    def __init__(self, kernels: tuple[str, ...], log: str, source: str) -> None:
        self.kernels, self.log, self.source = tuple(kernels), log, source
        first = next((line.strip() for line in log.splitlines() if "error" in line.lower()), log.strip()[:200])
        names = ", ".join(self.kernels) or "(none)"
        self.summary = (f"the simulated device could not build the OpenCL translation of kernel(s) {names}: the MSL "
                        f"may be invalid or use something the translator does not handle (docs/kernels.md): "
                        f"{' '.join(first.split())}")
        numbered = "\n".join(f"{n + 1:4d}  {line}" for n, line in enumerate(source.splitlines()))
        super().__init__(f"OpenCL could not build the translation of kernels {names} (the MSL may be invalid or use "
                         f"something the translator does not handle):\n{log}\n--- translated source ---\n{numbered}")


class KernelAccessError(RuntimeError):
    """A kernel reached memory outside the MTLBuffer bound to one of its parameters; the simulated device's bounds
    checks skipped the access (docs/kernels.md) and this reports the first one. ``function`` is the kernel,
    ``param`` the parameter's MSL name and ``index`` its Metal buffer index, ``write`` whether it was a store,
    ``offset`` the access's byte offset from the start of the parameter's view (negative: before it),
    ``element`` that offset in elements of the parameter's type (None when the element size is unknown),
    ``size`` the bytes accessed, ``buffer_bytes`` the MTLBuffer's length and ``view_offset`` where the view
    starts in it. Metal reports such an access as a GPU fault (PageFault) or, within the allocation's pages, not
    at all."""

    def __init__(self, message: str, *, function: str, param: str, index: int, write: bool, offset: int,
                 element: int | None, size: int, buffer_bytes: int, view_offset: int) -> None:
        super().__init__(message)
        self.function, self.param, self.index, self.write = function, param, index, write
        self.offset, self.element, self.size = offset, element, size
        self.buffer_bytes, self.view_offset = buffer_bytes, view_offset


class LinkError(RuntimeError):
    """link() could not create a device object (nil from Metal, a missing function, bad initial data)."""

"""Errors the runtime and the devices raise."""
from __future__ import annotations

__all__ = ["BridgeError", "MetalValidationError", "GPUExecutionError", "UnsupportedKernelError", "LinkError",
           "KernelCompileError"]


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
    """A kernel's translated source did not compile (the OpenCL build log is in the message)."""


class LinkError(RuntimeError):
    """link() could not create a device object (nil from Metal, a missing function, bad initial data)."""

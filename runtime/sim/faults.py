"""GPUFault: what ends a simulated command buffer in status Error, and the NSError text Metal gives it.

A ``GPUFault`` carries the ``MTLCommandBufferError`` code, what happened, and the rule of METAL.md §3 it comes from;
the GPU (``gpu.GPU._finish``) turns it into the command buffer's ``error`` (``description``: the
``localizedDescription`` in the shape Metal prints). Raised by the execution of a command buffer (``executor``), the
dispatch checks (``dispatch``), the watchdog (``gpu``) and injected faults (``injection``).
"""
from __future__ import annotations

from mtlir.errors import DeviceError
from mtlir.metal import MTL
from mtlir.runtime.sim.rules.rule import Rule

__all__ = ["GPUFault", "ERROR_TEXT"]

# localizedDescription texts in the shape Metal prints (kIOGPUCommandBufferCallbackError... names)
ERROR_TEXT = {1: "Internal Error", 2: "Caused GPU Timeout Error", 3: "Caused GPU Address Fault Error",
              7: "Not Permitted", 8: "Insufficient Memory", 9: "Invalid Resource"}


class GPUFault(DeviceError):
    """A fault that ends a command buffer in status Error: ``code`` (MTLCommandBufferError), what happened,
    and the rule of METAL.md §3 it comes from (None: none, e.g. an injected fault)."""

    def __init__(self, code: int, message: str, rule: Rule | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.rule = code, message, rule

    def description(self) -> str:
        """The NSError localizedDescription for this fault."""
        name = MTL.ERROR_NAMES.get(self.code, str(self.code))
        text = ERROR_TEXT.get(self.code, name)
        tail = f" ({self.rule.citation})" if self.rule is not None else ""
        return (f"Execution of the command buffer was aborted due to an error during execution. {text} "
                f"({self.code:08x}:kIOGPUCommandBufferCallbackError{name}): {self.message}{tail}")

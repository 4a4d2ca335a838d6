"""The rules of METAL.md §3 as data, and the two ways the simulated device reports a broken one.

``violation`` builds the ``MetalValidationError`` strict mode raises at the offending call (what Metal's API
validation layer, ``MTL_DEBUG_LAYER=1``, does); ``assertion`` builds the one both modes raise where Metal asserts
even without the layer (a driver assert aborts the process on a Mac). Both messages end with the rule's number so a
reader can look it up in METAL.md §3. GPU faults are not raised: they end a command buffer in status Error
(``gpu.GPUFault``).
"""
from __future__ import annotations

from typing import Any

from mtlir.runtime.errors import MetalValidationError

__all__ = ["RULES", "Call", "violation", "assertion", "rule_text"]

RULES: dict[int, str] = {
    1: "one open encoder per command buffer",
    2: "every encoder gets endEncoding before it is released",
    3: "commit, encodeSignalEvent:value:, encodeWaitForEvent:value: only with no open encoder",
    4: "nothing after commit",
    5: "status only moves forward; error is nil unless Error; GPU times are 0.0 until Completed",
    6: "a failed command buffer skips its event signals",
    7: "at most maxCommandBufferCount command buffers in flight; commandBuffer then blocks",
    8: "ICB limits: command index, range, bind index, 32-bit offsets, offset alignment",
    9: "ICB commands without setBarrier run concurrently: overlapping bytes are a data race",
    10: "everything a kernel reaches must be resident (residency set or useResources)",
    11: "fences: wait before update within one encoder",
    12: "shared events only increase; a waiter wakes when value >= target",
    13: "threadsPerThreadgroup at most the pipeline's maxTotalThreadsPerThreadgroup",
    14: "a buffer freed while a command buffer that uses it is in flight",
    15: "the CPU must not change ICB commands or argument bytes a committed command buffer reads",
    16: "pre-Apple9: an ICB command's pipeline must be bound on the encoder first",
}


class Call:
    """A message as errors name it (``setKernelBuffer:buf offset:256 atIndex:0 on MTLIndirectComputeCommand ...``),
    formatted only when an error is raised: handlers build one per call, so it must cost next to nothing."""

    __slots__ = ("selector", "receiver", "args")

    def __init__(self, selector: str, receiver: Any, *args: Any) -> None:
        self.selector, self.receiver, self.args = selector, receiver, args

    def __str__(self) -> str:
        parts = self.selector.split(":")[:-1]
        if not parts:
            text = self.selector
        else:
            text = " ".join(f"{p}:{_short(a)}" for p, a in zip(parts, self.args))
        return f"{text} on {self.receiver.describe()}"


def _short(value: Any) -> str:
    handle = getattr(value, "handle", None)
    return f"{value.objc_class} {handle:#x}" if isinstance(handle, int) else str(value)


def rule_text(rule: int) -> str:
    """``"METAL.md §3 rule N: <summary>"``; rule 0 is Metal API validation outside the numbered rules."""
    if rule == 0:
        return "Metal API validation"
    return f"METAL.md §3 rule {rule}: {RULES[rule]}"


def violation(rule: int, call: object, message: str) -> MetalValidationError:
    """The error strict mode raises at ``call`` (a selector and its receiver) for breaking ``rule``."""
    return MetalValidationError(f"{call}: {message} ({rule_text(rule)})")


def assertion(rule: int, call: object, message: str) -> MetalValidationError:
    """The error both modes raise where Metal's driver asserts: ``failed assertion `message'``."""
    return MetalValidationError(f"{call}: failed assertion `{message}' ({rule_text(rule)})")

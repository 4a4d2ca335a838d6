"""Metal's rules (METAL.md §3) as the ``Rule`` enumeration, and the two ways the simulated device reports a broken one.

Each ``Rule`` has its number in METAL.md §3, the short ``summary`` every message cites and the rule's ``text`` as
METAL.md §3 states it (tests/runtime/sim/rules/test_rule.py keeps the two in step). ``Rule.API_VALIDATION`` (number 0)
stands for what Metal's API validation refuses outside the numbered rules.

``violation`` builds the ``MetalValidationError`` strict mode raises at the offending call (what Metal's API
validation layer, ``MTL_DEBUG_LAYER=1``, does); ``assertion`` builds the one both modes raise where Metal asserts
even without the layer (a driver assert aborts the process on a Mac). Both messages end with the rule's citation
(``METAL.md §3 rule N: <summary>``) so a reader can look it up. GPU faults are not raised: they end a command buffer
in status Error (``faults.GPUFault``).
"""
from __future__ import annotations

from enum import Enum
from typing import Any

from mtlir.errors import MetalValidationError

__all__ = ["Rule", "Call", "violation", "assertion"]


class Rule(Enum):
    """A rule of METAL.md §3: ``number`` (its number there; 0 for API validation outside the numbered rules),
    ``summary`` (what messages cite), ``text`` (METAL.md §3's wording, whitespace collapsed). ``Rule(n)`` is rule
    ``n``."""

    number: int
    summary: str
    text: str

    API_VALIDATION = (0, "Metal API validation", "Metal's API validation outside the numbered rules.")
    ONE_OPEN_ENCODER = (1, "one open encoder per command buffer",
                        "A command buffer has at most one open encoder at a time.")
    END_ENCODING_BEFORE_RELEASE = (2, "every encoder gets endEncoding before it is released",
                                   "Every encoder is ended with `endEncoding` before it is released.")
    NO_OPEN_ENCODER = (3, "commit, encodeSignalEvent:value:, encodeWaitForEvent:value: only with no open encoder",
                       "`commit`, `encodeSignalEvent:value:` and `encodeWaitForEvent:value:` need no open encoder.")
    NOTHING_AFTER_COMMIT = (4, "nothing after commit",
                            "After `commit` nothing more may be encoded or committed on that command buffer.")
    STATUS_FORWARD = (5, "status only moves forward; error is nil unless Error; GPU times are 0.0 until "
                         "Completed",
                      "Status only moves forward (NotEnqueued → Enqueued → Committed → Scheduled → Completed, or → "
                      "Error); `error` is nil unless the status is Error; GPU times are 0.0 until Completed.")
    FAILED_SKIPS_SIGNALS = (6, "a failed command buffer skips its event signals",
                            "A failed command buffer skips its encoded event signals, so a host waiting on the event "
                            "waits forever unless the runtime checks the command buffer's status (MLX signals the "
                            "event itself; tinygrad's lowered path does not).")
    IN_FLIGHT_LIMIT = (7, "at most maxCommandBufferCount command buffers in flight; commandBuffer then blocks",
                       "At most maxCommandBufferCount command buffers are in flight; `commandBuffer` blocks until one "
                       "completes.")
    ICB_LIMITS = (8, "ICB limits: command index, range, bind index, 32-bit offsets, offset alignment",
                  "ICB bounds: command index < maxCommandCount; the range of `executeCommandsInBuffer:withRange:` "
                  "inside the ICB and at most 16,384 long; kernel buffer index < maxKernelBufferBindCount (at most "
                  "31); offsets are stored in 32 bits, so larger ones break silently (tinygrad PRs #15129, #15156); "
                  "offsets aligned as in §1.")
    ICB_RACE = (9, "ICB commands without setBarrier run concurrently: overlapping bytes are a data race",
                "ICB commands run concurrently unless `setBarrier` is set: two commands touching overlapping bytes "
                "without a barrier race.")
    RESIDENCY = (10, "everything a kernel reaches must be resident (residency set or useResources)",
                 "Everything a kernel reaches must be resident — in a residency set committed before the command "
                 "buffer commits, or named in `useResources` on that encoder — otherwise the GPU faults with "
                 "InvalidResource (9). Pipelines are not resources and may not be listed.")
    FENCE_ORDER = (11, "fences: wait before update within one encoder",
                   "Fences: within one encoder a wait comes before an update; waits act at the encoder's start, "
                   "updates at its end; updating and then waiting on one fence in one encoder deadlocks.")
    EVENT_ONLY_INCREASES = (12, "shared events only increase; a waiter wakes when value >= target",
                            "Shared events only move up: a smaller value is ignored; a waiter wakes when the value "
                            "reaches its target.")
    THREADGROUP_LIMIT = (13, "threadsPerThreadgroup at most the pipeline's maxTotalThreadsPerThreadgroup",
                         "A dispatch whose threadgroup has more threads than the pipeline's "
                         "maxTotalThreadsPerThreadgroup is silently dropped (ml-explore/mlx PR #4018); a zero-size "
                         "dispatch is accepted and does nothing.")
    FREED_IN_FLIGHT = (14, "a buffer or pipeline freed while a command buffer that uses it is in flight",
                       "Freeing a buffer or pipeline that an in-flight command buffer uses and does not retain (one "
                       "reached only through ICB commands) ends that command buffer with InvalidResource (9).")
    CPU_WRITE_IN_FLIGHT = (15, "the CPU must not change ICB commands or argument bytes a committed command buffer "
                               "reads",
                           "The CPU writes ICB commands and argument bytes directly (shared storage): changing them "
                           "while a committed command buffer that reads them has not completed is a race. "
                           "(tinygrad's graph runner waits for the previous command buffer before patching.)")
    ICB_PIPELINE_WARMUP = (16, "pre-Apple9: an ICB command's pipeline must be bound on the encoder first",
                           "On pre-Apple9 families an ICB command whose pipeline was not bound on the encoder first "
                           "(the warm-up of §1 step 5) faults the GPU: status Error, InvalidResource (9).")
    DEADLOCK = (17, "an event wait that only work it blocks can signal deadlocks",
                "An `encodeWaitForEvent:value:` whose value only work it blocks can signal — a command buffer behind "
                "it on its queue, or a cycle of such waits across queues — never ends: Metal hangs until the GPU "
                "watchdog ends the command buffers (Error, Timeout (2)).")

    def __new__(cls, number: int, summary: str, text: str) -> Rule:
        rule = object.__new__(cls)
        rule._value_ = number
        rule.number, rule.summary, rule.text = number, summary, text
        return rule

    @property
    def citation(self) -> str:
        """``"METAL.md §3 rule N: <summary>"`` as messages end; ``"Metal API validation"`` for ``API_VALIDATION``."""
        if self is Rule.API_VALIDATION:
            return self.summary
        return f"METAL.md §3 rule {self.number}: {self.summary}"


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


def violation(rule: Rule, call: object, message: str) -> MetalValidationError:
    """The error strict mode raises at ``call`` (a selector and its receiver) for breaking ``rule``."""
    return MetalValidationError(f"{call}: {message} ({rule.citation})")


def assertion(rule: Rule, call: object, message: str) -> MetalValidationError:
    """The error both modes raise where Metal's driver asserts: ``failed assertion `message'``."""
    return MetalValidationError(f"{call}: failed assertion `{message}' ({rule.citation})")

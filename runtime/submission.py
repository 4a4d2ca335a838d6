"""What one submit of a ``Session`` leaves: ``Submission`` (its timeline value, the command buffers it committed, host
seconds, and after completion their GPU times), ``GpuSpan`` (one command buffer's GPU start and end in integer
nanoseconds), the conversions every GPU time goes through (``gpu_seconds``, ``seconds_to_ns``), and the timeline
values submits take (``TimelineValues``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Submission", "GpuSpan", "TimelineValues", "gpu_seconds", "seconds_to_ns", "NS_PER_S"]

NS_PER_S = 1_000_000_000


def gpu_seconds(reported: Any) -> float | None:
    """A command buffer's ``GPUStartTime`` or ``GPUEndTime`` as Metal reports it (a double, seconds on the GPU's
    clock), or None when it is not a time: Metal reports 0.0 when the time is not available (METAL.md §1: before
    the command buffer completes, or on a device that does not time it), and a negative, infinite or NaN value is
    no time either."""
    if type(reported) is float and 0.0 < reported < math.inf:  # the usual: a time (NaN fails the test)
        return reported
    if isinstance(reported, bool) or not isinstance(reported, (int, float)):
        return None
    seconds = float(reported)
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def seconds_to_ns(seconds: float | None) -> int | None:
    """``seconds`` (a GPU time from ``gpu_seconds``) as integer nanoseconds, rounded to the nearest: the one
    conversion every GPU duration goes through, so 12345.000100 s -> 12345.000350 s is exactly 250,000 ns. The
    whole seconds are split off first (exactly), so the result is the nearest nanosecond at any clock value. None
    stays None."""
    if seconds is None:
        return None
    whole = math.floor(seconds)
    return whole * NS_PER_S + round((seconds - whole) * NS_PER_S)


@dataclass(frozen=True, slots=True)
class GpuSpan:
    """The GPU time of one command buffer a submit committed: ``cb`` its ``cbslots`` slot, ``start_ns``/``end_ns``
    its ``GPUStartTime``/``GPUEndTime`` in integer nanoseconds on the GPU's clock (``seconds_to_ns``; None where Metal
    reported 0.0: not available).

    Apple GPUs time command buffers, not kernels (METAL.md §1): a span covers every command its command buffer ran,
    and nothing divides it among them. A submit without timestamps has one span per command buffer (usually one
    for the whole queue); per-kernel times need a profiled submit (``Queue.timestamp``: one command buffer per
    command, so one span per command)."""

    cb: int
    start_ns: int | None
    end_ns: int | None

    @property
    def ns(self) -> int | None:
        """The duration ``end_ns - start_ns`` in nanoseconds; None when a time is not available or the end is
        before the start (never a negative duration)."""
        if self.start_ns is None or self.end_ns is None or self.end_ns < self.start_ns:
            return None
        return self.end_ns - self.start_ns


@dataclass(eq=False)
class Submission:
    """One submit: the timeline ``value`` it signals (None when the Program signals none), the retained command
    buffers it committed (``cbs``, by cbslots slot; 0 for a slot this run left empty), host seconds the submit
    took, and after completion: ``gpu_times``, each slot's (GPUStartTime, GPUEndTime) in seconds as reported (None
    where not available: Metal's 0.0, or an empty slot); ``spans``, one ``GpuSpan`` (integer nanoseconds) per
    command buffer committed; ``timestamps``, slot -> seconds (or None) of ``Queue.timestamp``."""

    index: int
    value: int | None
    cbs: tuple[int, ...]
    host_s: float
    gpu_times: list[tuple[float | None, float | None]] = field(default_factory=list)
    spans: list[GpuSpan] = field(default_factory=list)
    timestamps: dict[int, float | None] = field(default_factory=dict)

    @property
    def gpu_ns(self) -> int | None:
        """The GPU time of the submit in nanoseconds: the sum of its command buffers' spans (``GpuSpan.ns``); None
        before completion, without command buffers, or when one span's time is not available."""
        if not self.spans:
            return None
        total = 0
        for span in self.spans:
            ns = span.ns
            if ns is None:
                return None
            total += ns
        return total


class TimelineValues:
    """The timeline values handed out on one MTLSharedEvent: ``value`` is the highest value a submit used, was
    refused (it is skipped: rule 12 refuses it again) or the host signaled (``Session.signal_event``), so the next
    default value, ``value + 1``, is above every value the event has been given by this host (METAL.md §3 rule 12:
    an event's values only increase). A Session has its own; the Sessions of a ``DeviceContext`` share the context's
    (one event for all its Programs)."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def see(self, value: int) -> None:
        """``value`` was used, refused or signaled: the next default value is above it."""
        if value > self.value:
            self.value = value

    def take(self) -> int:
        """The next value (``value + 1``), marked used."""
        self.value += 1
        return self.value

"""The timing figures of ``mtlir run``: host and GPU seconds per submit, without the first submit's one-time costs
when there is more than one submit (``submit_timing``).

The first submit pays for what happens once: the simulated device's OpenCL runtime builds each kernel at its first
launch (PoCL compiles it then, inside the command buffer's GPU span: ``cnn.apple7`` measured 1.05 s of "GPU time"
for one submit with an empty kernel cache, 0.148 s per submit over ten), the executor's first call, caches filling.
So with ``--repeat N`` > 1 the per-submit figures are the means over submits 2..N and the first submit is reported
on its own; with ``--repeat 1`` the one submit is all there is, and the figures say that they include those costs.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mtlir.runtime.submission import Submission

__all__ = ["SubmitTiming", "submit_timing", "gpu_s_per_submit"]


def gpu_s_per_submit(completed: Iterable[Submission]) -> float | None:
    """The mean GPU seconds per submit of the ``completed`` Submissions (``Submission.gpu_ns``: the sum of the
    spans of its command buffers, integer nanoseconds, converted to seconds once here); None when there is none or
    one submit's GPU time is not available (Metal reported 0.0), never a negative or partial figure."""
    from mtlir.runtime.submission import NS_PER_S
    ns = [rec.gpu_ns for rec in completed]
    if not ns or any(n is None for n in ns):
        return None
    return sum(n for n in ns if n is not None) / (len(ns) * NS_PER_S)


@dataclass(frozen=True)
class SubmitTiming:
    """What ``mtlir run`` reports of the time its submits took. ``host_s_per_submit`` and ``gpu_s_per_submit``:
    seconds, means over ``timed_submits`` submits (GPU: those of them the session still keeps, its last 64;
    None when a GPU time is not available); ``includes_first_submit``: whether those include the first submit's
    one-time costs (only when it is the only one); ``first_submit_host_s`` and ``first_submit_gpu_s``: the first
    submit alone (its GPU time None when not available or no longer kept)."""

    host_s_per_submit: float
    gpu_s_per_submit: float | None
    timed_submits: int
    includes_first_submit: bool
    first_submit_host_s: float
    first_submit_gpu_s: float | None

    def text(self, executor: str) -> str:
        """The host time as ``mtlir run``'s summary line prints it: ``host time per submit: 340.2 us (compiled;
        submits 2..10; the first: 11938.3 us)``, or for one submit ``... (compiled; one submit: includes the
        one-time costs of the first run, kernel builds among them; --repeat N > 1 leaves them out)``."""
        head = f"host time per submit: {self.host_s_per_submit * 1e6:.1f} us ({executor}; "
        if self.includes_first_submit:
            return head + ("one submit: includes the one-time costs of the first run, kernel builds among them; "
                           "--repeat N > 1 leaves them out)")
        return head + (f"submits 2..{self.timed_submits + 1}, the first left out: "
                       f"{self.first_submit_host_s * 1e6:.1f} us)")


def submit_timing(completed: Iterable[Submission], host_s_total: float, first_host_s: float,
                  submits: int) -> SubmitTiming:
    """The ``SubmitTiming`` of a run of ``submits`` submits (at least one) whose host times add up to
    ``host_s_total`` seconds, the first's ``first_host_s``; ``completed``: the Submissions the session kept (with
    their ``index``, 0 for the first). With one submit the figures are that submit's; with more, the first is left
    out of the means."""
    kept = list(completed)
    first = [rec for rec in kept if rec.index == 0]
    first_gpu = gpu_s_per_submit(first)
    if submits <= 1:
        return SubmitTiming(host_s_total, gpu_s_per_submit(kept), 1, True, first_host_s, first_gpu)
    rest = [rec for rec in kept if rec.index != 0]
    return SubmitTiming((host_s_total - first_host_s) / (submits - 1), gpu_s_per_submit(rest), submits - 1, False,
                        first_host_s, first_gpu)

"""Fault injection on the simulated device: what a test (or ``mtlir run --inject-fault``) asks the device to get wrong.

Three kinds of fault, each spelled as ``mtlir run --inject-fault SPEC`` takes it (``Fault.parse``):

- ``K:NAME`` or ``K:CODE`` (``0:PageFault``, ``2:9``): command buffer K (the K-th committed after the fault is
  armed, from 0; in a Session's first submit after arming, its command buffer K: a submit commits them in cbslots
  order) ends in status Error with that ``MTLCommandBufferError`` (Timeout 2, PageFault 3, NotPermitted 7,
  OutOfMemory 8, InvalidResource 9, and the other codes of ``MTL.ERROR_NAMES``). The fault strikes at its first
  kernel dispatch or blit, before it runs (a command buffer with neither fails at its start, before its first
  event signal; one whose blits and kernels all ran without it, at its end): nothing it would have run after that
  point runs, its encoded event signals from there on are skipped (METAL.md §3 rule 6).
- ``K:hang``: the first kernel of command buffer K never finishes. The simulated GPU stays busy with it for
  ``gpu_timeout_s`` seconds (the GPU watchdog), then ends the command buffer in Error, Timeout (2); a host wait
  shorter than that ends by its own timeout. Nothing hangs.
- ``alloc:KIND`` or ``alloc:KIND:N`` (KIND ``buffer``, ``icb`` or ``pipeline``): the N-th (from 0, default 0)
  ``newBufferWithLength:options:``, ``newIndirectCommandBufferWithDescriptor:maxCommandCount:options:`` or
  ``newComputePipelineStateWithDescriptor:options:reflection:error:`` after arming returns nil, as Metal does when
  it cannot allocate (a pipeline state also gets an NSError through its out-parameter). ``link`` then raises a
  ``LinkError`` naming the object and releases what it made.

Each fault fires once. ``FaultPlan`` is the device's record of the armed faults and of the counts they refer to;
``SimDevice.inject`` arms them (docs/reliability.md). The GPU's hooks: ``arm_fault`` at a commit, ``fault_at_start``
when a command buffer starts, ``inject`` before a kernel runs, ``inject_blit`` before a blit, ``unfired_fault`` at a
command buffer's end (functions taking the ``gpu.GPU``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtlir.errors import ArgumentError
from mtlir.metal import MTL
from mtlir.runtime.sim.faults import GPUFault
from mtlir.runtime.sim.objects import CommandBuffer, Encoder, Pipeline, clock

if TYPE_CHECKING:
    from mtlir.runtime.sim.gpu import GPU

__all__ = ["Fault", "FaultPlan", "ALLOC_KINDS", "HANG", "arm_fault", "inject", "inject_blit", "fault_at_start",
           "unfired_fault"]

ALLOC_KINDS = ("buffer", "icb", "pipeline")  # what an allocation fault can make nil
HANG = "hang"
_BY_NAME = {name.lower(): code for code, name in MTL.ERROR_NAMES.items() if code != MTL.ErrorNone}
_SPELLING = ("K:NAME or K:CODE (an MTLCommandBufferError: " + ", ".join(
    f"{name} {code}" for code, name in MTL.ERROR_NAMES.items() if code != MTL.ErrorNone)
    + "), K:hang, or alloc:KIND[:N] with KIND buffer, icb or pipeline")


@dataclass(frozen=True)
class Fault:
    """One fault to inject: ``kind`` is ``"command_buffer"`` (command buffer ``index`` ends in Error with
    MTLCommandBufferError ``code``), ``"hang"`` (the first kernel of command buffer ``index`` never finishes) or
    ``"alloc"`` (the ``index``-th allocation of ``target``, ``buffer``/``icb``/``pipeline``, returns nil). Indices
    count from 0, from the call that arms the fault. Raises ``ArgumentError`` for a negative index, a code that is
    not an MTLCommandBufferError or an unknown allocation kind."""

    kind: str
    index: int = 0
    code: int = 0
    target: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise ArgumentError(f"fault {self.kind}: the index must be an int >= 0, got {self.index!r}")
        if self.kind == "command_buffer":
            # not a bool: True == 1 would pass as code 1 (Internal) and print as True
            if isinstance(self.code, bool) or self.code not in MTL.ERROR_NAMES or self.code == MTL.ErrorNone:
                raise ArgumentError(f"fault: {self.code!r} is not an MTLCommandBufferError code "
                                    f"(expected one of {', '.join(map(str, sorted(_BY_NAME.values())))})")
        elif self.kind == "alloc":
            if self.target not in ALLOC_KINDS:
                raise ArgumentError(f"fault alloc: {self.target!r} is not an allocation kind (expected "
                                    f"{', '.join(ALLOC_KINDS)})")
        elif self.kind != HANG:
            raise ArgumentError(f"fault: unknown kind {self.kind!r} (command_buffer, hang or alloc)")

    @property
    def name(self) -> str:
        """The MTLCommandBufferError's name (``PageFault``) for a command buffer fault, else the kind."""
        return MTL.ERROR_NAMES[self.code] if self.kind == "command_buffer" else self.kind

    def spec(self) -> str:
        """The fault as ``--inject-fault`` spells it (``0:PageFault``, ``1:hang``, ``alloc:icb:0``)."""
        if self.kind == "alloc":
            return f"alloc:{self.target}:{self.index}"
        return f"{self.index}:{self.name}"

    @staticmethod
    def parse(text: str) -> Fault:
        """A fault from its ``--inject-fault`` spelling (module docstring; names in any case). Raises
        ``ArgumentError`` naming the spelling and what is accepted."""
        if not isinstance(text, str):
            raise ArgumentError(f"fault {text!r}: a fault is spelled as a str ({_SPELLING}) or given as a Fault")
        parts = text.strip().split(":")
        if parts[0].lower() == "alloc":
            if len(parts) not in (2, 3) or parts[1].lower() not in ALLOC_KINDS:
                raise ArgumentError(f"fault {text!r}: expected alloc:KIND or alloc:KIND:N with KIND one of "
                                    f"{', '.join(ALLOC_KINDS)}")
            return Fault("alloc", _index(parts[2], text) if len(parts) == 3 else 0, target=parts[1].lower())
        if len(parts) != 2:
            raise ArgumentError(f"fault {text!r}: expected {_SPELLING}")
        index, what = _index(parts[0], text), parts[1].strip()
        if what.lower() == HANG:
            return Fault(HANG, index)
        if what.isdigit():
            return Fault("command_buffer", index, int(what))
        code = _BY_NAME.get(what.lower())
        if code is None:
            raise ArgumentError(f"fault {text!r}: {what!r} is not an MTLCommandBufferError name: expected {_SPELLING}")
        return Fault("command_buffer", index, code)


def _index(text: str, spec: str) -> int:
    if not text.strip().isdigit():
        raise ArgumentError(f"fault {spec!r}: {text!r} is not an index (an integer >= 0)")
    return int(text)


class FaultPlan:
    """The faults armed on one SimDevice and the counts they refer to: ``commits`` (command buffers committed so far)
    and ``allocations`` (per kind, allocations asked for so far). A fault armed with index K waits for the count at
    arming + K; ``fired`` lists the faults that have struck, in order (for tests and reports)."""

    def __init__(self) -> None:
        self.commits = 0
        self.allocations = {kind: 0 for kind in ALLOC_KINDS}
        self.by_commit: dict[int, Fault] = {}
        self.by_allocation: dict[tuple[str, int], Fault] = {}
        self.fired: list[Fault] = []

    def arm(self, fault: Fault) -> None:
        """Arm ``fault``, counting its index from now. ``ArgumentError`` when another fault already waits for the
        same command buffer or allocation."""
        if fault.kind == "alloc":
            key = (fault.target, self.allocations[fault.target] + fault.index)
            if key in self.by_allocation:
                raise ArgumentError(f"fault {fault.spec()}: that allocation already has a fault armed "
                                    f"({self.by_allocation[key].spec()})")
            self.by_allocation[key] = fault
            return
        at = self.commits + fault.index
        if at in self.by_commit:
            raise ArgumentError(f"fault {fault.spec()}: command buffer {fault.index} already has a fault armed "
                                f"({self.by_commit[at].spec()})")
        self.by_commit[at] = fault

    def committed(self) -> Fault | None:
        """A command buffer is committed: the fault armed for it, if any (then no longer armed)."""
        at, self.commits = self.commits, self.commits + 1
        return self.by_commit.pop(at, None)

    def allocation_fails(self, kind: str) -> bool:
        """An allocation of ``kind`` is asked for: True when a fault makes it return nil (the fault fires)."""
        at = self.allocations[kind]
        self.allocations[kind] = at + 1
        fault = self.by_allocation.pop((kind, at), None)
        if fault is None:
            return False
        self.fired.append(fault)
        return True

    @property
    def armed(self) -> list[Fault]:
        """The faults that have not struck yet."""
        return list(self.by_commit.values()) + list(self.by_allocation.values())


def arm_fault(gpu: GPU, cb: CommandBuffer) -> None:
    """At commit: remember the fault ``SimDevice.inject`` armed for this command buffer, if any."""
    fault = gpu.dev.faults.committed()
    if fault is not None:
        gpu.faulty[cb] = fault


def inject(gpu: GPU, p: Pipeline, what: str) -> None:
    """Before a kernel runs: the fault of ``inject_fault`` (the N-th dispatch) or the one armed for the running
    command buffer (its first kernel) strikes. A command buffer fault raises ``GPUFault`` with its code; a hang
    keeps the GPU busy with the kernel until the watchdog (``gpu_timeout_s``, the lock released meanwhile) ends
    the command buffer in Error, Timeout (2)."""
    injected = gpu.injected_fault
    if injected is not None:
        code, left = injected
        if left == 0:
            gpu.injected_fault = None
            raise GPUFault(code, f"injected fault at {what}")
        gpu.injected_fault = (code, left - 1)
    cb = gpu.advancing
    fault = gpu.faulty.pop(cb, None) if cb is not None else None
    if fault is None:
        return
    gpu.dev.faults.fired.append(fault)
    where = f"an injected fault ({fault.spec()}) at {what}"
    if fault.kind == "command_buffer":
        raise GPUFault(fault.code, f"{where}, before the kernel ran")
    gpu.running = (p.label, what, cb.handle if cb is not None else 0)
    start = clock()
    deadline = start + gpu.dev.gpu_timeout_s
    try:
        while not gpu.stopping and clock() < deadline:
            gpu.dev._cv.wait(min(deadline - clock(), 0.05))  # releases the device lock while it "runs"
    finally:
        gpu.running = None
    raise GPUFault(MTL.ErrorTimeout, f"GPU watchdog: kernel {p.label!r} ran {clock() - start:.3g} s without "
                                     f"finishing ({where}: a kernel that never finishes)")


def inject_blit(gpu: GPU, cb: CommandBuffer, what: str) -> None:
    """Before a blit runs: a command buffer fault armed for ``cb`` that has not struck strikes here (raises
    ``GPUFault``: the blit and what follows do not run, its later signals are skipped). A hang is a kernel's: it
    stays armed for the next kernel (or the command buffer's end)."""
    fault = gpu.faulty.get(cb)
    if fault is None or fault.kind != "command_buffer":
        return
    del gpu.faulty[cb]
    gpu.dev.faults.fired.append(fault)
    raise GPUFault(fault.code, f"an injected fault ({fault.spec()}) at {what}, before the blit ran")


def fault_at_start(gpu: GPU, cb: CommandBuffer) -> None:
    """At the start of ``cb``, when a fault is armed for it and it has no GPU work (no kernel dispatch, ICB range
    or blit: only event signals, waits and empty encoders): the fault strikes before its first signal (raises
    ``GPUFault``; a hang as a Timeout), so its signals are skipped (METAL.md §3 rule 6) as a failed command buffer's
    are: a consumer waiting on them does not run on the failed work's output."""
    fault = gpu.faulty.get(cb)
    if fault is None or any((isinstance(st, Encoder) and (st.commands or getattr(st, "blits", None)))
                            for st in cb.steps):
        return
    del gpu.faulty[cb]
    gpu.dev.faults.fired.append(fault)
    code = fault.code if fault.kind == "command_buffer" else MTL.ErrorTimeout
    raise GPUFault(code, f"an injected fault ({fault.spec()}) at the start of a command buffer without GPU work")


def unfired_fault(gpu: GPU, cb: CommandBuffer, ended: GPUFault | None) -> GPUFault | None:
    """At the end of a command buffer whose armed fault has not struck: a command buffer that ran no kernel
    fails now (a hang as a Timeout: with no kernel, nothing runs forever); one that ``ended`` in a fault of its
    own keeps that one (the armed fault is dropped)."""
    fault = gpu.faulty.pop(cb, None)
    if fault is None or ended is not None:
        return ended
    gpu.dev.faults.fired.append(fault)
    code = fault.code if fault.kind == "command_buffer" else MTL.ErrorTimeout
    return GPUFault(code, f"an injected fault ({fault.spec()}) at the end of a command buffer without kernels")

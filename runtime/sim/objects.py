"""The Objective-C objects of the simulated device: plain state, no behaviour.

Each class stands for one Metal or Foundation class (``objc_class`` is the name messages print). Behaviour lives in
the handler modules (``encoding``, ``icb``, ``resources``) and the GPU (``gpu``, ``executor``); the rules that check
it in ``checks`` and ``rules``. Every object has a 64-bit ``handle`` (>= 2**32), a retain count ``rc`` and ``alive``
(False once deallocated: a message to it is refused, like NSZombie does).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

from mtlir.metal import MTL
from mtlir.runtime.bridge.memory import Region
from mtlir.runtime.sim.rules.rule import Rule

__all__ = ["SimObject", "ClassObject", "NSString", "NSError", "Device", "CommandQueue", "CommandBuffer",
           "Encoder", "Fence", "SharedEvent", "Buffer", "Library", "Function", "CompileOptions",
           "PipelineDescriptor", "Pipeline", "ICBDescriptor", "ICB", "ICBSlot", "ICBSlots", "ICBCommand",
           "ResidencySetDescriptor", "ResidencySet", "Dispatch", "Execute", "SignalStep", "WaitStep", "Gate",
           "Binding", "clock", "zombie_text"]

Binding = tuple["Buffer", int]   # (buffer, byte offset) bound at a Metal buffer index
clock = time.perf_counter  # the GPU's clock: monotonic, seconds (CommandBuffer.start_time/end_time, GPUStartTime)


class SimObject:
    """Base of every simulated object (NSObject): ``handle``, retain count ``rc``, ``alive``, ``label`` (Metal's
    property), ``link_name`` (the Program's placeholder name, ``queue:a``, that link gave it host-side through
    ``SimDevice.name_object``: no message, so nothing recorded changes)."""

    objc_class: ClassVar[str] = "NSObject"

    def __init__(self) -> None:
        self.handle = 0
        self.rc = 1
        self.alive = True
        self.label = ""
        self.link_name = ""

    def describe(self) -> str:
        """``"MTLBuffer 0x6000000010a0 'label' (buffer:7)"`` for messages."""
        return (f"{self.objc_class} {self.handle:#x}" + (f" {self.label!r}" if self.label else "")
                + (f" ({self.link_name})" if self.link_name else ""))

    def zombie(self) -> str | tuple[str, int, str, str]:
        """What the device remembers of this object once it is deallocated (``SimDevice.retire``): the parts of
        ``describe()``, formatted only when a message names the dead object (``zombie_text``): a command buffer
        and its encoder die at every submit, and almost none is ever named again. A class with a ``describe`` of
        its own gives its text at once."""
        if type(self).describe is not SimObject.describe:
            return self.describe()
        return (self.objc_class, self.handle, self.label, self.link_name)


def zombie_text(zombie: str | tuple[str, int, str, str]) -> str:
    """A deallocated object's ``describe()`` text from what ``SimObject.zombie`` kept of it."""
    if isinstance(zombie, str):
        return zombie
    objc_class, handle, label, link_name = zombie
    return (f"{objc_class} {handle:#x}" + (f" {label!r}" if label else "")
            + (f" ({link_name})" if link_name else ""))


class ClassObject(SimObject):
    """A class object from ``objc_getClass``: ``name`` and ``make`` (builds an instance for ``new``/``alloc``).
    Class objects are never deallocated: ``retain``/``release`` do nothing to them."""

    objc_class = "Class"

    def __init__(self, name: str, make: Callable[[], SimObject] | None) -> None:
        super().__init__()
        self.name, self.make = name, make

    def describe(self) -> str:
        """``"class NSString"`` for messages."""
        return f"class {self.name}"


class NSString(SimObject):
    """An immutable string ``value``; ``cstr`` is the host block ``UTF8String`` returned (freed with it)."""

    objc_class = "NSString"

    def __init__(self, value: str = "") -> None:
        super().__init__()
        self.value = value
        self.cstr: Region | None = None


class NSError(SimObject):
    """An error: ``domain``, ``code`` (for a command buffer, an MTLCommandBufferError value) and
    ``description`` (the NSString ``localizedDescription`` returns; the error owns it)."""

    objc_class = "NSError"

    def __init__(self, domain: str, code: int, description: NSString) -> None:
        super().__init__()
        self.domain, self.code, self.description = domain, code, description


class Device(SimObject):
    """The MTLDevice (one per SimDevice)."""

    objc_class = "MTLDevice"


class CommandQueue(SimObject):
    """An MTLCommandQueue: ``max_count`` (maxCommandBufferCount), ``live`` (its command buffers not completed
    and not deallocated: what rule 7 counts), ``pending`` (committed, not finished, in commit order),
    ``residency_sets`` (added with addResidencySet:)."""

    objc_class = "MTLCommandQueue"

    def __init__(self, max_count: int) -> None:
        super().__init__()
        self.max_count = max_count
        self.live: set[CommandBuffer] = set()
        self.pending: list[CommandBuffer] = []
        self.residency_sets: list[ResidencySet] = []


class Gate:
    """A condition a running command buffer waits for on the GPU: ``ready()``, a ``what`` for messages and the
    ``rule`` of METAL.md §3 a wait that never ends breaks (``Rule.FENCE_ORDER``, ``Rule.EVENT_ONLY_INCREASES``;
    None for the executor's always-open ``KERNELS_IN_FLIGHT``)."""

    __slots__ = ("ready", "what", "rule")

    def __init__(self, ready: Callable[[], bool], what: str, rule: Rule | None) -> None:
        self.ready, self.what, self.rule = ready, what, rule


class Dispatch:
    """A direct-path dispatch encoded on an encoder: pipeline, bindings (index -> (buffer, offset) or bytes
    from setBytes), grid in threadgroups, threadgroup in threads."""

    __slots__ = ("pipeline", "bindings", "grid", "threadgroup")

    def __init__(self, pipeline: Pipeline | None, bindings: dict[int, Binding | bytes],
                 grid: tuple[int, int, int], threadgroup: tuple[int, int, int]) -> None:
        self.pipeline, self.bindings, self.grid, self.threadgroup = pipeline, bindings, grid, threadgroup


class Execute:
    """``executeCommandsInBuffer:withRange:``: the ICB, the range, and the pipelines the encoder had bound
    before this call (rule 16)."""

    __slots__ = ("icb", "first", "count", "bound_pipelines")

    def __init__(self, icb: ICB, first: int, count: int, bound_pipelines: frozenset[Pipeline]) -> None:
        self.icb, self.first, self.count, self.bound_pipelines = icb, first, count, bound_pipelines


class SignalStep:
    """``encodeSignalEvent:value:`` between encoders; ``fired`` once the GPU reached it."""

    __slots__ = ("event", "value", "fired")

    def __init__(self, event: SharedEvent, value: int) -> None:
        self.event, self.value, self.fired = event, value, False


class WaitStep:
    """``encodeWaitForEvent:value:`` between encoders."""

    __slots__ = ("event", "value")

    def __init__(self, event: SharedEvent, value: int) -> None:
        self.event, self.value = event, value


class Encoder(SimObject):
    """An MTLComputeCommandEncoder of command buffer ``cb``: the commands it encoded (``Dispatch``/``Execute``),
    the fence updates it waits for at its start (``fence_waits``: the encoders whose update it waits for),
    the fences it updates at its end, the resources of useResources:count:usage:, the pipelines bound with
    setComputePipelineState: (rule 16), its current pipeline and direct-path bindings. ``done`` turns True when
    the GPU reached its end (its fence updates are visible then), or when its command buffer is released
    uncommitted (``discarded``: it never runs, so nothing may wait for its fence updates)."""

    objc_class = "MTLComputeCommandEncoder"

    def __init__(self, cb: CommandBuffer) -> None:
        super().__init__()
        self.cb = cb
        self.ended = False
        self.commands: list[Dispatch | Execute] = []
        self.fence_waits: list[tuple[Fence, Encoder]] = []
        self.fence_updates: list[Fence] = []
        self.used: set[SimObject] = set()
        self.bound_pipelines: set[Pipeline] = set()
        self.pipeline: Pipeline | None = None
        self.bindings: dict[int, Binding | bytes] = {}
        self.done = False
        self.fence_prev: dict[Fence, Encoder | None] = {}  # each fence's previous updater, for a discarded encoder
        self.discarded = False  # its command buffer was released uncommitted: it never runs


class BlitCopy:
    """``copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:`` on a blit encoder (bytes)."""

    __slots__ = ("src", "src_offset", "dst", "dst_offset", "size")

    def __init__(self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, size: int) -> None:
        self.src, self.src_offset, self.dst, self.dst_offset, self.size = src, src_offset, dst, dst_offset, size


class BlitFill:
    """``fillBuffer:range:value:`` on a blit encoder: ``length`` bytes from ``offset`` set to ``value``."""

    __slots__ = ("buffer", "offset", "length", "value")

    def __init__(self, buffer: Buffer, offset: int, length: int, value: int) -> None:
        self.buffer, self.offset, self.length, self.value = buffer, offset, length, value


class BlitEncoder(Encoder):
    """An MTLBlitCommandEncoder of command buffer ``cb``: the encoder state of ``Encoder`` (fences, ``ended``,
    ``done``) with ``BlitCopy`` / ``BlitFill`` commands; the compute selectors are not its own (the device answers
    them with "unrecognized selector", as the Objective-C runtime does)."""

    objc_class = "MTLBlitCommandEncoder"

    def __init__(self, cb: CommandBuffer) -> None:
        super().__init__(cb)
        self.blits: list[BlitCopy | BlitFill] = []


class CommandBuffer(SimObject):
    """An MTLCommandBuffer: ``status`` (MTLCommandBufferStatus), ``error`` (NSError or None), GPU times in
    seconds (0.0 until Completed), the steps it encoded in order (encoders and event signals/waits), and the
    GPU's bookkeeping: ``seq`` (commit order), ``run`` (its execution, a generator), ``gate``, ``blocked_since``,
    ``late_fault`` (a fault reported at completion: rule 14), ``reads`` (the buffers it reads: rule 15),
    ``resident`` (what the queue's residency sets held at its commit: rule 10). ``retained``: the objects encoded
    into it directly (buffers of setBuffer:offset:atIndex:, pipelines of setComputePipelineState:, the ICB of
    executeCommandsInBuffer:withRange:), each retained once at the encoding call and released when it completes
    or is deallocated uncommitted: ``commandBuffer`` makes command buffers with retainedReferences YES (the
    lifetime table of docs/simulator.md)."""

    objc_class = "MTLCommandBuffer"

    def __init__(self, queue: CommandQueue) -> None:
        super().__init__()
        self.queue = queue
        self.status = MTL.StatusNotEnqueued
        self.error: NSError | None = None
        self.start_time = 0.0
        self.end_time = 0.0
        self.steps: list[Encoder | SignalStep | WaitStep] = []
        self.open_encoder: Encoder | None = None
        self.seq = 0
        self.run: Iterator[Gate | None] | None = None
        self.gate: Gate | None = None
        self.blocked_since = 0.0
        self.late_fault: tuple[int, str] | None = None
        self.reads: dict[Buffer, int] = {}
        self.icb_reads: list[tuple[ICB, int, int]] = []
        self.resident: frozenset[SimObject] = frozenset()
        self.retained: dict[SimObject, None] = {}  # an ordered set: encoding order

    @property
    def finished(self) -> bool:
        """Completed or Error."""
        return self.status >= MTL.StatusCompleted

    @property
    def in_flight(self) -> bool:
        """Committed and not finished (rule 14, 15)."""
        return MTL.StatusCommitted <= self.status < MTL.StatusCompleted


class Fence(SimObject):
    """An MTLFence: ``last_update`` is the encoder that most recently encoded updateFence: on it."""

    objc_class = "MTLFence"

    def __init__(self) -> None:
        super().__init__()
        self.last_update: Encoder | None = None


class SharedEvent(SimObject):
    """An MTLSharedEvent: ``value`` (signaledValue, only increases) and, for the strict check of rule 12, the values
    encodeSignalEvent:value: named: ``committed_highest`` (the largest in a committed command buffer) and
    ``uncommitted`` (value -> how many signals of that value command buffers not yet committed hold; a command buffer
    released uncommitted takes its own away: they will never be signaled)."""

    objc_class = "MTLSharedEvent"

    def __init__(self) -> None:
        super().__init__()
        self.value = 0
        self.committed_highest = 0
        self.uncommitted: dict[int, int] = {}
        self.skipped: list[tuple[int, CommandBuffer]] = []

    @property
    def highest_encoded(self) -> int:
        """The largest value encoded in a signal of a committed command buffer or of a live uncommitted one."""
        highest = self.committed_highest  # (no max(): it parses keywords, and every signal encoded asks this)
        for value in self.uncommitted:
            if value > highest:
                highest = value
        return highest

    def encoded(self, value: int) -> None:
        """A signal of ``value`` was encoded in an uncommitted command buffer."""
        self.uncommitted[value] = self.uncommitted.get(value, 0) + 1

    def settled(self, value: int, committed: bool) -> None:
        """The command buffer holding an encoded signal of ``value`` was committed (or released uncommitted)."""
        left = self.uncommitted.get(value, 0) - 1
        if left > 0:
            self.uncommitted[value] = left
        else:
            self.uncommitted.pop(value, None)
        if committed:
            if value > self.committed_highest:
                self.committed_highest = value


class Buffer(SimObject):
    """An MTLBuffer: ``length`` in bytes, resource ``options``, ``storage`` (numpy uint8, the bytes kernels
    see), ``region`` (its host mapping: ``contents``; None for private storage), ``gpu_address`` and
    ``readers`` (in-flight command buffer -> lowest byte offset it binds: rule 15)."""

    objc_class = "MTLBuffer"

    def __init__(self, length: int, options: int, storage: np.ndarray, region: Region | None,
                 gpu_address: int) -> None:
        super().__init__()
        self.length, self.options, self.storage, self.region = length, options, storage, region
        self.gpu_address = gpu_address
        self.readers: dict[CommandBuffer, int] = {}


class CompileOptions(SimObject):
    """MTLCompileOptions (accepted, no options are modelled)."""

    objc_class = "MTLCompileOptions"


class Library(SimObject):
    """An MTLLibrary: its ``source`` and the compiled kernels by function name."""

    objc_class = "MTLLibrary"

    def __init__(self, source: str, kernels: dict[str, Any]) -> None:
        super().__init__()
        self.source, self.kernels = source, kernels


class Function(SimObject):
    """An MTLFunction: ``name`` and the compiled kernel (``CompiledKernel`` of the kernel runner)."""

    objc_class = "MTLFunction"

    def __init__(self, name: str, kernel: Any) -> None:
        super().__init__()
        self.name, self.kernel = name, kernel


class PipelineDescriptor(SimObject):
    """MTLComputePipelineDescriptor: ``function`` and ``support_icb`` (supportIndirectCommandBuffers)."""

    objc_class = "MTLComputePipelineDescriptor"

    def __init__(self) -> None:
        super().__init__()
        self.function: Function | None = None
        self.support_icb = False


class Pipeline(SimObject):
    """MTLComputePipelineState: the function's compiled ``kernel``, its ``params`` ((buffer index, kind,
    alignment in bytes) per bound parameter), ``max_threads`` (maxTotalThreadsPerThreadgroup, in threads: the
    compiled kernel's own limit, at most 1024, given by ``newComputePipelineStateWithDescriptor:...``; a test may
    lower it with ``SimDevice.set_max_total_threads``) and ``support_icb``."""

    objc_class = "MTLComputePipelineState"

    def __init__(self, function: Function, support_icb: bool, params: list[tuple[int, str, int]],
                 max_threads: int = 1024) -> None:
        super().__init__()
        self.function, self.kernel, self.support_icb = function, function.kernel, support_icb
        self.params = params
        self.max_threads = max_threads
        self.label = function.name


class ICBDescriptor(SimObject):
    """MTLIndirectCommandBufferDescriptor (Metal's defaults: no command types, inherit NO, bind count 0)."""

    objc_class = "MTLIndirectCommandBufferDescriptor"

    def __init__(self) -> None:
        super().__init__()
        self.command_types = 0
        self.inherit_buffers = False
        self.inherit_pipeline = False
        self.max_bind = 0


class ICBSlot:
    """The state of one ICB compute command as the GPU reads it: pipeline, bindings (index -> (buffer,
    offset as stored: 32 bits)), grid and threadgroup sizes (None until concurrentDispatch...), barrier, and the
    launch the GPU prepared for it (``launch``)."""

    __slots__ = ("pipeline", "bindings", "grid", "threadgroup", "barrier", "launch", "sizes_ok")

    def __init__(self) -> None:
        self.pipeline: Pipeline | None = None
        self.bindings: dict[int, Binding] = {}
        self.grid: tuple[int, int, int] | None = None
        self.threadgroup: tuple[int, int, int] = (0, 0, 0)
        self.barrier = False
        # the kernel runner's prepared launch of this command: (the ICB's version, the pipeline, the launch or None
        # for nothing to run, (grid, threadgroup, bindings) as prepared, the dispatch's name or None when the
        # command changed since); the GPU reuses it while the ICB's version or the command's content stays the same
        # (executor.Executor._kept, Executor._icb_command)
        self.launch: tuple[int, Any, Any, Any, str | None] | None = None
        # (grid, threadgroup, pipeline, its maxTotalThreadsPerThreadgroup) strict mode last found within Metal's
        # limits for this command: a patch with the same sizes is not checked again (methods/icb.py)
        self.sizes_ok: tuple[Any, ...] | None = None


class ICBSlots(dict[int, ICBSlot]):
    """The commands of an ICB by index, made on first use (an ICB of 2**24 commands costs nothing until used)."""

    def __missing__(self, index: int) -> ICBSlot:
        slot = self[index] = ICBSlot()
        return slot


class ICB(SimObject):
    """An MTLIndirectCommandBuffer: ``max_count`` commands (``slots``), ``max_bind`` (maxKernelBufferBindCount),
    ``version`` (bumped by every CPU write that changes a command: the checks cache per version), ``readers`` (in-flight
    command buffers -> the ranges they execute: rule 15)."""

    objc_class = "MTLIndirectCommandBuffer"

    def __init__(self, max_count: int, max_bind: int, command_types: int) -> None:
        super().__init__()
        self.max_count, self.max_bind, self.command_types = max_count, max_bind, command_types
        self.slots = ICBSlots()
        self.version = 0
        self.readers: dict[CommandBuffer, list[tuple[int, int]]] = {}
        self.analysis: dict[tuple[int, int], tuple[int, Any]] = {}
        # the executor's batches of whole ranges (first, count) -> ``executor.RangeBatch``, valid while ``version``
        # stays (``Executor._execute_icb``)
        self.ranges: dict[tuple[int, int], Any] = {}


class ICBCommand(SimObject):
    """An MTLIndirectComputeCommand: a view of slot ``index`` of ``icb`` (``None`` index: out of range in
    faithful mode, its writes go nowhere)."""

    objc_class = "MTLIndirectComputeCommand"

    def __init__(self, icb: ICB, index: int | None) -> None:
        super().__init__()
        self.icb, self.index = icb, index

    def describe(self) -> str:
        """The command, its index (or "out of range") and its ICB, for messages."""
        where = "out of range" if self.index is None else str(self.index)
        return f"{self.objc_class} {self.handle:#x} (command {where} of {self.icb.describe()})"


class ResidencySetDescriptor(SimObject):
    """MTLResidencySetDescriptor."""

    objc_class = "MTLResidencySetDescriptor"


class ResidencySet(SimObject):
    """An MTLResidencySet: ``pending`` (after addAllocation:/removeAllocation:) and ``committed`` (what its last
    commit made resident)."""

    objc_class = "MTLResidencySet"

    def __init__(self) -> None:
        super().__init__()
        self.pending: set[SimObject] = set()
        self.committed: frozenset[SimObject] = frozenset()

"""Handlers of the selectors that make and read objects: NSObject, classes, NSString, NSError, MTLDevice's factory
methods, MTLBuffer, MTLLibrary/MTLFunction, pipelines and their descriptor, MTLSharedEvent, MTLResidencySet.

Ownership follows Cocoa (METAL.md §2): ``new...``/``alloc``/``new`` return +1; ``stringWithUTF8String:`` +0
(autoreleased); getters (``error``, ``localizedDescription``, ``contents``) return what the receiver owns.
Kernels compile at ``newLibraryWithSource:options:error:`` with the device's kernel runner: a compile error comes
back through the NSError** out-parameter with a nil library, as Metal reports it; ``UnsupportedKernelError`` and
``KernelBuildError`` (OpenCL did not build the translation: the MSL may be invalid, or the translator may not
handle it, which the simulator cannot tell apart) propagate unchanged (the CLI maps both to exit code 4).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL
from mtlir.errors import BridgeError, KernelBuildError, KernelCompileError, WaitTimeoutError
from mtlir.runtime.sim.msgsend import NIL, MethodTable
from mtlir.runtime.sim.dispatch import kernel_params
from mtlir.runtime.sim.msl.translate import kernel_functions
from mtlir.runtime.sim.objects import (ICB, Buffer, ClassObject, CommandBuffer, CommandQueue, CompileOptions, Device,
                                       Encoder,
                                       Fence, Function, ICBDescriptor, Library, NSError, NSString, Pipeline,
                                       PipelineDescriptor, ResidencySet, ResidencySetDescriptor, SharedEvent,
                                       SimObject)
from mtlir.runtime.sim.rules.rule import Call, Rule, violation

if TYPE_CHECKING:
    from mtlir.runtime.sim.device import SimDevice

__all__ = ["METHODS", "CLASSES"]

METHODS = MethodTable()  # the handlers of this module (SimDevice joins them with the others)

# the classes objc_getClass knows, and how new/alloc make an instance
CLASSES: dict[str, Callable[[], SimObject] | None] = {
    "NSObject": SimObject, "NSString": NSString, "NSError": None,
    "MTLComputePipelineDescriptor": PipelineDescriptor, "MTLIndirectCommandBufferDescriptor": ICBDescriptor,
    "MTLResidencySetDescriptor": ResidencySetDescriptor, "MTLCompileOptions": CompileOptions,
}
_MAX_RESIDENCY_SETS = 32  # per queue (METAL.md §2 addResidencySet:)


def _write_error(dev: SimDevice, errptr: int, err: NSError | None, where: str) -> None:
    """Store ``err`` (+0: autoreleased) through an NSError** out-parameter when it is not NULL."""
    if err is not None:
        dev.autorelease(err)
    if errptr:
        try:
            dev.memory.store(errptr, dtypes.id, 0 if err is None else err.handle)
        except BridgeError as e:
            raise BridgeError(f"{where}: the NSError** argument: {e}") from None


# ---------------------------------------------------------------------------- NSObject and classes
# retain/release/init: reference counts and the identity initializer
@METHODS.method(SimObject, "retain")
def _retain(dev: SimDevice, obj: SimObject) -> SimObject:
    return dev.retain(obj)


@METHODS.method(SimObject, "release")
def _release(dev: SimDevice, obj: SimObject) -> None:
    dev.release(obj, "release")


def _init(dev: SimDevice, obj: SimObject) -> SimObject:
    return obj


def _set_label(dev: SimDevice, obj: SimObject, s: NSString | None) -> None:
    obj.label = "" if s is None else s.value


for _cls in (SimObject, NSString, PipelineDescriptor, ICBDescriptor, ResidencySetDescriptor, CompileOptions):
    METHODS.add(_cls, "init", _init)

for _labelled in (CommandQueue, CommandBuffer, Encoder, Buffer, Fence, SharedEvent, ICB, Library, Function,
                  PipelineDescriptor, ResidencySetDescriptor):
    METHODS.add(_labelled, "setLabel:", _set_label, (NSString, NIL))


# new/alloc on a class: a +1 instance
@METHODS.method(ClassObject, "new")
@METHODS.method(ClassObject, "alloc")
def _new(dev: SimDevice, cls: ClassObject) -> SimObject:
    if cls.make is None:
        raise BridgeError(f"+[{cls.name} new]: the simulated runtime does not create {cls.name} objects this way")
    return dev.new(cls.make())  # type: ignore[no-any-return]


@METHODS.method(ClassObject, "stringWithUTF8String:")
def _string_with_utf8(dev: SimDevice, cls: ClassObject, ptr: int) -> NSString | None:
    if cls.name != "NSString":
        raise BridgeError(f"+[{cls.name} stringWithUTF8String:]: unrecognized selector sent to class")
    if ptr == 0:
        return None  # Foundation returns nil for NULL
    return dev.new_autoreleased(NSString(dev.memory.read_cstring(ptr)))  # type: ignore[no-any-return]


@METHODS.method(NSString, "UTF8String")
def _utf8(dev: SimDevice, s: NSString) -> int:
    if s.cstr is None:
        raw = s.value.encode() + b"\0"
        s.cstr = dev.memory.alloc(len(raw), owner=s, what=f"UTF8String of {s.describe()}")
        s.cstr.data[:] = memoryview(raw)
    return s.cstr.base


@METHODS.method(NSError, "code", lockless=True)
def _code(dev: SimDevice, e: NSError) -> int:
    return e.code


@METHODS.method(NSError, "localizedDescription", lockless=True)
def _description(dev: SimDevice, e: NSError) -> NSString:
    return e.description


# ---------------------------------------------------------------------------- MTLDevice factories
@METHODS.method(Device, "newCommandQueueWithMaxCommandBufferCount:")
def _new_queue(dev: SimDevice, d: Device, n: int) -> CommandQueue | None:
    return dev.new(CommandQueue(n)) if n > 0 else None


@METHODS.method(Device, "newSharedEvent")
def _new_event(dev: SimDevice, d: Device) -> SharedEvent:
    return dev.new(SharedEvent())  # type: ignore[no-any-return]


@METHODS.method(Device, "newFence")
def _new_fence(dev: SimDevice, d: Device) -> Fence:
    return dev.new(Fence())  # type: ignore[no-any-return]


@METHODS.method(Device, "maxBufferLength", lockless=True)
def _max_buffer_length(dev: SimDevice, d: Device) -> int:
    """The largest buffer ``newBufferWithLength:options:`` creates, in bytes (``SimDevice(max_buffer_length=)``)."""
    return dev.max_buffer_length


@METHODS.method(Device, "newBufferWithLength:options:")
def _new_buffer(dev: SimDevice, d: Device, length: int, options: int) -> Buffer | None:
    """Shared (0) and managed (1) storage map ``contents`` into host memory; private (2) has none (NULL);
    a zero length, memoryless storage or more than ``max_buffer_length`` bytes return nil (Metal: nil on OOM), and
    so does an allocation an injected fault makes fail (``SimDevice.inject("alloc:buffer")``)."""
    mode = (options >> 4) & 0xF
    if length == 0 or length > dev.max_buffer_length or mode not in (0, 1, 2):
        return None
    if dev.faults.allocation_fails("buffer"):
        return None
    buf = Buffer(length, options, None, None, dev._gpu_va)  # type: ignore[arg-type]
    dev._gpu_va += (length + 0xFFFF) // 0x10000 * 0x10000 + 0x10000
    dev.new(buf)
    try:
        if mode == 2:
            buf.storage = np.zeros(length, dtype=np.uint8)  # private: never mapped for the CPU
        else:
            buf.region = dev.memory.alloc(length, owner=buf, what=f"contents of {buf.describe()}")
            buf.storage = buf.region.data
    except MemoryError:
        dev.release(buf, "newBufferWithLength:options:")
        return None
    return buf


@METHODS.method(Device, "newLibraryWithSource:options:error:", NSString, (CompileOptions, NIL))
def _new_library(dev: SimDevice, d: Device, src: NSString, options: Any, errptr: int) -> Library | None:
    runner, kernels = dev.kernel_runner, {}
    try:
        for name in kernel_functions(src.value):
            kernels[name] = runner.compile(src.value, name)
    except KernelBuildError:  # the simulator's own limit as much as the MSL's: never pretend Metal refused it
        raise
    except KernelCompileError as e:  # MslSyntaxError too: Metal reports both through the NSError
        err = dev._make_error(3, f"Compilation failed: {e}", domain="MTLLibraryErrorDomain")
        _write_error(dev, errptr, err, "newLibraryWithSource:options:error:")
        return None
    _write_error(dev, errptr, None, "newLibraryWithSource:options:error:")
    return dev.new(Library(src.value, kernels))  # type: ignore[no-any-return]


@METHODS.method(Library, "newFunctionWithName:", NSString)
def _new_function(dev: SimDevice, lib: Library, name: NSString) -> Function | None:
    kernel = lib.kernels.get(name.value)
    return None if kernel is None else dev.new(Function(name.value, kernel))


@METHODS.method(PipelineDescriptor, "setComputeFunction:", (Function, NIL))
def _set_function(dev: SimDevice, desc: PipelineDescriptor, fn: Function | None) -> None:
    desc.function = fn


@METHODS.method(PipelineDescriptor, "setSupportIndirectCommandBuffers:")
def _set_support_icb(dev: SimDevice, desc: PipelineDescriptor, flag: int) -> None:
    desc.support_icb = bool(flag)


@METHODS.method(Device, "newComputePipelineStateWithDescriptor:options:reflection:error:", PipelineDescriptor)
def _new_pipeline(dev: SimDevice, d: Device, desc: PipelineDescriptor, options: int, reflection: int,
                  errptr: int) -> Pipeline | None:
    if desc.function is None or not desc.function.alive:
        err = dev._make_error(1, "computeFunction must not be nil", domain="AGXMetalErrorDomain")
        _write_error(dev, errptr, err, "newComputePipelineStateWithDescriptor:options:reflection:error:")
        return None
    if dev.faults.allocation_fails("pipeline"):  # an injected nil (SimDevice.inject("alloc:pipeline"))
        err = dev._make_error(MTL.ErrorOutOfMemory, f"Insufficient memory to create the compute pipeline state of "
                              f"function {desc.function.name!r} (an injected allocation fault)",
                              domain="AGXMetalErrorDomain")
        _write_error(dev, errptr, err, "newComputePipelineStateWithDescriptor:options:reflection:error:")
        return None
    if reflection:
        dev.memory.store(reflection, dtypes.id, 0)
    _write_error(dev, errptr, None, "newComputePipelineStateWithDescriptor:options:reflection:error:")
    kernel = desc.function.kernel
    pipeline = Pipeline(desc.function, desc.support_icb, kernel_params(kernel), _pipeline_limit(kernel))
    return dev.new(pipeline)  # type: ignore[no-any-return]


def _pipeline_limit(kernel: Any) -> int:
    """maxTotalThreadsPerThreadgroup of a new pipeline of ``kernel``, in threads: the compiled kernel's own limit
    (``CompiledKernel.max_total_threads``: Metal's 1024, its ``[[max_total_threads_per_threadgroup(n)]]``, what the
    OpenCL device runs of it), so a dispatch the kernel runner could not run is refused as Metal refuses one above
    the pipeline's limit (rule 13), never as an OpenCL error; 1024 for a kernel that says nothing (the tests'
    Python kernels)."""
    limit = getattr(kernel, "max_total_threads", MTL.MAX_THREADS_PER_THREADGROUP)
    return min(MTL.MAX_THREADS_PER_THREADGROUP, int(limit))


@METHODS.method(Pipeline, "maxTotalThreadsPerThreadgroup", lockless=True)
def _max_threads(dev: SimDevice, p: Pipeline) -> int:
    """The pipeline's limit (``_pipeline_limit``, or what ``SimDevice.set_max_total_threads`` set), in threads."""
    return p.max_threads


# ---------------------------------------------------------------------------- MTLBuffer
@METHODS.method(Buffer, "contents", lockless=True)
def _contents(dev: SimDevice, b: Buffer) -> int:
    return 0 if b.region is None else b.region.base


@METHODS.method(Buffer, "gpuAddress", lockless=True)
def _gpu_address(dev: SimDevice, b: Buffer) -> int:
    return b.gpu_address


@METHODS.method(Buffer, "length", lockless=True)
def _length(dev: SimDevice, b: Buffer) -> int:
    return b.length


# ---------------------------------------------------------------------------- MTLSharedEvent
@METHODS.method(SharedEvent, "signaledValue", lockless=True)
def _signaled_value(dev: SimDevice, ev: SharedEvent) -> int:
    return ev.value


@METHODS.method(SharedEvent, "setSignaledValue:")
def _set_signaled_value(dev: SimDevice, ev: SharedEvent, value: int) -> None:
    """The host signals ``ev``: the value changes only if it is larger (Apple's documentation of signaledValue);
    command buffers waiting for a value it reaches run on (rule 12)."""
    dev.gpu.signal(ev, value)


def _unreachable(dev: SimDevice, ev: SharedEvent, value: int) -> CommandBuffer | None:
    """The failed command buffer whose skipped signal was the only way ``ev`` could reach ``value`` (rule 6),
    or None while some committed, unfinished command buffer may still signal it."""
    if ev.value >= value:
        return None
    failed = next((cb for v, cb in ev.skipped if v >= value), None)
    if failed is None:
        return None
    for q in dev.gpu.queues:
        for cb in q.pending:
            if any(getattr(s, "event", None) is ev and getattr(s, "value", -1) >= value and not getattr(s, "fired", 1)
                   for s in cb.steps):
                return None
    return failed


@METHODS.method(SharedEvent, "waitUntilSignaledValue:timeoutMS:")
def _wait_signaled(dev: SimDevice, ev: SharedEvent, value: int, timeout_ms: int) -> bool:
    """Blocks until the value reaches ``value`` (YES) or ``timeout_ms`` pass (NO). The wait is capped at the
    device's ``timeout_s``: a longer one that runs out raises ``TimeoutError``. Strict mode raises at once when
    only a skipped signal of a failed command buffer could have reached the value (rule 6)."""
    call = Call("waitUntilSignaledValue:timeoutMS:", ev, value, timeout_ms)
    timeout = timeout_ms / 1000.0
    capped = timeout > dev.timeout_s
    stuck: list[CommandBuffer] = []

    def ready() -> bool:
        if ev.value >= value:
            return True
        if dev.strict and (cb := _unreachable(dev, ev, value)) is not None:
            stuck.append(cb)
            return True
        return False

    ok = dev.wait_for(ready, min(timeout, dev.timeout_s))
    if stuck:
        cb = stuck[0]
        code = cb.error.code if cb.error is not None else 0
        raise violation(Rule.FAILED_SKIPS_SIGNALS, call,
                        f"the value can never be reached: {cb.describe()}, which encoded the signal, ended "
                        f"in status Error ({MTL.ERROR_NAMES.get(code, code)}) and Metal skipped its signal; "
                        "check the command buffer's status and error instead of waiting")
    if not ok and capped:
        raise WaitTimeoutError(f"{call}: not signaled after {dev.timeout_s} s, the simulated device's longest wait "
                           f"(value is {ev.value})")
    return ok


# ---------------------------------------------------------------------------- MTLResidencySet
@METHODS.method(Device, "newResidencySetWithDescriptor:error:", ResidencySetDescriptor)
def _new_residency_set(dev: SimDevice, d: Device, desc: ResidencySetDescriptor, errptr: int) -> Any:
    if not dev.spec.residency_set:
        err = dev._make_error(1, "MTLResidencySet is not supported on this device (macOS 15 or later)",
                              domain="MTLResidencySetErrorDomain")
        _write_error(dev, errptr, err, "newResidencySetWithDescriptor:error:")
        return None
    _write_error(dev, errptr, None, "newResidencySetWithDescriptor:error:")
    rs = dev.new(ResidencySet())
    rs.label = desc.label
    return rs


@METHODS.method(ResidencySet, "addAllocation:", (Buffer, ICB))
def _add_allocation(dev: SimDevice, rs: ResidencySet, obj: SimObject) -> None:
    rs.pending.add(obj)


@METHODS.method(ResidencySet, "removeAllocation:", (Buffer, ICB))
def _remove_allocation(dev: SimDevice, rs: ResidencySet, obj: SimObject) -> None:
    rs.pending.discard(obj)


@METHODS.method(ResidencySet, "commit")
def _commit_residency(dev: SimDevice, rs: ResidencySet) -> None:
    rs.committed = frozenset(rs.pending)


@METHODS.method(CommandQueue, "addResidencySet:", ResidencySet)
def _add_residency_set(dev: SimDevice, q: CommandQueue, rs: ResidencySet) -> None:
    if rs in q.residency_sets:
        return
    if len(q.residency_sets) >= _MAX_RESIDENCY_SETS:
        if dev.strict:
            raise violation(Rule.RESIDENCY, Call("addResidencySet:", q, rs),
                            f"a queue holds at most {_MAX_RESIDENCY_SETS} residency sets")
        return
    q.residency_sets.append(rs)

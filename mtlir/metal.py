"""Metal facts as data: device descriptions, kernels, placeholders, and the one table of selector signatures.

The selector table covers every selector of METAL.md §2 (Apple's Metal and Foundation headers give the
signatures). ``abi_prototype`` turns a selector's Metal signature into the exact C prototype of the call of
``objc_msgSend`` on one target: NSRange travels as two words on both targets; MTLSize (24 bytes) travels as a
pointer to a copy on arm64 (AAPCS64: composites over 16 bytes go by reference) and by value on the stack on
x86_64 (System V class MEMORY); BOOL is read from the low byte; double returns in d0/xmm0.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from mtlir.ir.dtypes import DType, PtrDType, dtypes
from mtlir.errors import ArgumentError, LoweringError
from mtlir.msl import check_kernel_params

__all__ = ["DeviceSpec", "Kernel", "KernelParam", "Obj", "Signature", "Prototype", "SELECTORS", "C_FUNCTIONS",
           "abi_prototype", "c_prototype", "TARGETS", "FAMILIES", "MTL", "AbiError", "element_dtype", "ELEMENT_TYPES"]

TARGETS = ("arm64", "x86_64")
FAMILIES = ("Apple7", "Apple8", "Apple9", "Mac2")


class AbiError(LoweringError):
    """A selector missing from the table, or arguments that do not fit its signature."""


class MTL:
    """Metal enum values used by the lowering and the devices (Apple's Metal headers; METAL.md §2)."""

    ResourceStorageModeShared = 0
    ResourceHazardTrackingModeUntracked = 1 << 8
    ResourceUsageRead = 1
    ResourceUsageWrite = 2
    IndirectCommandTypeConcurrentDispatch = 1 << 5
    # MTLCommandBufferStatus
    StatusNotEnqueued, StatusEnqueued, StatusCommitted, StatusScheduled, StatusCompleted, StatusError = range(6)
    STATUS_NAMES = ("NotEnqueued", "Enqueued", "Committed", "Scheduled", "Completed", "Error")
    # MTLCommandBufferError
    ErrorNone = 0
    ErrorInternal = 1
    ErrorTimeout = 2
    ErrorPageFault = 3
    ErrorNotPermitted = 7
    ErrorOutOfMemory = 8
    ErrorInvalidResource = 9
    ERROR_NAMES = {0: "None", 1: "Internal", 2: "Timeout", 3: "PageFault", 4: "AccessRevoked",
                   7: "NotPermitted", 8: "OutOfMemory", 9: "InvalidResource", 10: "Memoryless",
                   11: "DeviceRemoved", 12: "StackOverflow"}
    MAX_ICB_RANGE = 16384  # Apple: the maximum length of executeCommandsInBuffer:withRange:
    MAX_BUFFER_BIND = 31
    MAX_THREADS_PER_THREADGROUP = 1024  # every Apple GPU family (Metal feature set tables)
    CONSTANT_OFFSET_ALIGN = 256  # safe on every family (Metal feature set tables)


@dataclass(frozen=True)
class DeviceSpec:
    """What the lowering needs to know of a device: the GPU family (``Apple7``, ``Apple8``, ``Apple9``, ``Mac2``),
    whether it has residency sets (macOS 15+) and ICB support (paravirtual Metal has neither).

    Raises ``ValueError`` for an unknown family."""

    family: str = "Apple9"
    residency_set: bool = True
    icb: bool = True

    def __post_init__(self) -> None:
        fam = {f.lower(): f for f in FAMILIES}.get(str(self.family).lower())
        if fam is None:
            raise ArgumentError(f"unknown GPU family {self.family!r}: expected one of {', '.join(FAMILIES)}")
        object.__setattr__(self, "family", fam)

    @property
    def needs_warmup(self) -> bool:
        """Pre-Apple9 families fault when an ICB command uses a pipeline the encoder has not bound
        (METAL.md §1 step 5, §3 rule 16)."""
        return self.family in ("Apple7", "Apple8", "Mac2")


# MSL / C spellings of the element types kernels take; a trace writes tinygrad's ``dtypes.<name>``
_ELEMENT_ALIASES = {"float": "float32", "int": "int32", "uint": "uint32", "half": "float16", "bfloat": "bfloat16",
                    "double": "float64", "char": "int8", "uchar": "uint8", "short": "int16", "ushort": "uint16",
                    "long": "int64", "ulong": "uint64"}
ELEMENT_TYPES = frozenset({"bool", *(d.name for d in dtypes.ints), *(d.name for d in dtypes.floats)})


def element_dtype(name: str) -> DType:
    """The dtype of a kernel parameter's element type name: an mtlir dtype name (``"float32"``, ``"int32"``), its
    MSL spelling (``"float"``, ``"int"``, ``"half"``) or a trace's (``"dtypes.float"``, ``"dtypes.int"``).

    Raises ``ValueError`` for anything else (only bool, integer and float scalars are element types)."""
    if not isinstance(name, str):
        raise ArgumentError(f"an element type is a dtype name (e.g. 'float32'), got {type(name).__name__} {name!r}")
    short = name[len("dtypes."):] if name.startswith("dtypes.") else name
    short = _ELEMENT_ALIASES.get(short, short)
    if short not in ELEMENT_TYPES:
        raise ArgumentError(f"unknown element type {name!r}: expected one of {', '.join(sorted(ELEMENT_TYPES))}, an "
                            "MSL name (float, int, half, ...) or a trace's dtypes.<name>")
    return dtypes.by_name(short)


@dataclass(frozen=True)
class KernelParam:
    """One kernel parameter: a ``device`` buffer (``var`` None) or a ``constant int&`` variable (``var`` its
    name), at Metal buffer ``index`` (an int >= 0), of element type ``dtype`` (see ``element_dtype``:
    ``"float32"``, ``"int"``, ``"dtypes.float"``, ...).

    ``elements``, for a buffer parameter: how many elements the kernel reads or writes (a trace signature's
    ``[elements]``). When given, the Queue builder and ``encode`` refuse a buffer or view bound to the parameter
    that holds fewer than ``elements * itemsize`` bytes (a view's size; a buffer's size, from offset 0); a buffer
    variable's size is unknown until run time and is not checked. None (the default): no check.

    Raises ``ValueError`` naming the parameter for an unknown element type or ``float64``/``double`` (Metal has no
    64-bit float), a negative index, an empty variable name or ``elements`` below 1, and ``TypeError`` for a field
    of the wrong type."""

    var: str | None
    index: int
    dtype: str = "float32"
    elements: int | None = None

    def __post_init__(self) -> None:
        what = f"KernelParam({self.var!r}, {self.index!r})"
        if self.var is not None and not isinstance(self.var, str):
            raise TypeError(f"{what}: var is a variable name (str), or None for a buffer, got "
                            f"{type(self.var).__name__}")
        if self.var == "":
            raise ArgumentError(f"{what}: a variable parameter needs a non-empty name")
        if type(self.index) is not int:
            raise TypeError(f"{what}: index is the Metal buffer index (an int), got {type(self.index).__name__}")
        if self.index < 0:
            raise ArgumentError(f"{what}: index {self.index} is negative")
        try:
            element = element_dtype(self.dtype)
        except ValueError as e:
            raise ArgumentError(f"{what}: {e}") from None
        if element is dtypes.float64:
            raise ArgumentError(f"{what}: element type {self.dtype!r} is a 64-bit float, which Metal does not have "
                                "(MSL has no double, MSL spec §2.1): a kernel cannot take one")
        if self.elements is not None:
            if type(self.elements) is not int:
                raise TypeError(f"{what}: elements is an int or None, got {type(self.elements).__name__}")
            if self.elements < 1:
                raise ArgumentError(f"{what}: elements {self.elements} is below 1")

    @property
    def element(self) -> DType:
        """The element dtype (``element_dtype(self.dtype)``)."""
        return element_dtype(self.dtype)


@dataclass(frozen=True)
class Kernel:
    """A compute kernel: the program ``key`` (unique in a queue), the MSL ``function`` name, its Metal source and
    parameters (buffers first, then variables, each at its Metal buffer index).

    The parameters are checked against the MSL's signature of ``function`` when the Kernel is built
    (``mtlir.msl.check_kernel_params``): each at the index of a parameter of the MSL (``[[buffer(n)]]``, else its
    position), of its kind (``device T*`` a buffer, ``constant T&`` a variable) and element type, the buffers and
    the variables each in the MSL's order, none of the MSL's left out. An empty ``msl`` (a kernel described for
    lowering only, which no device can run) is not checked.

    Raises ``TypeError`` for a field of the wrong type (``params`` holds ``KernelParam``s; a list is taken as a
    tuple), ``ValueError`` for an empty key or function name, or two parameters at one buffer index, and
    ``mtlir.msl.KernelSignatureError`` (a ``ValueError``) for parameters that disagree with the MSL, naming the
    kernel, the parameter and both types."""

    key: str
    function: str
    msl: str = field(repr=False)
    params: tuple[KernelParam, ...] = ()

    def __post_init__(self) -> None:
        for name in ("key", "function", "msl"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Kernel {self.key!r}: {name} is a str, got {type(getattr(self, name)).__name__}")
        if not self.key or not self.function:
            raise ArgumentError(f"Kernel {self.key!r}: the key and the function name must be non-empty")
        if isinstance(self.params, list):
            object.__setattr__(self, "params", tuple(self.params))
        if not isinstance(self.params, tuple):
            raise TypeError(f"Kernel {self.key!r}: params is a tuple of KernelParam, got {type(self.params).__name__}")
        seen: set[int] = set()
        for j, p in enumerate(self.params):
            if not isinstance(p, KernelParam):
                raise TypeError(f"Kernel {self.key!r}: parameter {j} is a {type(p).__name__}, not a KernelParam")
            if p.index in seen:
                raise ArgumentError(f"Kernel {self.key!r}: two parameters at buffer index {p.index}")
            seen.add(p.index)
        if self.msl:
            check_kernel_params(self.key, self.function, self.msl, self.params)

    @property
    def buffer_params(self) -> tuple[KernelParam, ...]:
        """The ``device`` buffer parameters (``var`` None), in parameter order."""
        return tuple(p for p in self.params if p.var is None)

    @property
    def var_params(self) -> tuple[KernelParam, ...]:
        """The ``constant int&`` variable parameters (``var`` their name), in parameter order."""
        return tuple(p for p in self.params if p.var is not None)


@dataclass(frozen=True)
class Obj:
    """A placeholder for a device object link creates once (docs/internals.md lists the kinds)."""

    kind: str
    name: str
    payload: tuple[Any, ...] = ()

    def __repr__(self) -> str:
        return f"Obj({self.kind!r}, {self.name!r}{', ' + repr(self.payload) if self.payload else ''})"


@dataclass(frozen=True)
class Signature:
    """A selector's Metal signature: return dtype and argument dtypes (self and _cmd not included)."""

    ret: DType
    args: tuple[DType, ...] = ()


@dataclass(frozen=True)
class Prototype:
    """The exact C prototype of one foreign call after the abi pass (for objc_msgSend: self and _cmd included)."""

    ret: DType
    args: tuple[DType, ...]

    def __hash__(self) -> int:
        # computed once: every CALLS node hashes the Prototype of each of its calls when it is built
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.ret, self.args))
        return h

    def __repr__(self) -> str:
        return f"{self.ret.name}({', '.join(a.name for a in self.args)})"


_id, _u64, _bool, _void, _ptr = dtypes.id, dtypes.uint64, dtypes.bool, dtypes.void, dtypes.voidptr
_S = Signature

SELECTORS: dict[str, Signature] = {
    # MTLDevice
    "newCommandQueueWithMaxCommandBufferCount:": _S(_id, (_u64,)),
    "newSharedEvent": _S(_id), "newFence": _S(_id),
    "newBufferWithLength:options:": _S(_id, (_u64, _u64)),
    "newLibraryWithSource:options:error:": _S(_id, (_id, _id, _ptr)),
    "newComputePipelineStateWithDescriptor:options:reflection:error:": _S(_id, (_id, _u64, _ptr, _ptr)),
    "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:": _S(_id, (_id, _u64, _u64)),
    "newResidencySetWithDescriptor:error:": _S(_id, (_id, _ptr)),
    # MTLLibrary
    "newFunctionWithName:": _S(_id, (_id,)),
    # MTLCommandQueue
    "commandBuffer": _S(_id), "addResidencySet:": _S(_void, (_id,)),
    # MTLCommandBuffer
    "computeCommandEncoder": _S(_id),
    "encodeSignalEvent:value:": _S(_void, (_id, _u64)), "encodeWaitForEvent:value:": _S(_void, (_id, _u64)),
    "commit": _S(_void), "waitUntilCompleted": _S(_void),
    "status": _S(_u64), "error": _S(_id),
    "GPUStartTime": _S(dtypes.float64), "GPUEndTime": _S(dtypes.float64),
    # MTLComputeCommandEncoder
    "waitForFence:": _S(_void, (_id,)), "updateFence:": _S(_void, (_id,)),
    "useResources:count:usage:": _S(_void, (_ptr, _u64, _u64)),
    "setComputePipelineState:": _S(_void, (_id,)),
    "dispatchThreadgroups:threadsPerThreadgroup:": _S(_void, (dtypes.MTLSize, dtypes.MTLSize)),
    "executeCommandsInBuffer:withRange:": _S(_void, (_id, dtypes.NSRange)),
    "endEncoding": _S(_void),
    "setBuffer:offset:atIndex:": _S(_void, (_id, _u64, _u64)),
    "setBytes:length:atIndex:": _S(_void, (_ptr, _u64, _u64)),
    # MTLCommandBuffer -> MTLBlitCommandEncoder (copies and fills between buffers; on macOS offsets and sizes are
    # multiples of 4: Apple's documentation of copyFromBuffer:... and fillBuffer:range:value:)
    "blitCommandEncoder": _S(_id),
    "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:": _S(_void, (_id, _u64, _id, _u64, _u64)),
    "fillBuffer:range:value:": _S(_void, (_id, dtypes.NSRange, dtypes.uint8)),
    # MTLSharedEvent
    "signaledValue": _S(_u64), "setSignaledValue:": _S(_void, (_u64,)),
    "waitUntilSignaledValue:timeoutMS:": _S(_bool, (_u64, _u64)),
    # MTLIndirectCommandBuffer and its compute commands
    "indirectComputeCommandAtIndex:": _S(_id, (_u64,)),
    "setKernelBuffer:offset:atIndex:": _S(_void, (_id, _u64, _u64)),
    "concurrentDispatchThreadgroups:threadsPerThreadgroup:": _S(_void, (dtypes.MTLSize, dtypes.MTLSize)),
    "setBarrier": _S(_void),
    # MTLBuffer
    "gpuAddress": _S(_u64), "contents": _S(_ptr), "length": _S(_u64),
    # MTLComputePipelineState
    "maxTotalThreadsPerThreadgroup": _S(_u64),
    # MTLDevice: the largest MTLBuffer it creates, in bytes (newBufferWithLength:options: returns nil above it)
    "maxBufferLength": _S(_u64),
    # MTLResidencySet
    "addAllocation:": _S(_void, (_id,)), "removeAllocation:": _S(_void, (_id,)),
    # NSString, NSError, NSObject
    "stringWithUTF8String:": _S(_id, (_ptr,)),
    "new": _S(_id), "alloc": _S(_id), "init": _S(_id),
    "retain": _S(_id), "release": _S(_void), "setLabel:": _S(_void, (_id,)),
    "code": _S(dtypes.int64), "localizedDescription": _S(_id), "UTF8String": _S(_ptr),
    # descriptors
    "setComputeFunction:": _S(_void, (_id,)), "setSupportIndirectCommandBuffers:": _S(_void, (_bool,)),
    "setCommandTypes:": _S(_void, (_u64,)), "setInheritBuffers:": _S(_void, (_bool,)),
    "setInheritPipelineState:": _S(_void, (_bool,)), "setMaxKernelBufferBindCount:": _S(_void, (_u64,)),
}

C_FUNCTIONS: dict[str, Prototype] = {
    "MTLCreateSystemDefaultDevice": Prototype(_id, ()),
    "sel_registerName": Prototype(dtypes.SEL, (_ptr,)),
    "objc_getClass": Prototype(_id, (_ptr,)),
    "objc_autoreleasePoolPush": Prototype(_ptr, ()),
    "objc_autoreleasePoolPop": Prototype(_void, (_ptr,)),
}


@functools.lru_cache(maxsize=None)
def abi_prototype(selector: str, target: str) -> Prototype:
    """The exact C prototype of ``objc_msgSend`` for ``selector`` on ``target`` (``"arm64"`` or ``"x86_64"``); one
    object per (selector, target), so nodes built with it key it once.

    Raises ``AbiError`` for a selector missing from the table or an unknown target."""
    if target not in TARGETS:
        raise AbiError(f"unknown target {target!r}: expected arm64 or x86_64")
    sig = SELECTORS.get(selector)
    if sig is None:
        raise AbiError(f"selector {selector!r} is not in the selector table (mtlir.metal.SELECTORS)")
    args: list[DType] = [dtypes.id, dtypes.SEL]
    for a in sig.args:
        if a is dtypes.NSRange:
            args += [dtypes.uint64, dtypes.uint64]
        elif a is dtypes.MTLSize:
            args.append(PtrDType(dtypes.MTLSize) if target == "arm64" else dtypes.MTLSize)
        else:
            args.append(a)
    return Prototype(sig.ret, tuple(args))


def c_prototype(fn: str) -> Prototype:
    """The C prototype of a C function a program calls; raises ``AbiError`` when it is unknown."""
    proto = C_FUNCTIONS.get(fn)
    if proto is None:
        raise AbiError(f"C function {fn!r} is not in mtlir.metal.C_FUNCTIONS")
    return proto

"""SimDevice: the simulated Metal device, and the Bridge a Program runs on (docs/internals.md, docs/simulator.md).

``SimDevice`` *is* the Bridge: ``sel_registerName``, ``objc_getClass``, ``c_call``, ``msg_send`` and host memory.
It owns the object table (64-bit handles at or above 2**32; a deallocated object stays known as a zombie so a
message to it is refused by name), the autorelease pools, the host address space (``memory``), and the GPU
(``gpu``) that runs committed command buffers. What each selector does lives in ``methods`` (``resources``,
``encoding``, ``icb``), joined here into ``METHODS``; the rules of METAL.md §3 in ``rules`` (``Rule``, ``checks``);
the decoding of a message's arguments in ``msgsend``; what a deallocation frees in ``lifetime``.

One lock guards all of it; blocking calls (``commandBuffer`` at the in-flight limit, ``waitUntilCompleted``,
``waitUntilSignaledValue:timeoutMS:``) wait on its condition with a timeout, and the GPU releases it while a
kernel runs, so work really is in flight while the program goes on.
"""
from __future__ import annotations

import itertools
import math
import numbers
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from mtlir.ir.dtypes import dtypes
from mtlir.metal import C_FUNCTIONS, MTL, SELECTORS, TARGETS, DeviceSpec, Prototype, abi_prototype
from mtlir.errors import ArgumentError, BridgeError, DeviceClosedError
from mtlir.runtime.metal.bridge import host_target
from mtlir.runtime.sim.methods import encoding, icb, resources
from mtlir.runtime.sim.msgsend import (ArgumentDecoder, Method, MethodTable, check_prototype, compile_call,
                                      decode_word, result_value)
from mtlir.runtime.sim.gpu import GPU, OVERLAP_S
from mtlir.runtime.sim.hooks import DeviceHooks
from mtlir.runtime.sim.host_memory import HostCalls
from mtlir.runtime.sim.senders import Senders, _Inline
from mtlir.runtime.sim.waiting import DeviceWaits
from mtlir.runtime.sim.injection import Fault, FaultPlan
from mtlir.runtime.sim.lifetime import dealloc
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.bridge.memory import HostMemory
from mtlir.runtime.sim.objects import ClassObject, Device, NSError, NSString, SimObject, zombie_text
from mtlir.runtime.sim.methods.resources import CLASSES

__all__ = ["SimDevice", "METHODS"]

# Every selector the simulated device answers: the handlers of each methods module, in one table.
METHODS = MethodTable.join(resources.METHODS, encoding.METHODS, icb.METHODS)

_HANDLE_BASE = 0x6000_0000_4000   # object handles: like macOS arm64 heap pointers, far above 2**32
_HANDLE_STEP = 0x40
# Each SimDevice of a process hands out handles from a block of its own (as a process's Metal objects never share an
# address), so a handle of one device is never a live object of another: sent to the wrong device it is refused
# naming its device, not taken for whatever object that device numbered the same
_DEVICE_BLOCK = 1 << 36
_DEVICE_BLOCKS = 1 << 10
_devices_made = itertools.count()
_SEL_BASE = 0x1_9000_0000         # SELs: pointers into libobjc's selector table on a Mac, above 2**32 too
_POOL_BASE = 0x1_7000_0000
_ZOMBIES = 1 << 16                # deallocated objects remembered for "message sent to deallocated instance"
_CUT = " (a 64-bit handle cut to 32 bits?)"
_ROUTES = 1 << 12                 # (SEL, class) pairs msg_send keeps resolved (then all are dropped)


class _Route:
    """What a (SEL, receiver class) pair resolved to in ``SimDevice.msg_send``: the method, the selector's decoder
    and name, the return type, and ``call``: the method with the arguments' decoding and the result's conversion
    generated for it (``msgsend.compile_call``)."""

    __slots__ = ("method", "decoder", "name", "ret", "call")

    def __init__(self, method: Method, decoder: ArgumentDecoder, name: str, dev: SimDevice) -> None:
        self.method, self.decoder, self.name = method, decoder, name
        self.ret = decoder.proto.ret
        self.call = compile_call(name, method, decoder, dev._objects, dev._lookup, dev.memory)


def _seconds(name: str, value: object) -> float:
    """A timeout argument as seconds: a finite real number >= 0. Raises ``TypeError`` (not a number: a string, a
    bool, None) or ``ArgumentError`` (negative, NaN, infinite) naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: seconds are a number, got {type(value).__name__} {value!r}")
    try:
        seconds = float(value) + 0.0
    except OverflowError:
        seconds = math.inf
    if not 0 <= seconds < math.inf:
        raise ArgumentError(f"{name}: {value!r} seconds: a finite number >= 0 is needed (every wait has a timeout)")
    return seconds


class SimDevice(HostCalls, DeviceHooks, DeviceWaits, Senders):
    """A simulated Metal device and its Bridge.

    ``target``: the ABI ``msg_send`` decodes (``"arm64"``, ``"x86_64"``; default: this machine's,
    ``mtlir.runtime.metal.bridge.host_target()``, and x86_64 on a machine that is neither). ``strict``:
    True (default) raises ``MetalValidationError`` at the offending call like ``MTL_DEBUG_LAYER=1``; False is
    faithful: what Metal does without the layer (status Error, dropped dispatches, blocking, races).
    ``family``: ``Apple7``/``Apple8``/``Apple9``/``Mac2`` (pre-Apple9 needs the ICB warm-up, rule 16).
    ``residency_sets``/``icb``: whether newResidencySetWithDescriptor:error: and
    newIndirectCommandBufferWithDescriptor:... return objects (macOS 15+; paravirtual Metal has neither).
    ``autorun``: True runs committed work on a worker thread; False holds the GPU until ``step()`` or
    ``run_until_idle()``. ``timeout_s``: the longest any CPU-side wait blocks (then ``TimeoutError``).
    ``gpu_timeout_s``: the GPU watchdog: a command buffer blocked on a fence or event that long ends in Error,
    Timeout (2). ``kernel_timeout_s``: the watchdog of one kernel: a kernel making no progress that long ends its
    command buffer in Error, Timeout (2) (longer than ``gpu_timeout_s``: the kernels run on an OpenCL device, a CPU
    by default, often 10-1000x slower than an Apple GPU; a longer ``mtlir run --timeout`` raises it).
    ``kernel_runner``: compiles MSL (default: ``mtlir.runtime.sim.kernels.runner.KernelRunner`` on
    the OpenCL device ``opencl_device`` names: an index into ``list_devices()`` or a substring of its platform or
    device name, ``select_device``; None: the first device).
    ``constant_align``: the offset alignment required of ``constant`` buffer bindings in bytes (METAL.md §1).
    ``order_seed``: the commands between two ICB barriers run last first (None), or shuffled from this seed (an int
    >= 0; rule 9, docs/simulator.md "Concurrent commands"). ``checked``: run every kernel translated without
    mtlir's bounds checks on Oclgrind, which reports out-of-bounds accesses and data races as ``KernelCheckError``
    (``mtlir.runtime.sim.kernels.oclgrind``; the ``opencl_device`` is then Oclgrind's).
    ``faults``: faults to inject, armed at once (``inject``: ``"0:PageFault"``, ``"1:hang"``, ``"alloc:buffer"``,
    or ``Fault`` values; docs/reliability.md). ``overlap_s``: a pipelining host's commits wake the worker thread at
    once only while the recent kernel batches ran at least this long (seconds >= 0, inf: never; ``GPU.lazy``,
    docs/simulator.md; ``TypeError``/``ArgumentError`` for anything else).

    ``bridge`` is the device itself. Raises ``ValueError`` for an unknown target or family, ``ArgumentError``
    for both ``kernel_runner`` and ``opencl_device``, ``TypeError``/``ArgumentError`` for a timeout that is not a
    finite number of seconds >= 0 (every wait has one: an infinite or NaN one would never end).
    """

    def __init__(self, target: str | None = None, *, strict: bool = True, family: str = "Apple9",
                 residency_sets: bool = True, icb: bool = True, autorun: bool = True, timeout_s: float = 10.0,
                 gpu_timeout_s: float = 2.0, kernel_timeout_s: float = 60.0, kernel_runner: Any = None,
                 opencl_device: str | int | None = None,
                 order_seed: int | None = None, checked: bool = False,
                 constant_align: int = MTL.CONSTANT_OFFSET_ALIGN, max_buffer_length: int = 1 << 32,
                 faults: Iterable[str | Fault] = (), overlap_s: float = OVERLAP_S) -> None:
        target = (host_target() or "x86_64") if target is None else target
        if target not in TARGETS:
            raise ArgumentError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")
        self.target = target
        self.strict = strict
        self.spec = DeviceSpec(family, residency_sets, icb)
        self.autorun = autorun
        self.timeout_s = _seconds("timeout_s", timeout_s)
        self.gpu_timeout_s = _seconds("gpu_timeout_s", gpu_timeout_s)
        self.kernel_timeout_s = _seconds("kernel_timeout_s", kernel_timeout_s)
        self.closed = False  # close() was called: a Session's close then sends nothing (docs/runtime.md)
        self.constant_align = constant_align
        self.max_buffer_length = max_buffer_length
        self.order_seed, self.checked = order_seed, bool(checked)
        self.memory = HostMemory()
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._objects: dict[int, SimObject] = {}
        self._zombies: OrderedDict[int, str | tuple[str, int, str, str]] = OrderedDict()
        self.number = next(_devices_made)  # this process's SimDevices in order of making: #0, #1, ...
        self._next_handle = _HANDLE_BASE + (self.number % _DEVICE_BLOCKS) * _DEVICE_BLOCK
        self._sel_ids: dict[str, int] = {}
        self._sel_names: dict[int, str] = {}
        self._decoders: dict[str, ArgumentDecoder] = {}
        # (SEL, the receiver's class) -> what a message of that pair resolved to (``msg_send``'s fast path)
        self._routes: dict[tuple[int, type], _Route] = {}
        # (id(prototype), SEL) -> (the prototype, its sender): ``sender``'s functions, made once per pair
        self._senders: dict[tuple[Any, ...], tuple[Prototype, Callable[[Any], Any]]] = {}
        self._inline: dict[tuple[int, Any], _Inline] = {}  # the same pairs: their generated functions
        # each thread's autorelease pool stack (Objective-C's pools are per thread: a pop on one thread never drains
        # another thread's objects), by ``threading.get_ident()``; a thread's entry goes when its stack empties
        self._pools_of: dict[int, list[tuple[int, list[SimObject]]]] = {}
        self._next_pool = _POOL_BASE
        self._classes: dict[str, ClassObject] = {}
        if kernel_runner is not None and opencl_device is not None:
            raise ArgumentError("give SimDevice a kernel_runner or an opencl_device, not both")
        self._runner = kernel_runner
        self._checks: Any = None  # checked mode's hook on the runner (kernels/oclgrind.py CheckedRuns): close stops it
        self._opencl_device = opencl_device
        self._gpu_va = 0x3_0000_0000
        self.leaked_autoreleased = 0
        self._deferred: Exception | None = None
        self.waits_encoded = False  # an encodeWaitForEvent:value: was sent (a commit's deadlock test needs one)
        self.faults = FaultPlan()
        self.gpu = GPU(self)
        self.gpu.overlap_s = overlap_s
        self.device = self._register(Device())
        self.inject(*faults)

    @property
    def bridge(self) -> SimDevice:
        """The Bridge of this device: the device itself."""
        return self

    @property
    def family(self) -> str:
        """The GPU family (``Apple7``, ``Apple8``, ``Apple9``, ``Mac2``)."""
        return self.spec.family

    @property
    def kernel_runner(self) -> Any:
        """The MSL compiler/runner (created at first use: building an OpenCL context takes a moment)."""
        if self._runner is None:
            self._runner = KernelRunner(self._opencl_device)
            if self.checked:  # every launch run on Oclgrind first (kernels/oclgrind.py)
                from mtlir.runtime.sim.kernels.oclgrind import CheckedRuns
                self._checks = self._runner.checker = CheckedRuns(self)
        return self._runner

    def choose_opencl_device(self, which: str | int) -> None:
        """Run the kernels on the OpenCL device ``which`` (as ``opencl_device``: an index or a name substring),
        chosen before the first kernel is built (``mtlir run --opencl-device``). Raises ``ArgumentError`` once a
        kernel runner exists; ``NoDeviceError`` (at the first build) when no device matches."""
        if self._runner is not None:
            raise ArgumentError(f"the kernels already run on {self.opencl_device_name or 'a given kernel runner'}: "
                                "choose the OpenCL device before the first kernel is built")
        self._opencl_device = which

    @property
    def opencl_device_name(self) -> str | None:
        """``"platform / device"`` of the OpenCL device the kernels run on; None before the first kernel is built
        or where the kernel runner is not on OpenCL (``PyKernelRunner``)."""
        name = getattr(self._runner, "device_name", None)
        return name if isinstance(name, str) else None

    # ------------------------------------------------------------------ objects
    def _register(self, obj: SimObject) -> Any:
        obj.handle = self._next_handle
        self._next_handle += _HANDLE_STEP
        self._objects[obj.handle] = obj
        return obj

    @property
    def order_seed(self) -> int | None:
        """The order of concurrent ICB commands and of the queues' heads: None (last first, the queues in commit
        order) or a seed (an int >= 0) to shuffle them. Set it at any time; ``ArgumentError`` (a ``ValueError``)
        for anything else (a str, a bool, a negative or fractional number): checked when set, not when the GPU
        next reads it."""
        return self._order_seed

    @order_seed.setter
    def order_seed(self, seed: int | None) -> None:
        if seed is not None and (type(seed) is not int or seed < 0):
            raise ArgumentError(f"order_seed is an int >= 0 or None, got {seed!r}")
        self._order_seed = seed
        if hasattr(self, "gpu"):
            self.gpu._shuffle = None  # the next shuffle starts from the new seed

    def new(self, obj: SimObject) -> Any:
        """Register a new +1 object (a ``new...`` result)."""
        return self._register(obj)

    def new_autoreleased(self, obj: SimObject) -> Any:
        """Register a new +0 object: owned by the innermost autorelease pool (leaked when there is none, as
        Objective-C does)."""
        self._register(obj)
        self.autorelease(obj)
        return obj

    def autorelease(self, obj: SimObject) -> None:
        """Hand one reference of ``obj`` to the calling thread's innermost autorelease pool."""
        pools = self._pools_of.get(threading.get_ident())
        if pools:
            pools[-1][1].append(obj)
        else:
            self.leaked_autoreleased += 1

    def object(self, handle: int) -> SimObject:
        """The live object with this handle (for tests and tools). Raises ``BridgeError`` like a message would."""
        with self._lock:
            return self._lookup(handle, "object")

    def name_object(self, handle: int, name: str) -> None:
        """Give the live object ``handle`` the Program's name for it (link calls this for every object it makes, as
        for a RecordingBridge): error messages then name it (``MTLCommandQueue 0x600000004080 (queue:a)``).
        Host-side only: Metal's ``label`` and the messages stay as they are. An unknown handle is left alone."""
        with self._lock:
            obj = self._objects.get(handle) if type(handle) is int else None
            if obj is not None and not isinstance(obj, ClassObject):
                obj.link_name = name

    def _lookup(self, handle: Any, where: str) -> SimObject:
        obj = self._objects.get(handle) if type(handle) is int else None
        if obj is not None:
            return obj
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise BridgeError(f"{where}: {handle!r} is not an object handle (an integer)")
        dead = self._zombies.get(handle)
        if dead is not None:
            raise BridgeError(f"{where}: message sent to deallocated instance {zombie_text(dead)}")
        block, mine = divmod(handle - _HANDLE_BASE, _DEVICE_BLOCK)[0], self.number % _DEVICE_BLOCKS
        if 0 <= block < _DEVICE_BLOCKS and block != mine:
            raise BridgeError(f"{where}: {handle:#x} is a handle of another SimDevice (#{block} of this process, "
                              f"modulo {_DEVICE_BLOCKS}), not of this one (#{self.number}): objects of one device "
                              "cannot be used with another")
        raise BridgeError(f"{where}: unknown object {handle:#x}" + (_CUT if 0 < handle < 1 << 32 else ""))

    def retain(self, obj: SimObject) -> SimObject:
        """+1 on ``obj`` (class objects are immortal)."""
        if not isinstance(obj, ClassObject):
            obj.rc += 1
        return obj

    def release(self, obj: SimObject, call: str, *, at_host: bool = True) -> None:
        """-1 on ``obj``; at zero it is deallocated (rule 2 and 14 are checked then). ``at_host``: the host's own
        release (a message, a pool pop), which strict mode may refuse; False for a reference the device held."""
        if isinstance(obj, ClassObject):
            return
        if obj.rc > 1:
            obj.rc -= 1
            return
        dealloc(self, obj, call, at_host)

    def _release_internal(self, obj: SimObject, call: str = "the GPU's release") -> None:
        """Drop a reference the device itself held (the GPU's on a committed command buffer, a command buffer's on
        what was encoded into it). Never raises for rule 14: what it frees is checked with ``at_host=False``."""
        if obj.alive:
            self.release(obj, call, at_host=False)

    def retire(self, obj: SimObject) -> None:
        """Take a deallocated ``obj`` out of the object table; its handle stays known as a zombie (the last
        ``_ZOMBIES`` of them), so a message to it is refused as "sent to deallocated instance"."""
        del self._objects[obj.handle]
        self._zombies[obj.handle] = obj.zombie()  # formatted when a message names it (zombie_text)
        if len(self._zombies) > _ZOMBIES:
            self._zombies.popitem(last=False)

    def defer_error(self, error: Exception) -> None:
        """Raise ``error`` at the host's next message or C call to the device (once): how strict mode reports what
        only the GPU sees, such as a kernel's out-of-bounds access, after the call that caused it has returned. The
        first error waiting wins. The error gets ``deferred = True``: the call it surfaces at did not cause it, so
        the executors do not name that call's instruction in a note."""
        if self._deferred is None:
            setattr(error, "deferred", True)
            self._deferred = error

    def _raise_deferred(self, call: Any = None) -> None:
        """Raise the error ``defer_error`` left (once), or, on a closed device, a ``DeviceClosedError`` naming the
        ``call`` (a C function's name, or a message's arguments: the receiver and the SEL), at every call."""
        if self.closed:
            raise self._closed_error(call)
        error, self._deferred = self._deferred, None
        if error is not None:
            raise error

    def _closed_error(self, call: Any) -> DeviceClosedError:
        """The error of a call to this device after ``close()``: ``call`` as ``_raise_deferred``'s."""
        if isinstance(call, tuple) and len(call) >= 2:
            sel = self._sel_names.get(call[1]) if type(call[1]) is int else None
            obj = self._objects.get(call[0]) if type(call[0]) is int else None
            what = f"{sel or 'a message'} sent to {obj.describe() if obj is not None else repr(call[0])}"
        else:
            what = str(call or "a call")
        return DeviceClosedError(f"{what}: SimDevice #{self.number} is closed (SimDevice.close() was called: its GPU "
                                 "is stopped, committed work that had not run never runs, and the device answers "
                                 "no more calls): make a new SimDevice")

    def _make_error(self, code: int, description: str, domain: str = "MTLCommandBufferErrorDomain") -> NSError:
        """A new NSError (+1, the caller owns it) with its localizedDescription."""
        text = self._register(NSString(description))
        return self._register(NSError(domain, code, text))  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ Bridge: runtime functions
    def sel_registerName(self, name: str) -> int:
        """The SEL for ``name`` (any name registers, as in libobjc; messaging an unknown one is refused)."""
        if not isinstance(name, str) or not name:
            raise BridgeError(f"sel_registerName: the name must be a non-empty str, got {name!r}")
        if self.closed:
            raise self._closed_error(f"sel_registerName({name!r})")
        with self._lock:
            sel = self._sel_ids.get(name)
            if sel is None:
                sel = _SEL_BASE + 0x10 * len(self._sel_ids)
                self._sel_ids[name], self._sel_names[sel] = sel, name
            return sel

    def objc_getClass(self, name: str) -> int:
        """The class object named ``name`` (NSString, NSObject, the descriptor classes, MTLCompileOptions).
        Raises ``BridgeError`` for any other name."""
        if self.closed:
            raise self._closed_error(f"objc_getClass({name!r})")
        with self._lock:
            cls = self._classes.get(name)
            if cls is None:
                make = CLASSES.get(name)
                if make is None:
                    raise BridgeError(f"objc_getClass({name!r}): no such class in the simulated runtime (it has "
                                      f"{', '.join(sorted(CLASSES))})")
                cls = self._classes[name] = self._register(ClassObject(name, make))
            return cls.handle

    def c_call(self, fn: str, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """Call a C function of mtlir.metal.C_FUNCTIONS: MTLCreateSystemDefaultDevice (the device, +1),
        sel_registerName/objc_getClass (a C string pointer), objc_autoreleasePoolPush/Pop. Raises
        ``BridgeError`` for another function, a prototype that differs from the table, a wrong argument count."""
        if self._deferred is not None:
            self._raise_deferred(fn)
        expected = C_FUNCTIONS.get(fn)
        if expected is None:
            raise BridgeError(f"unknown C function {fn!r}: the simulated device offers {', '.join(C_FUNCTIONS)}")
        if proto is not expected and proto != expected:  # the table's own prototype: no field compare
            raise BridgeError(f"{fn}: prototype {proto!r} differs from the C function's {expected!r}")
        if len(args) != len(expected.args):
            raise BridgeError(f"{fn}: takes {len(expected.args)} arguments, got {len(args)}")
        if fn == "objc_autoreleasePoolPush":  # the pool's two first: every submit calls them
            with self._lock:
                token = self._next_pool
                self._next_pool += 0x10
                me = threading.get_ident()
                pools = self._pools_of.get(me)
                if pools is None:
                    pools = self._pools_of[me] = []
                pools.append((token, []))
                return token
        if fn == "objc_autoreleasePoolPop":
            return self.pool_pop(args[0])
        if fn == "MTLCreateSystemDefaultDevice":
            with self._lock:
                return self.retain(self.device).handle
        name = self.read_cstring(decode_word(fn, 1, dtypes.voidptr, args[0]))  # sel_registerName, objc_getClass
        return self.sel_registerName(name) if fn == "sel_registerName" else self.objc_getClass(name)

    def pool_pop(self, token: int) -> None:
        """objc_autoreleasePoolPop: drain the pool ``token`` and every pool the calling thread pushed after it,
        releasing their objects newest first; the first error (rule 2, 14) is raised after the drain. A token of
        another thread's stack is a ``BridgeError`` saying so (pools are per thread in Objective-C)."""
        with self._lock:
            me = threading.get_ident()
            pools = self._pools_of.get(me, [])
            if len(pools) == 1 and pools[0][0] == token:  # the thread's only pool (a submit's): no slices
                del self._pools_of[me]
                self._drain(pools[0][1])
                return
            if pools and pools[-1][0] == token:  # the innermost pool: the usual pop
                at: int | None = len(pools) - 1
            else:
                at = next((i for i, (t, _) in enumerate(pools) if t == token), None)
            if at is None:
                other = any(t == token for ident, stack in self._pools_of.items() if ident != me for t, _ in stack)
                raise BridgeError(f"objc_autoreleasePoolPop({token!r}): "
                                  + ("a pool pushed on another thread (autorelease pools are per thread)" if other
                                     else "not a pool that is pushed")
                                  + (_CUT if isinstance(token, int) and 0 < token < 1 << 32 else ""))
            drained = pools[at:]
            del pools[at:]
            if not pools:
                self._pools_of.pop(me, None)
            self._drain([obj for _, objs in drained for obj in objs])

    def _drain(self, objs: list[SimObject]) -> None:
        """Release the objects of drained pools, newest first (``objs`` in the order they were autoreleased); the
        first error (rule 2, 14, an over-release) is raised after the drain. Called with the lock held."""
        first: Exception | None = None
        for obj in reversed(objs):
            if not obj.alive:
                first = first or BridgeError(f"objc_autoreleasePoolPop: over-release of deallocated "
                                             f"{obj.describe()}")
                continue
            try:
                self.release(obj, "objc_autoreleasePoolPop")
            except Exception as e:
                first = first or e
        if first is not None:
            raise first

    # ------------------------------------------------------------------ Bridge: objc_msgSend
    def msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """objc_msgSend(receiver, SEL, ...) through exactly ``proto`` (docs/internals.md). Returns an int (ids,
        integers, pointers), a float (double), a bool (BOOL) or None (void).

        Raises ``BridgeError`` for an unknown SEL or selector, a prototype other than
        ``abi_prototype(selector, target)``, a wrong argument count, a value that does not fit its type, an
        unknown, truncated or deallocated object, a selector the receiver's class does not answer; and
        ``MetalValidationError`` for broken rules of METAL.md §3 (strict mode, and asserts in both modes), and for
        an error the GPU found since the last message (``defer_error``: strict mode's out-of-bounds accesses)."""
        if self._deferred is not None:  # also set on a closed device (close): one test for both
            self._raise_deferred(args)
        if len(args) < 2:
            raise BridgeError(f"objc_msgSend needs (self, _cmd, ...), got {len(args)} arguments")
        recv, sel = args[0], args[1]
        obj = self._objects.get(recv) if type(recv) is int else None
        if obj is not None and type(sel) is int:  # the fast path: the selector resolved before for this class
            route = self._routes.get((sel, type(obj)))
            if route is not None and id(proto) in route.decoder.seen and len(args) == route.decoder.nargs:
                method = route.method
                if method.lockless:
                    if self.gpu.unwoken and self.gpu.polling(obj):  # a host may be polling: the GPU starts now
                        with self._lock:
                            self.gpu.wake()
                    return result_value(route.ret, method.fn(self, obj))
                else:
                    with self._lock:
                        if self.gpu.fresh is not None:  # the host goes on encoding after a commit
                            self.gpu.moved_on()
                        if self._objects.get(recv) is obj:
                            return route.call(self, obj, args)
        return self._msg_send(proto, args)

    _plain_msg_send = msg_send  # (``Senders.sender``: a subclass's own msg_send is called as it is)

    def _msg_send(self, proto: Prototype, args: tuple[Any, ...]) -> Any:
        """``msg_send`` in full: every look-up and check, then the route of the pair kept for the fast path."""
        sel = args[1]
        name = self._sel_names.get(sel) if type(sel) is int else None
        if name is None:
            raise BridgeError(f"objc_msgSend: {sel!r} is not a registered SEL"
                              + (" (a 64-bit SEL cut to 32 bits?)" if isinstance(sel, int) and 0 < sel < 1 << 32
                                 else ""))
        decoder = self._decoders.get(name)
        if decoder is None:
            if name not in SELECTORS:
                raise BridgeError(f"unknown selector {name!r}: it is not in mtlir.metal.SELECTORS, and the "
                                  "simulated device answers no other")
            decoder = self._decoders[name] = ArgumentDecoder(abi_prototype(name, self.target))
        expected = decoder.proto
        if id(proto) not in decoder.seen:  # the fields compared once per prototype object, then its id suffices
            if proto != expected:
                check_prototype(name, proto, expected, self.target)
            if len(decoder.held) < 16:
                decoder.held.append(proto)
                decoder.seen.add(id(proto))
        if len(args) != decoder.nargs:
            raise BridgeError(f"{name}: wrong argument count: {len(args) - 2} after self and _cmd, the prototype "
                              f"has {decoder.nargs - 2}")
        recv = args[0]
        seen = self._objects.get(recv) if type(recv) is int else None
        method = None
        if seen is not None:
            method = METHODS.lookup(type(seen), name)
            if method is not None and method.lockless:
                self._route(sel, seen, method, decoder, name)
                if self.gpu.unwoken and self.gpu.polling(seen):
                    with self._lock:
                        self.gpu.wake()
                return result_value(expected.ret, method.fn(self, seen))
        with self._lock:
            if self.gpu.fresh is not None:
                self.gpu.moved_on()
            if recv == 0 and type(recv) is int:
                if self.strict:
                    raise BridgeError(f"{name} sent to nil (Objective-C would return 0: a missing object?)")
                return None if expected.ret is dtypes.void else 0.0 if expected.ret.kind == "float" else 0
            obj = self._objects.get(recv) if type(recv) is int else None
            if obj is None:
                obj = self._lookup(recv, f"{name} (receiver)")
            if obj is not seen:  # deallocated (or replaced) since the look-up without the lock
                method = METHODS.lookup(type(obj), name)
            if method is None:
                raise BridgeError(f"-[{obj.objc_class} {name}]: unrecognized selector sent to instance {recv:#x}")
            result = method.fn(self, obj, *decoder.decode(name, args, method, self._objects, self._lookup,
                                                           self.memory) if decoder.kinds else ())
            self._route(sel, obj, method, decoder, name)
            return result_value(expected.ret, result)

    def _route(self, sel: int, obj: SimObject, method: Method, decoder: ArgumentDecoder, name: str) -> None:
        """Keep what ``sel`` resolved to for ``obj``'s class, for ``msg_send``'s fast path (at most ``_ROUTES``,
        then all are dropped; no object is held). The fast path still checks the prototype (one seen before for the
        selector), the argument count, that the receiver is a live object (under the lock, except for a lockless
        getter) and decodes every argument."""
        if len(self._routes) >= _ROUTES:
            self._routes.clear()
        self._routes[(sel, type(obj))] = _Route(method, decoder, name, self)

    def make_string(self, s: str) -> int:
        """An NSString (+0, autoreleased) holding ``s``."""
        with self._lock:
            return self.new_autoreleased(NSString(str(s))).handle  # type: ignore[no-any-return]

    def read_cstring(self, addr: int) -> str:
        """The NUL-terminated UTF-8 string at host address ``addr``."""
        return self.memory.read_cstring(addr)

    def close(self) -> None:
        """Stop the GPU worker thread (committed work that has not run stays unrun). It does not wait for a kernel
        that is still running (``kernel_running``): OpenCL cannot stop one, and one past its timeout may never end.
        In checked mode the device's Oclgrind checks in flight are killed (their command buffer ends in Error).
        Sets ``closed``: from then on every message and C call to the device (``msg_send``, ``c_call``,
        ``sel_registerName``, ``objc_getClass``, ``wait_command_buffers``) raises ``DeviceClosedError`` naming the
        call and the device; an error ``defer_error`` left is dropped. Host memory stays readable (``read``). A
        second ``close()`` does nothing more."""
        self.closed = True
        # msg_send and c_call test ``_deferred`` first: set, it sends them to ``_raise_deferred``, which raises the
        # closed device's error for good (the fast path gets no second test)
        self._deferred = DeviceClosedError(f"SimDevice #{self.number} is closed")
        if self._checks is not None:
            self._checks.stop()
        self.gpu.stop()

    @property
    def kernel_running(self) -> bool:
        """True while a kernel runs on the simulated GPU, and after the kernel watchdog gave up on one
        (``kernel_timeout_s``: OpenCL cannot stop it, it may still run, or never end). Its OpenCL queue cannot be
        released while it runs: a program that must end then should leave with ``os._exit`` after flushing its
        output (the CLI does)."""
        runner = self._runner
        return self.gpu.in_kernel or (isinstance(runner, KernelRunner) and runner.stuck is not None)

    def __enter__(self) -> SimDevice:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

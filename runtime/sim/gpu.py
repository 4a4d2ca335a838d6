"""The simulated GPU: runs committed command buffers asynchronously, in order per queue, one operation per step.

Each committed command buffer becomes a generator (``_execute``) that yields after every operation (its start,
one dispatch, one ICB command, an event signal) or yields a ``Gate`` it must wait for (a fence update at an
encoder's start, ``encodeWaitForEvent:value:``). ``step_locked`` advances the oldest runnable head of any queue by
one yield; a worker thread calls it while there is work (``autorun``), or tests call ``SimDevice.step``. A gate
that stays closed longer than ``gpu_timeout_s`` fails its command buffer with MTLCommandBufferErrorTimeout, like
the GPU watchdog: nothing waits forever; when the command buffer is part of a deadlock (``rules.deadlock``: a wait
cycle, or a full queue the host is blocked on) its error describes the deadlock.

What the GPU checks while it runs (both modes; strict mode has refused most of these at the call already): rule 8
(range past the ICB, commands past 16,384, unbound buffer indices), 10 (residency), 13 (dispatch dropped), 14
(buffers and pipelines released while only ICB commands referenced them: a command buffer retains what was encoded
into it directly, and lets go of it in ``_finish``), 16 (warm-up on pre-Apple9), and the dispatch limits of
``checks.size_problem``: nothing reaches the kernel runner with 2**32 threads or more on a grid axis (a wrapped
size), which ends the command buffer in Error, Timeout (2); a kernel access outside its buffers (skipped by the
translator's bounds checks, ``KernelAccessError``) ends it in Error, PageFault (3), and strict mode also raises
``MetalValidationError`` at the host's next message to the device (``SimDevice.defer_error``). Rule 9: the commands
between two barriers run in reverse order, which exposes a race a program hides by relying on program order. Rule 6:
a failed command buffer skips its remaining event signals. A fault ends the command buffer in status Error with the
MTLCommandBufferError code and an NSError saying what happened; fence updates of a failed command buffer are
released so later work does not hang (a modelling choice: Metal recovers the channel).
"""
from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mtlir.ir.dtypes import dtypes
from mtlir.metal import MTL
from mtlir.errors import DeviceError, KernelAccessError, MetalValidationError
from mtlir.runtime.sim.kernels.compiled import DEFAULT_TIMEOUT_S, CompiledKernel
from mtlir.runtime.sim.kernels.launch import MAX_BATCH, Launch
from mtlir.runtime.sim.rules.checks import size_problem
from mtlir.runtime.sim.objects import (ICB, Binding, BlitCopy, BlitEncoder, BlitFill, Buffer, CommandBuffer,
                                       CommandQueue, Dispatch, Encoder, Execute, Gate, ICBSlot, Pipeline, SharedEvent,
                                       SignalStep, WaitStep)
from mtlir.runtime.sim.injection import Fault
from mtlir.runtime.sim.rules.deadlock import find_deadlock
from mtlir.runtime.sim.rules.rule import Rule

if TYPE_CHECKING:
    from mtlir.runtime.sim.device import SimDevice

__all__ = ["GPU", "GPUFault", "clock", "kernel_params", "elem_size", "ERROR_TEXT"]

clock = time.perf_counter  # monotonic, seconds: GPUStartTime/GPUEndTime use it

# localizedDescription texts in the shape Metal prints (kIOGPUCommandBufferCallbackError... names)
ERROR_TEXT = {1: "Internal Error", 2: "Caused GPU Timeout Error", 3: "Caused GPU Address Fault Error",
              7: "Not Permitted", 8: "Insufficient Memory", 9: "Invalid Resource"}
_BATCH_S = 0.002  # the longest the worker holds the lock for a run of GPU operations
_IDLE_EXIT_S = 1.0  # the worker thread ends after this long without work and restarts at the next commit


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


def elem_size(dtype: Any) -> int:
    """Bytes per element of a kernel parameter's dtype (a DType, a numpy dtype, or a name such as ``"float32"``,
    ``"float"``, ``"dtypes.float"``); 1 when unknown (no alignment is then required)."""
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int) and size > 0:
        return size
    name = str(dtype).removeprefix("dtypes.").removeprefix("const ").strip().rstrip("*").strip()
    name = re.sub(r"^([a-z]+\d*)x\d+$", r"\1", name)  # a vector (float32x4): its scalar's size
    c_names = {"float": 4, "half": 2, "int": 4, "uint": 4, "short": 2, "ushort": 2, "char": 1, "uchar": 1,
               "long": 8, "ulong": 8, "double": 8, "bool": 1}
    if name in c_names:
        return c_names[name]
    try:
        return dtypes.by_name(name).itemsize or 1
    except KeyError:
        pass
    try:
        return int(np.dtype(name).itemsize)
    except TypeError:
        return 1


def kernel_params(kernel: Any) -> list[tuple[int, str, int]]:
    """``(buffer index, kind "buffer"|"constant", alignment in bytes)`` of each parameter a compiled kernel
    binds: the translator's own alignment when it reports one (``info.bindings``), else the element size."""
    aligns = {int(b.arg.index): int(b.align) for b in getattr(getattr(kernel, "info", None), "bindings", ())}
    return [(int(p.index), str(p.kind), aligns.get(int(p.index)) or elem_size(p.dtype))
            for p in getattr(kernel, "params", ())]


def concurrent_order(icb: ICB, first: int, count: int, seed: int | None = None) -> list[int]:
    """The order the GPU runs commands ``[first, first + count)``: groups split where a command has setBarrier
    (it waits for everything before it), each group run in an adversarial order (rule 9: exposes races): last
    command first when ``seed`` is None, else shuffled by a generator seeded from ``seed`` and the group's first
    command (the same seed gives the same order at every run, so a failure replays)."""
    order: list[int] = []
    group: list[int] = []
    slots = icb.slots
    for i in range(first, first + count + 1):
        slot = slots.get(i) if i < first + count else None
        if slot is None and i < first + count:
            continue  # never written: an empty command
        if group and (slot is None or slot.barrier):
            if seed is None:
                group.reverse()
            else:
                random.Random(seed * 1_000_003 + group[0]).shuffle(group)
            order += group
            group = []
        if slot is not None:
            group.append(i)
    return order


_NOTHING: Any = object()  # a kept ICB command that runs nothing (a zero-size dispatch)


_DIRECT_LAUNCHES = 4096  # direct dispatches' launches kept (``GPU.direct_launches``); past it they are all dropped


def _direct_key(p: Pipeline, d: Dispatch) -> tuple[Any, ...] | None:
    """What a direct dispatch's launch depends on: the pipeline, the sizes, the bindings of the pipeline's
    parameters (buffer objects and offsets; the bytes of ``setBytes`` into a ``constant`` parameter, which no kernel
    can write, so the launch's copy of them stays what was set) and, for ``forget``, the objects it names; None
    (not kept) for ``setBytes`` into a ``device`` parameter or an unbound one (``_bindings`` has raised for it)."""
    bound: list[Any] = []
    objects: list[Any] = [p]
    for index, kind, _ in p.params:
        b = d.bindings.get(index)
        if b is None:
            return None
        bound.append(b)
        if isinstance(b, bytes):
            if kind != "constant":
                return None  # setBytes into a device pointer: a fresh copy at every run (the kernel may write it)
        else:
            objects.append(b[0])
    return (p, d.grid, d.threadgroup, tuple(objects), tuple(bound))


def _reached(ev: SharedEvent, value: int) -> Callable[[], bool]:
    return lambda: ev.value >= value


def _ended(enc: Encoder) -> Callable[[], bool]:
    return lambda: enc.done


class GPU:
    """The scheduler and executor of one SimDevice (docs/simulator.md). Every method expects the device lock
    held, except where said; kernels run with the lock released."""

    def __init__(self, dev: SimDevice) -> None:
        self.dev = dev
        self.queues: list[CommandQueue] = []
        self.seq = 0
        self.busy = False
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.injected_fault: tuple[int, int] | None = None  # (MTLCommandBufferError code, dispatches to run first)
        self.faulty: dict[CommandBuffer, Fault] = {}  # committed command buffers a fault is armed for (injection.py)
        self.kernel_lock = threading.Lock()
        self.kernels_run = 0
        self.last_exception: BaseException | None = None
        self.in_kernel = False  # a kernel is running (on the worker thread, the device lock released)
        self.advancing: CommandBuffer | None = None  # the command buffer of the operation running now
        # the kernel running now, set while one runs alone: (its function, the dispatch, its command buffer's
        # handle); a batch's running kernel is asked of the runner (``running``)
        self._running: tuple[str, str, int] | None = None
        # dispatches prepared and not yet enqueued: (launch, pipeline, what); a batch runs at once (``_flush``)
        self._batch: list[tuple[Launch, Pipeline, str]] = []
        self._in_flight: tuple[list[tuple[Launch, Pipeline, str]], int] | None = None  # the batch running now
        self.host_blocked: CommandQueue | None = None  # the queue a host thread is blocked on in commandBuffer
        # a kernel ran with its results left on the OpenCL device since the last ``sync`` (False: a sync has
        # nothing to bring back nor to mark stale, and is skipped)
        self.unsynced = False
        # command buffers a host thread waits for (``SimDevice.wait_command_buffers``): set when they end, so that
        # thread wakes once, at the end, not at every notify of the device's condition
        self.end_waiters: dict[CommandBuffer, threading.Event] = {}
        # direct dispatches' launches by content (``_direct_key``): a submit that encodes the same dispatch again
        # reuses its launch (its own OpenCL kernel object from the second run on); ``forget`` drops those of a
        # buffer or pipeline deallocated, so a cached launch never keeps a released buffer's memory alive
        self.direct_launches: dict[tuple[Any, ...], Launch | None] = {}
        self._direct_by_object: dict[Buffer | Pipeline, set[tuple[Any, ...]]] = {}  # the keys naming each object

    @property
    def running(self) -> tuple[str, str, int] | None:
        """The kernel running now: (its function, the dispatch, its command buffer's handle); None between
        kernels. In a batch, the first of its kernels that has not completed (the runner's events say)."""
        if self._running is not None:
            return self._running
        flight = self._in_flight
        if flight is None:
            return None
        batch, handle = flight
        k = batch[0][0].ck._runner.running()
        if k is None or k >= len(batch):
            return None
        _, p, what = batch[k]
        return (p.label, what, handle)

    @running.setter
    def running(self, value: tuple[str, str, int] | None) -> None:
        self._running = value

    # ---------------------------------------------------------------- scheduling
    def submit(self, cb: CommandBuffer) -> None:
        """Queue a committed command buffer behind the earlier ones of its queue."""
        cb.seq = self.seq
        self.seq += 1
        cb.run = self._execute(cb)
        self._arm_fault(cb)
        if cb.queue not in self.queues:
            self.queues.append(cb.queue)
        cb.queue.pending.append(cb)
        self.dev._cv.notify_all()
        if self.dev.autorun:
            self._ensure_worker()

    def pending(self) -> bool:
        """True while a committed command buffer has not finished."""
        return any(q.pending for q in self.queues)

    def step_locked(self) -> bool:
        """Advance the oldest runnable command buffer by one operation, or fail one whose gate outlived the
        watchdog. Returns False when nothing could run."""
        if self.busy:
            return False
        heads = [q.pending[0] for q in self.queues if q.pending]
        if len(heads) > 1:
            heads.sort(key=lambda c: c.seq)
        now = clock()
        for cb in heads:
            gate = cb.gate
            if gate is not None:
                if gate.ready():
                    cb.gate = None
                elif now - cb.blocked_since > self.dev.gpu_timeout_s:
                    blocked = f"GPU watchdog: blocked {now - cb.blocked_since:.3g} s"
                    dead = find_deadlock(self.queues, blocked=self.host_blocked)
                    if dead is not None and cb in dead.members:
                        fault = GPUFault(MTL.ErrorTimeout, f"{blocked}: {dead.description}", dead.rule)
                    else:
                        fault = GPUFault(MTL.ErrorTimeout, f"{blocked} waiting for {gate.what}", gate.rule)
                    self._finish(cb, fault)
                    return True
                else:
                    continue
            self._advance(cb)
            return True
        return False

    def _advance(self, cb: CommandBuffer) -> None:
        assert cb.run is not None
        self.busy = True
        self.advancing = cb
        try:
            gate = next(cb.run)
        except StopIteration:
            self._finish(cb, None)
        except GPUFault as fault:
            self._finish(cb, fault)
        except Exception as e:  # a bug of the simulator: fail this command buffer loudly, keep the GPU alive
            self.last_exception = e
            self._finish(cb, GPUFault(MTL.ErrorInternal, f"the simulated GPU failed: {type(e).__name__}: {e}"))
        else:
            if gate is not None and not gate.ready():
                self.sync()  # the host may be what the gate waits for: it sees the results so far
                cb.gate, cb.blocked_since = gate, clock()
        finally:
            self.busy = False
            self.advancing = None

    def sync(self) -> None:
        """Bring what kernels wrote into the buffers' host memory and drop the kernel runner's device copies (the
        next kernel copies in what the host wrote since): called where the host may look or write, at a command
        buffer's start and end, an event signal and a gate the command buffer blocks on. Between those, buffers
        stay on the OpenCL device (``KernelRunner.sync``). Skipped when no kernel ran since the last sync: every
        result is in the host memory then, and no device copy is current (the next kernel copies in what the host
        wrote), so a command buffer of one encoder syncs once, after its kernels, not also at its start, its
        signal and its end."""
        if not self.unsynced:
            return
        self.unsynced = False
        runner = self.dev._runner
        if runner is not None:
            runner.sync()

    def _ensure_worker(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.stopping = False
            self.thread = threading.Thread(target=self._worker, name="mtlir-sim-gpu", daemon=True)
            self.thread.start()

    def _worker(self) -> None:
        """The worker thread (takes the lock itself): runs GPU operations in batches of at most ``_BATCH_S``
        seconds per hold of the lock (the lock is also released while a kernel runs), naps on the condition while
        the heads wait on gates, ends after ``_IDLE_EXIT_S`` without work."""
        cv = self.dev._cv
        idle_since = clock()
        while True:
            with cv:
                if self.stopping or threading.current_thread() is not self.thread:
                    return
                start = clock()
                did = False
                while self.step_locked():
                    did = True
                    if clock() - start > _BATCH_S:
                        break
                if did:
                    idle_since = clock()
                elif not self.pending() and clock() - idle_since > _IDLE_EXIT_S:
                    self.thread = None
                    return
                else:
                    cv.wait(0.005 if self.pending() else 0.1)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the worker thread (called without the lock held): it ends after the operation it is running. When
        that is a kernel that is not finishing (one past its timeout, which OpenCL cannot stop) it is left running
        on its daemon thread instead of being waited for."""
        with self.dev._cv:
            self.stopping = True
            thread = self.thread
            self.dev._cv.notify_all()
        if thread is not None and thread is not threading.current_thread():
            deadline = clock() + timeout_s
            while thread.is_alive() and clock() < deadline:
                thread.join(0.05)
                if self.in_kernel:
                    thread.join(0.2)  # a kernel that ends now still gets its command buffer finished
                    return

    # ---------------------------------------------------------------- execution
    def _execute(self, cb: CommandBuffer) -> Iterator[Gate | None]:
        cb.status = MTL.StatusScheduled
        cb.start_time = clock()
        self.sync()  # what the host wrote before the commit
        yield None
        for step in cb.steps:
            if isinstance(step, WaitStep):
                ev, value = step.event, step.value
                if ev.value < value:
                    yield Gate(_reached(ev, value), f"{ev.describe()} to reach {value} (encodeWaitForEvent:value:)",
                               Rule.EVENT_ONLY_INCREASES)
            elif isinstance(step, SignalStep):
                self.signal(step.event, step.value)
                step.fired = True
                yield None
            else:
                yield from self._run_encoder(cb, step)

    def _run_encoder(self, cb: CommandBuffer, enc: Encoder) -> Iterator[Gate | None]:
        for fence, updater in enc.fence_waits:  # waits act at the encoder's start (rule 11)
            if not updater.done:
                yield Gate(_ended(updater),
                           f"the updateFence: of {fence.describe()} by {updater.describe()}"
                           + (" (the same encoder: update-then-wait deadlocks)" if updater is enc else ""),
                           Rule.FENCE_ORDER)
        for command in enc.commands:  # a run of direct dispatches is enqueued at once (``_flush``)
            if isinstance(command, Dispatch):
                self._batched(self._direct, cb, command)
                if len(self._batch) >= MAX_BATCH:
                    self._flush()
                    yield None
            else:
                self._flush()
                yield from self._execute_icb(cb, enc, command)
        if self._batch:
            self._flush(write_back=True)
            yield None
        if isinstance(enc, BlitEncoder):
            for blit in enc.blits:
                self._blit(blit)
                yield None
        enc.done = True  # updates act at the encoder's end
        _forget_fence_history(enc)
        self.dev._cv.notify_all()

    def _blit(self, blit: BlitCopy | BlitFill) -> None:
        """One blit command on the buffers' bytes (what kernels wrote reaches them first: ``sync``); a buffer
        released meanwhile faults as for a kernel (rule 14)."""
        self.sync()
        if isinstance(blit, BlitCopy):
            for buf in (blit.src, blit.dst):
                if not buf.alive:
                    raise GPUFault(MTL.ErrorInvalidResource, f"copyFromBuffer: reaches {buf.describe()}, which was "
                                                             "released", Rule.FREED_IN_FLIGHT)
            data = blit.src.storage[blit.src_offset:blit.src_offset + blit.size].copy()
            blit.dst.storage[blit.dst_offset:blit.dst_offset + blit.size] = data
        else:
            if not blit.buffer.alive:
                raise GPUFault(MTL.ErrorInvalidResource, f"fillBuffer: reaches {blit.buffer.describe()}, which was "
                                                         "released", Rule.FREED_IN_FLIGHT)
            blit.buffer.storage[blit.offset:blit.offset + blit.length] = blit.value

    def signal(self, ev: SharedEvent, value: int) -> None:
        """The GPU signals ``ev``: the value only increases, a smaller one is ignored (rule 12). The results so far
        reach the host first (``sync``): a waiter may read them once it sees the value."""
        self.sync()
        if value > ev.value:
            ev.value = value
            self.dev._cv.notify_all()

    def _direct(self, cb: CommandBuffer, d: Dispatch) -> None:
        if 0 in d.grid or 0 in d.threadgroup:
            return  # a zero-size dispatch does nothing (the warm-up of METAL.md §1 step 5)
        p = d.pipeline
        if p is None:
            raise GPUFault(MTL.ErrorPageFault, "dispatchThreadgroups:threadsPerThreadgroup: with no pipeline set")
        what = f"dispatch of {p.label}"
        if not self._sizes_ok(p, d.grid, d.threadgroup, what):
            return
        bindings = self._bindings(p, d.bindings, what, None)
        self._run(p, bindings, d.grid, d.threadgroup, what, direct=_direct_key(p, d))

    def forget(self, obj: Buffer | Pipeline) -> None:
        """Drop the direct dispatches' launches that name ``obj`` (called when it is deallocated)."""
        by_object = self._direct_by_object
        for key in by_object.pop(obj, ()):
            self.direct_launches.pop(key, None)
            for other in key[3]:  # the key leaves the other objects' sets too (they stay small)
                if other is not obj and other in by_object:
                    by_object[other].discard(key)

    def _sizes_ok(self, p: Pipeline, grid: tuple[int, int, int], threadgroup: tuple[int, int, int],
                  what: str) -> bool:
        """The dispatch's sizes against Metal's limits (``checks.size_problem``) before anything reaches the
        kernel runner: False for a dispatch Metal drops (rule 13); a grid of 2**32 threads or more on an axis
        raises ``GPUFault`` Timeout (2) — the modelling choice of docs/simulator.md: the hardware would run
        billions of threadgroups until the GPU watchdog ends the command buffer."""
        problem = size_problem(grid, threadgroup, p)
        if problem is None:
            return True
        if problem[0] is Rule.THREADGROUP_LIMIT:
            return False  # silently dropped
        raise GPUFault(MTL.ErrorTimeout, f"{what}: {problem[1]}; the GPU watchdog ends the command buffer")

    def _bindings(self, p: Pipeline, bound: Mapping[int, Binding | bytes], what: str, rule: Rule | None,
                  resident: Callable[[Buffer], bool] | None = None) -> dict[int, tuple[np.ndarray, int]]:
        """Each parameter of ``p`` as (storage, byte offset) from what the encoder or ICB command ``bound`` (a
        direct dispatch's ``setBytes`` come as bytes). Faults: an unbound index (PageFault, ``rule``), a buffer
        ``resident`` says no to (InvalidResource, rule 10), a released buffer (rule 14)."""
        out: dict[int, tuple[np.ndarray, int]] = {}
        for index, kind, size in p.params:
            b = bound.get(index)
            if b is None:
                raise GPUFault(MTL.ErrorPageFault, f"{what}: buffer index {index} is not bound (the kernel reads "
                                                   "address 0)", rule)
            if isinstance(b, bytes):
                out[index] = (np.frombuffer(bytearray(b), dtype=np.uint8), 0)
                continue
            if resident is not None and b[0].alive and not resident(b[0]):
                raise GPUFault(MTL.ErrorInvalidResource, f"{what} reaches {b[0].describe()}, which is not "
                                                         "resident", Rule.RESIDENCY)
            out[index] = self._storage(b, kind, size, f"{what} buffer index {index}")
        return out

    def _storage(self, binding: Binding, kind: str, size: int, what: str) -> tuple[np.ndarray, int]:
        buf, offset = binding
        if not buf.alive:
            raise GPUFault(MTL.ErrorInvalidResource, f"{what}: {buf.describe()} was released (an indirect command "
                                                     "buffer does not retain the buffers its commands bind)",
                           Rule.FREED_IN_FLIGHT)
        if kind != "constant" and offset % size:
            offset -= offset % size  # a misaligned device pointer: the low address bits are dropped (rule 8)
        return buf.storage, offset

    def _execute_icb(self, cb: CommandBuffer, enc: Encoder, ex: Execute) -> Iterator[Gate | None]:
        icb = ex.icb  # alive: the command buffer retains it (and a direct dispatch's pipeline and buffers)
        if ex.first + ex.count > icb.max_count:
            raise GPUFault(MTL.ErrorPageFault, f"executeCommandsInBuffer:withRange: ({ex.first}, {ex.count}) reads "
                                               f"past the {icb.max_count} commands of {icb.describe()}",
                           Rule.ICB_LIMITS)
        count = min(ex.count, MTL.MAX_ICB_RANGE)  # commands past 16,384 are not run (rule 8)
        # The range's commands are enqueued MAX_BATCH at a time, in the order the GPU runs them, with one wait each
        # (``_flush``): the in-order OpenCL queue runs them one after the other, as the order says.
        for i in concurrent_order(icb, ex.first, count, self.dev.order_seed):
            slot = icb.slots.get(i)
            if slot is not None:  # the CPU may have changed the ICB since (rule 15): read it as it is now
                self._batched(self._icb_command, cb, enc, ex, i, slot)
            if len(self._batch) >= MAX_BATCH:
                self._flush()
                yield None
        if self._batch:
            self._flush(write_back=True)
        yield None

    def _batched(self, add: Callable[..., None], *args: Any) -> None:
        """``add(*args)``: check one dispatch and add it to the batch. A fault it raises strikes after the dispatches
        batched before it have run (their own fault, the earlier one, wins); nothing stays batched after an
        error."""
        try:
            add(*args)
        except BaseException:
            try:
                self._flush()
            finally:
                self._batch = []
            raise

    def _icb_command(self, cb: CommandBuffer, enc: Encoder, ex: Execute, i: int, slot: ICBSlot) -> None:
        if slot.grid is None:
            return  # never given a dispatch: an empty command
        p = slot.pipeline
        kept = slot.launch
        if kept is not None and p is not None and kept[1] is p and p.alive and kept[4] is not None \
                and not (self.dev.spec.needs_warmup and p not in ex.bound_pipelines) \
                and self._still_bound(p, slot, enc, cb):
            launch = self._kept((ex.icb, slot), p)
            if launch is not None:  # run before with the same content: its sizes were checked then, its buffers now
                self._run(p, {}, slot.grid, slot.threadgroup, kept[4], (ex.icb, slot), launch)
                return
        what = f"ICB command {i} of {ex.icb.describe()}"
        if p is None:
            raise GPUFault(MTL.ErrorPageFault, f"{what} has no pipeline")
        if not p.alive:  # an ICB does not retain its commands' pipelines (rule 14)
            raise GPUFault(MTL.ErrorInvalidResource, f"{what}: {p.describe()} was released", Rule.FREED_IN_FLIGHT)
        if self.dev.spec.needs_warmup and p not in ex.bound_pipelines:
            raise GPUFault(MTL.ErrorInvalidResource, f"{what} uses {p.describe()}, which this encoder did not bind "
                                                     f"with setComputePipelineState: first ({self.dev.spec.family})",
                           Rule.ICB_PIPELINE_WARMUP)
        if 0 in slot.grid or 0 in slot.threadgroup:
            return
        what = f"{what} ({p.label})"
        if not self._sizes_ok(p, slot.grid, slot.threadgroup, what):
            return
        bindings = self._bindings(p, slot.bindings, what, Rule.ICB_LIMITS,
                                  lambda buf: buf in enc.used or buf in cb.resident)
        self._run(p, bindings, slot.grid, slot.threadgroup, what, (ex.icb, slot))

    @staticmethod
    def _still_bound(p: Pipeline, slot: ICBSlot, enc: Encoder, cb: CommandBuffer) -> bool:
        """Whether a kept ICB command may take the fast path: every parameter bound to a live, resident buffer and
        the threadgroup within the pipeline's limit (what can change while the command stays the same); False sends
        it through the full checks, which raise the fault."""
        tg = slot.threadgroup
        if tg[0] * tg[1] * tg[2] > p.max_threads:
            return False
        bound, used, resident = slot.bindings, enc.used, cb.resident
        for index, _, _ in p.params:
            b = bound.get(index)
            if b is None or not b[0].alive or not (b[0] in used or b[0] in resident):
                return False
        return True

    def _run(self, p: Pipeline, bindings: dict[int, tuple[np.ndarray, int]], grid: tuple[int, int, int],
             threadgroup: tuple[int, int, int], what: str, slot: tuple[ICB, ICBSlot] | None = None,
             kept: Any = None, direct: tuple[Any, ...] | None = None) -> None:
        """Add one dispatch to the batch (``_flush`` runs it), its launch prepared once per ICB command (``slot``:
        kept on the ICBSlot while the ICB's version stays; ``kept``: that launch, already looked up) and once per
        direct dispatch content (``direct``: its ``_direct_key``; a launch of its own from its second run on)."""
        if self.injected_fault is not None or self.faulty:
            self._flush()  # what was batched runs before an injected fault strikes
            self._inject(p, what)
        self.kernels_run += 1
        # only the runner's own kernels are batched: another kernel object (the tests' Python kernels, a wrapper that
        # records each run) is run through its ``run``, at once
        prepare = p.kernel.prepare if isinstance(p.kernel, CompiledKernel) else None
        if prepare is None:
            self._flush()
            self._run_alone(p, bindings, grid, threadgroup, what)
            return
        launch = kept if kept is not None else self._kept(slot, p) if slot is not None else None
        keep = slot is not None
        if direct is not None:
            cached = self.direct_launches.get(direct, _NOTHING)
            if cached is not _NOTHING and (cached is None or cached.own):
                launch = _NOTHING if cached is None else cached
            else:
                keep = cached is not _NOTHING  # run before: worth a kernel object of its own
        if launch is not None and slot is not None and kept is None:  # checked in full now: the fast path again
            k = slot[1].launch
            if k is not None and k[4] is None:
                slot[1].launch = (k[0], k[1], k[2], k[3], what)
        if launch is None:
            old = slot[1].launch if slot is not None else None
            try:  # a kept launch's OpenCL kernel object is reused when the command's pipeline stays
                launch = prepare(bindings, grid, threadgroup, keep=keep,
                                 reuse=old[2] if old is not None and old[1] is p else None)
            except Exception as e:  # sizes or bindings the runner refuses fail the command buffer
                self.last_exception = e
                raise GPUFault(MTL.ErrorInternal, f"{what}: kernel {p.label} raised {type(e).__name__}: {e}") from e
            if slot is not None:
                icb, s = slot
                s.launch = (icb.version, p, launch, (s.grid, s.threadgroup, tuple(s.bindings.items())), what)
            elif direct is not None:
                if len(self.direct_launches) >= _DIRECT_LAUNCHES:
                    self.direct_launches.clear()
                    self._direct_by_object.clear()
                if direct not in self.direct_launches:
                    for obj in direct[3]:
                        self._direct_by_object.setdefault(obj, set()).add(direct)
                self.direct_launches[direct] = launch
        if launch is not None and launch is not _NOTHING:
            self._batch.append((launch, p, what))

    @staticmethod
    def _kept(slot: tuple[ICB, ICBSlot], p: Pipeline) -> Any:
        """The launch kept for an ICB command (``ICBSlot.launch``), None when it must be prepared: kept while the
        ICB's version stays, or while the command's content (sizes, bindings) is the same after the CPU rewrote
        it (a submit that patches a command with the values it had)."""
        icb, s = slot
        kept = s.launch
        if kept is None or kept[1] is not p:
            return None
        if kept[0] != icb.version:
            if kept[3] != (s.grid, s.threadgroup, tuple(s.bindings.items())):
                s.launch = (kept[0], kept[1], kept[2], kept[3], None)  # changed: the full checks run again
                return None
            s.launch = (icb.version, p, kept[2], kept[3], kept[4])
        return _NOTHING if kept[2] is None else kept[2]

    def _flush(self, write_back: bool = False) -> None:
        """Run the batched dispatches: enqueued at once, one wait (``KernelRunner.run_batch``), the device lock
        released meanwhile; ``write_back`` at the end of an ICB range or an encoder (where a sync usually follows:
        the copies back of what kernels wrote ride on the batch's wait). A kernel access outside its buffers raises
        ``GPUFault`` PageFault naming its dispatch (strict mode also defers a ``MetalValidationError``); a runner
        error (a timeout, OpenCL refusing) raises ``GPUFault`` Internal."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        runner = batch[0][0].ck._runner
        cb = self.advancing
        lock = self.dev._lock
        self.unsynced = True
        lock.release()
        try:
            with self.kernel_lock:
                self.in_kernel = True
                self._in_flight = (batch, cb.handle if cb is not None else 0)
                try:
                    fault = runner.run_batch([b[0] for b in batch], DEFAULT_TIMEOUT_S, keep=True,
                                             write_back=write_back)
                finally:
                    self.in_kernel = False
                    self._in_flight = None
        except Exception as e:  # a kernel that crashes the runner fails its command buffer, never the worker
            self.last_exception = e
            _, p, what = batch[0]
            more = f" (and the {len(batch) - 1} dispatches batched after it)" if len(batch) > 1 else ""
            raise GPUFault(MTL.ErrorInternal, f"{what}{more}: kernel {p.label} raised {type(e).__name__}: {e}") from e
        finally:
            lock.acquire()
        if fault is not None:
            _, p, what = batch[fault[0]]
            self._access_fault(what, fault[1])

    def _access_fault(self, what: str, e: KernelAccessError) -> None:
        """The bounds checks skipped an access outside a buffer: a GPU address fault (``GPUFault`` PageFault)."""
        if self.dev.strict:
            self.dev.defer_error(MetalValidationError(
                f"{what}: {e} (Metal's shader validation reports an out-of-bounds access; the command buffer "
                "ends in status Error, PageFault)"))
        raise GPUFault(MTL.ErrorPageFault, f"{what}: {e}") from e

    def _run_alone(self, p: Pipeline, bindings: dict[int, tuple[np.ndarray, int]], grid: tuple[int, int, int],
                   threadgroup: tuple[int, int, int], what: str) -> None:
        """Run one kernel that has no prepared launches (``kernel.run``), the device lock released meanwhile."""
        lock = self.dev._lock
        self.unsynced = True
        lock.release()
        try:
            with self.kernel_lock:
                self.in_kernel = True
                cb = self.advancing
                self.running = (p.label, what, cb.handle if cb is not None else 0)
                try:
                    p.kernel.run(bindings, grid, threadgroup, keep=True)  # results stay on the device until sync
                finally:
                    self.in_kernel = False
                    self.running = None
        except KernelAccessError as e:
            lock.acquire()
            self._access_fault(what, e)
        except Exception as e:  # a kernel that crashes the runner fails its command buffer, never the worker
            lock.acquire()
            self.last_exception = e
            raise GPUFault(MTL.ErrorInternal, f"{what}: kernel {p.label} raised {type(e).__name__}: {e}") from e
        else:
            lock.acquire()

    # ---------------------------------------------------------------- injected faults (runtime/sim/injection.py)
    def _arm_fault(self, cb: CommandBuffer) -> None:
        """At commit: remember the fault ``SimDevice.inject`` armed for this command buffer, if any."""
        fault = self.dev.faults.committed()
        if fault is not None:
            self.faulty[cb] = fault

    def _inject(self, p: Pipeline, what: str) -> None:
        """Before a kernel runs: the fault of ``inject_fault`` (the N-th dispatch) or the one armed for the running
        command buffer (its first kernel) strikes. A command buffer fault raises ``GPUFault`` with its code; a hang
        keeps the GPU busy with the kernel until the watchdog (``gpu_timeout_s``, the lock released meanwhile) ends
        the command buffer in Error, Timeout (2)."""
        injected = self.injected_fault
        if injected is not None:
            code, left = injected
            if left == 0:
                self.injected_fault = None
                raise GPUFault(code, f"injected fault at {what}")
            self.injected_fault = (code, left - 1)
        cb = self.advancing
        fault = self.faulty.pop(cb, None) if cb is not None else None
        if fault is None:
            return
        self.dev.faults.fired.append(fault)
        where = f"an injected fault ({fault.spec()}) at {what}"
        if fault.kind == "command_buffer":
            raise GPUFault(fault.code, f"{where}, before the kernel ran")
        self.running = (p.label, what, cb.handle if cb is not None else 0)
        start = clock()
        deadline = start + self.dev.gpu_timeout_s
        try:
            while not self.stopping and clock() < deadline:
                self.dev._cv.wait(min(deadline - clock(), 0.05))  # releases the device lock while it "runs"
        finally:
            self.running = None
        raise GPUFault(MTL.ErrorTimeout, f"GPU watchdog: kernel {p.label!r} ran {clock() - start:.3g} s without "
                                         f"finishing ({where}: a kernel that never finishes)")

    def _unfired_fault(self, cb: CommandBuffer, ended: GPUFault | None) -> GPUFault | None:
        """At the end of a command buffer whose armed fault has not struck: a command buffer that ran no kernel
        fails now (a hang as a Timeout: with no kernel, nothing runs forever); one that ``ended`` in a fault of its
        own keeps that one (the armed fault is dropped)."""
        fault = self.faulty.pop(cb, None)
        if fault is None or ended is not None:
            return ended
        self.dev.faults.fired.append(fault)
        code = fault.code if fault.kind == "command_buffer" else MTL.ErrorTimeout
        return GPUFault(code, f"an injected fault ({fault.spec()}) at the end of a command buffer without kernels")

    def run_kernel_now(self, p: Pipeline, bindings: dict[int, tuple[np.ndarray, int]], grid: tuple[int, int, int],
                       threadgroup: tuple[int, int, int]) -> None:
        """Run one kernel at once on the caller's thread (strict mode's dry runs; the lock stays held)."""
        with self.kernel_lock:
            p.kernel.run(bindings, grid, threadgroup)

    def _finish(self, cb: CommandBuffer, fault: GPUFault | None) -> None:
        self.sync()  # the command buffer's results reach the host before its status says completed
        if self.faulty:
            fault = self._unfired_fault(cb, fault)
        if fault is None and cb.late_fault is not None:
            fault = GPUFault(cb.late_fault[0], cb.late_fault[1], Rule.FREED_IN_FLIGHT)
        if fault is None:
            cb.end_time = clock()
            cb.status = MTL.StatusCompleted  # after the time: status is read without the lock
        else:
            cb.error = self.dev._make_error(fault.code, fault.description())
            cb.status = MTL.StatusError
            for step in cb.steps:
                if isinstance(step, Encoder):
                    step.done = True
                    _forget_fence_history(step)
                elif isinstance(step, SignalStep) and not step.fired:
                    step.event.skipped.append((step.value, cb))  # rule 6: Metal skips it
        cb.gate, cb.run = None, None
        ended = self.end_waiters.pop(cb, None) if self.end_waiters else None
        if ended is not None:
            ended.set()
        cb.queue.pending.remove(cb)
        cb.queue.live.discard(cb)
        for buf in cb.reads:
            buf.readers.pop(cb, None)
        for icb, _, _ in cb.icb_reads:
            icb.readers.pop(cb, None)
        self.dev._cv.notify_all()
        self.dev.release_references(cb)  # retainedReferences: what was encoded into it lives until now
        self.dev._release_internal(cb)


def _forget_fence_history(enc: Encoder) -> None:
    """A finished encoder no longer needs the encoders it waited for (its waits were met at its start) nor the
    previous updaters of its fences (only an encoder of a command buffer released uncommitted rolls a fence back,
    and a finished one was committed). Dropping them ends the chain through which every encoder ever run stayed
    reachable from the fence's last updater: about 5 KB per submit, without bound."""
    enc.fence_waits = []
    enc.fence_prev = {}


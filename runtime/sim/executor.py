"""The execution of one committed command buffer on the simulated GPU (``Executor``, owned by ``gpu.GPU``).

``Executor.execute(cb)`` is the generator the GPU's scheduler advances one operation per step: the command buffer's
start, its encoders (fence waits at an encoder's start, then its dispatches, ICB ranges and blits), its event
waits and signals. Dispatches are checked (``dispatch``) and added to a batch that runs at once on the kernel runner
(``KernelRunner.run_batch``, the device lock released meanwhile), at most ``MAX_BATCH`` at a time; a launch is
prepared once per ICB command (kept on its ``ICBSlot`` while the ICB's version stays) and once per direct dispatch
content (``direct_launches``). A fault raises ``GPUFault`` (``faults``), which the scheduler turns into the command
buffer's error (docs/simulator.md).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from mtlir.errors import KernelAccessError, MetalValidationError, WaitTimeoutError
from mtlir.metal import MTL
from mtlir.runtime.sim.dispatch import bound_storage, concurrent_order, sizes_ok
from mtlir.runtime.sim.faults import GPUFault
from mtlir.runtime.sim.injection import fault_at_start, inject, inject_blit
from mtlir.runtime.sim.kernels.compiled import CompiledKernel
from mtlir.runtime.sim.kernels.launch import MAX_BATCH, InFlight, Launch
from mtlir.runtime.sim.objects import (ICB, BlitCopy, BlitEncoder, BlitFill, Buffer, CommandBuffer, Dispatch, Encoder,
                                       Execute, Gate, ICBSlot, Pipeline, SharedEvent, SignalStep, WaitStep, clock)
from mtlir.runtime.sim.ranges import RangeBatch, Recording, build_range
from mtlir.runtime.sim.rules.rule import Rule
from mtlir.runtime.sim.waiting import notify_waiters

if TYPE_CHECKING:
    from mtlir.runtime.sim.gpu import GPU

_T = TypeVar("_T")

__all__ = ["Executor", "KERNELS_IN_FLIGHT", "WOULD_BLOCK", "forget_fence_history"]

_NOTHING: Any = object()  # a kept ICB command that runs nothing (a zero-size dispatch)


_DIRECT_LAUNCHES = 4096  # direct dispatches' launches kept (``Executor.direct_launches``); past it they are all dropped


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


# What a command buffer's generator yields once it has enqueued a batch of kernels (``Executor._start``) that it
# waits for at its next step: a gate that is always open. A host thread starting the command buffer at its commit
# (``GPU._may_start``) stops there and goes on with its own work while the kernels run; any other thread going on
# waits for them at once.
KERNELS_IN_FLIGHT = Gate(lambda: True, "its kernels, running", None)
# What it yields instead, only to a thread starting it (``GPU.starting``), before an operation that would run kernels
# and wait for them there (direct dispatches, an ICB range through the full checks, a blit): that thread stops.
WOULD_BLOCK = Gate(lambda: True, "an operation that waits for its kernels", None)


def _reached(ev: SharedEvent, value: int) -> Callable[[], bool]:
    return lambda: ev.value >= value


def _ended(enc: Encoder) -> Callable[[], bool]:
    return lambda: enc.done


class Executor:
    """Runs the command buffers of one ``GPU``: ``execute`` makes a command buffer's generator, ``forget`` drops the
    launches kept for a deallocated object. Expects the device lock held, as the GPU does; kernels run with it
    released. What the scheduler reads (``running``, ``in_kernel``, ``kernels_run``, ``last_exception``) stays
    on the GPU; the batch and the kept launches are the executor's own."""

    def __init__(self, gpu: GPU) -> None:
        self.gpu = gpu
        self.dev = gpu.dev
        # dispatches prepared and not yet enqueued: (launch, pipeline, what); a batch runs at once (``_flush``)
        self._batch: list[tuple[Launch, Pipeline, str]] = []
        self.in_flight: tuple[list[tuple[Launch, Pipeline, str]], int] | None = None  # the batch running now
        # direct dispatches' launches by content (``_direct_key``): a submit that encodes the same dispatch again
        # reuses its launch (its own OpenCL kernel object from the second run on); ``forget`` drops those of a
        # buffer or pipeline deallocated, so a cached launch never keeps a released buffer's memory alive
        self.direct_launches: dict[tuple[Any, ...], Launch | None] = {}
        self._direct_by_object: dict[Buffer | Pipeline, set[tuple[Any, ...]]] = {}  # the keys naming each object
        # while an ICB range runs through the full checks: what ``_run`` adds to the batch, kept as the range's
        # ``RangeBatch`` when the range ends without a fault (None: not recording, or a kernel that cannot be kept)
        self._recording: Recording | None = None

    def execute(self, cb: CommandBuffer) -> Iterator[Gate | None]:
        """The generator of a committed command buffer: yields None after each operation, or a ``Gate`` it must
        wait for; raises ``GPUFault`` when a fault ends it."""
        cb.status = MTL.StatusScheduled
        cb.start_time = clock()
        if self.gpu.unsynced:
            self.gpu.sync()  # what the host wrote before the commit
        yield None
        if self.gpu.faulty:
            fault_at_start(self.gpu, cb)  # an injected fault on a command buffer without GPU work
        for step in cb.steps:
            if isinstance(step, WaitStep):
                ev, value = step.event, step.value
                if ev.value < value:
                    yield Gate(_reached(ev, value), f"{ev.describe()} to reach {value} (encodeWaitForEvent:value:)",
                               Rule.EVENT_ONLY_INCREASES)
            elif isinstance(step, SignalStep):
                self.gpu.signal(step.event, step.value)
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
                if self.gpu.starting and 0 not in command.grid and 0 not in command.threadgroup:
                    yield WOULD_BLOCK  # (a zero-size dispatch, the warm-up of METAL.md §1 step 5, runs nothing)
                self._batched(self._direct, cb, command)
                if len(self._batch) >= MAX_BATCH:
                    self._flush()
                    yield None
            else:
                if self._batch:
                    self._flush()
                kept = self._kept_range(cb, enc, command)
                if kept is None:
                    if self.gpu.starting:
                        yield WOULD_BLOCK
                    yield from self._execute_icb(cb, enc, command)
                    continue
                # a kept range (``ranges.RangeBatch``) runs here, not in a generator of its own (one level less
                # to pass through at every step): its launches MAX_BATCH at a time, as the full path would (its
                # ``chunks``: the batches and their launches made when it was kept). With autorun each batch is
                # started, then waited for at the next step (``KERNELS_IN_FLIGHT``): a host thread that starts the
                # command buffer at its commit (``GPU._may_start``) goes on while the kernels run
                self.gpu.kernels_run += kept.dispatches
                chunks = kept.chunks
                last = len(chunks) - 1
                started = self.dev.autorun and chunks[0][1][0].ck._runner.checker is None
                for i, (items, launches) in enumerate(chunks):
                    self._batch = items
                    if started:
                        flight = self._start(i == last, launches)
                        yield KERNELS_IN_FLIGHT
                        self._finish(*flight)
                    else:
                        self._flush(i == last, launches)
                        yield None
        if self._batch:
            self._flush(write_back=True)
            yield None
        if isinstance(enc, BlitEncoder):
            for blit in enc.blits:
                if self.gpu.starting:
                    yield WOULD_BLOCK
                if self.gpu.faulty:
                    inject_blit(self.gpu, cb, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:"
                                if isinstance(blit, BlitCopy) else "fillBuffer:range:value:")
                self._blit(blit)
                yield None
        enc.done = True  # updates act at the encoder's end
        if enc.fence_waits or enc.fence_prev:
            forget_fence_history(enc)
        notify_waiters(self.dev._cv)

    def _blit(self, blit: BlitCopy | BlitFill) -> None:
        """One blit command on the buffers' bytes (what kernels wrote reaches them first: ``sync``); a buffer
        released meanwhile faults as for a kernel (rule 14)."""
        self.gpu.sync()
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


    def _direct(self, cb: CommandBuffer, d: Dispatch) -> None:
        if 0 in d.grid or 0 in d.threadgroup:
            return  # a zero-size dispatch does nothing (the warm-up of METAL.md §1 step 5)
        p = d.pipeline
        if p is None:
            raise GPUFault(MTL.ErrorPageFault, "dispatchThreadgroups:threadsPerThreadgroup: with no pipeline set")
        what = f"dispatch of {p.label}"
        if not sizes_ok(p, d.grid, d.threadgroup, what):
            return
        bindings = bound_storage(p, d.bindings, what, None)
        self._run(p, bindings, d.grid, d.threadgroup, what, direct=_direct_key(p, d))

    def forget(self, obj: Buffer | Pipeline) -> None:
        """Drop the direct dispatches' launches that name ``obj`` (called when it is deallocated)."""
        by_object = self._direct_by_object
        for key in by_object.pop(obj, ()):
            self.direct_launches.pop(key, None)
            for other in key[3]:  # the key leaves the other objects' sets too (they stay small)
                if other is not obj and other in by_object:
                    by_object[other].discard(key)

    def _kept_range(self, cb: CommandBuffer, enc: Encoder, ex: Execute) -> RangeBatch | None:
        """The batch kept for the ICB range ``ex`` runs when it may (``RangeBatch.usable``): None sends the range
        through the full checks (``_execute_icb``). Raises ``GPUFault`` for a range past the ICB (rule 8)."""
        icb = ex.icb  # alive: the command buffer retains it (and a direct dispatch's pipeline and buffers)
        if ex.first + ex.count > icb.max_count:
            raise GPUFault(MTL.ErrorPageFault, f"executeCommandsInBuffer:withRange: ({ex.first}, {ex.count}) reads "
                                               f"past the {icb.max_count} commands of {icb.describe()}",
                           Rule.ICB_LIMITS)
        if self.dev._order_seed is not None or self.gpu.injected_fault is not None or self.gpu.faulty:
            return None
        kept: RangeBatch | None = icb.ranges.get((ex.first, min(ex.count, MTL.MAX_ICB_RANGE)))
        if kept is not None and kept.usable(icb, ex, enc, cb, self.dev.spec.needs_warmup):
            return kept
        return None

    def _execute_icb(self, cb: CommandBuffer, enc: Encoder, ex: Execute) -> Iterator[Gate | None]:
        """An ICB range through the full checks (``_kept_range`` checked its bounds and found no usable kept
        batch), recorded as the range's kept batch when it runs without a fault."""
        icb = ex.icb
        count = min(ex.count, MTL.MAX_ICB_RANGE)  # commands past 16,384 are not run (rule 8)
        key = (ex.first, count)
        keep = self.dev._order_seed is None and self.gpu.injected_fault is None and not self.gpu.faulty
        # The range's commands are enqueued MAX_BATCH at a time, in the order the GPU runs them, with one wait each
        # (``_flush``): the in-order OpenCL queue runs them one after the other, as the order says. What they add
        # to the batch is recorded (``_run``) and kept for the next run of the range (``ranges``).
        order = concurrent_order(icb, ex.first, count, self.dev._order_seed)
        recording = Recording() if keep else None
        self._recording = recording
        try:
            for i in order:
                slot = icb.slots.get(i)
                if slot is not None:  # the CPU may have changed the ICB since (rule 15): read it as it is now
                    self._batched(self._icb_command, cb, enc, ex, i, slot)
                if len(self._batch) >= MAX_BATCH:
                    self._flush()
                    recording, self._recording = self._recording, None  # another command buffer may run now
                    yield None
                    self._recording = recording
            if self._batch:
                self._flush(write_back=True)
            recording = self._recording
            if recording is not None:
                if len(icb.ranges) >= 64 or any(r.version != icb.version for r in icb.ranges.values()):
                    icb.ranges.clear()
                kept = build_range(icb, order, recording)
                if kept is not None:
                    icb.ranges[key] = kept
        finally:
            self._recording = None
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
        if not sizes_ok(p, slot.grid, slot.threadgroup, what):
            return
        bindings = bound_storage(p, slot.bindings, what, Rule.ICB_LIMITS,
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
        if self.gpu.injected_fault is not None or self.gpu.faulty:
            self._flush()  # what was batched runs before an injected fault strikes
            inject(self.gpu, p, what)
        self.gpu.kernels_run += 1
        # only the runner's own kernels are batched: another kernel object (the tests' Python kernels, a wrapper that
        # records each run) is run through its ``run``, at once
        prepare = p.kernel.prepare if isinstance(p.kernel, CompiledKernel) else None
        if prepare is None:
            self._recording = None  # a kernel run alone: its range cannot be kept
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
                self.gpu.last_exception = e
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
            if self._recording is not None:
                self._recording.items.append((launch, p, what))
        if self._recording is not None:
            self._recording.dispatches += 1

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

    def _flush(self, write_back: bool = False, launches: list[Launch] | None = None) -> None:
        """Run the batched dispatches: enqueued at once, one wait (``KernelRunner.run_batch``), the device lock
        released meanwhile; ``write_back`` at the end of an ICB range or an encoder (where a sync usually follows:
        the copies back of what kernels wrote ride on the batch's wait); ``launches``: the batch's launches when the
        caller has them (a kept range's). A kernel access outside its buffers raises ``GPUFault`` PageFault naming
        its dispatch (strict mode also defers a ``MetalValidationError``); a runner error (a timeout, OpenCL
        refusing) raises ``GPUFault`` Internal."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        cb = self.gpu.advancing
        self.in_flight = (batch, cb.handle if cb is not None else 0)
        self._waited(batch, batch[0][0].ck._runner.run_batch, [b[0] for b in batch] if launches is None else launches,
                     self.dev.kernel_timeout_s, True, write_back)

    def _start(self, write_back: bool, launches: list[Launch]) -> tuple[InFlight, list[tuple[Launch, Pipeline, str]],
                                                                          float]:
        """Enqueue the batched dispatches (``launches``: theirs) without waiting (``KernelRunner.start``, the
        device lock held: enqueueing takes microseconds): ``_finish`` waits for them at the command buffer's next
        step. Returns what ``_finish`` takes (the batch, its items, the seconds the enqueue took). Raises
        ``GPUFault`` Internal when the runner refuses the batch."""
        batch, self._batch = self._batch, []
        cb = self.gpu.advancing
        self.in_flight = (batch, cb.handle if cb is not None else 0)
        self.gpu.unsynced = True
        t0 = clock()
        try:
            flight = batch[0][0].ck._runner.start(launches, self.dev.kernel_timeout_s, write_back)
        except Exception as e:
            self.in_flight = None
            raise self._runner_fault(e, batch) from e
        return flight, batch, clock() - t0

    def _finish(self, flight: InFlight, batch: list[tuple[Launch, Pipeline, str]], enqueue_s: float) -> None:
        """Wait for a batch ``_start`` enqueued, the device lock released meanwhile, and raise its fault as
        ``_flush`` does. The batch's time for ``GPU.kernels_ran`` is its enqueue and this wait, not the host's work
        in between (a batch started at a commit: ``GPU.starting``)."""
        self._waited(batch, batch[0][0].ck._runner.finish, flight, extra_s=enqueue_s)

    def _waited(self, batch: list[tuple[Launch, Pipeline, str]], run: Callable[..., Any], *args: Any,
                extra_s: float = 0.0) -> None:
        """``run(*args)``, the kernel runner's wait for ``batch`` (``in_flight``, cleared after), through
        ``_unlocked``; a runner error becomes the command buffer's fault (``_runner_fault``), the fault record of a
        kernel's access outside its buffers a PageFault naming its dispatch (``_access_fault``)."""
        try:
            try:
                fault = self._unlocked(run, *args, extra_s=extra_s)
            finally:
                self.in_flight = None
        except Exception as e:
            raise self._runner_fault(e, batch) from e
        if fault is not None:
            _, p, what = batch[fault[0]]
            self._access_fault(what, fault[1])

    def _runner_fault(self, e: Exception, batch: list[tuple[Launch, Pipeline, str]]) -> GPUFault:
        """The command buffer's fault for a runner error of ``batch``: the watchdog's for a kernel past
        ``kernel_timeout_s``, else Internal naming the batch's first dispatch (a kernel that crashes the runner
        fails its command buffer, never the thread running the step)."""
        if isinstance(e, WaitTimeoutError):
            return self._watchdog(e)
        self.gpu.last_exception = e
        _, p, what = batch[0]
        more = f" (and the {len(batch) - 1} dispatches batched after it)" if len(batch) > 1 else ""
        return GPUFault(MTL.ErrorInternal, f"{what}{more}: kernel {p.label} raised {type(e).__name__}: {e}")

    def _watchdog(self, e: WaitTimeoutError) -> GPUFault:
        """A kernel ran past ``kernel_timeout_s`` (the runner's ``WaitTimeoutError`` names its dispatch): the GPU
        watchdog ends its command buffer in Error, Timeout (2), as Metal's does (METAL.md §3). The OpenCL kernel
        itself cannot be stopped: it keeps a CPU busy until it ends or the process exits, and the device's kernel
        runner refuses every later kernel (those command buffers end in Error, Internal, saying so)."""
        return GPUFault(MTL.ErrorTimeout, f"GPU watchdog: {e} (kernel_timeout_s): the kernel keeps running on the "
                                          "OpenCL device, which cannot stop it, until it ends or the process exits; "
                                          "later kernels on this SimDevice fail: make a new one")

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
        cb = self.gpu.advancing
        try:
            self.gpu.running = (p.label, what, cb.handle if cb is not None else 0)
            try:  # results stay on the device until sync
                self._unlocked(p.kernel.run, bindings, grid, threadgroup, timeout_s=self.dev.kernel_timeout_s,
                               keep=True)
            finally:
                self.gpu.running = None
        except WaitTimeoutError as e:
            raise self._watchdog(e) from e
        except KernelAccessError as e:
            self._access_fault(what, e)
        except Exception as e:  # a kernel that crashes the runner fails its command buffer, never the worker
            self.gpu.last_exception = e
            raise GPUFault(MTL.ErrorInternal, f"{what}: kernel {p.label} raised {type(e).__name__}: {e}") from e

    def _unlocked(self, run: Callable[..., _T], *args: Any, extra_s: float = 0.0, **kwargs: Any) -> _T:
        """``run(*args, **kwargs)`` (kernels) on this thread with the device lock released (the host goes on sending
        messages), the kernel lock held and ``in_kernel`` set; the device lock taken back at the end however it
        ends (the caller turns an error into the command buffer's fault with the lock held), and the kernels' wall
        time, without that wait for the lock, given to ``GPU.kernels_ran`` (plus ``extra_s`` seconds: a started
        batch's enqueue, ``_finish``). Results stay on the OpenCL device until the next sync (``unsynced``). A plain
        call, not a context manager: it runs once per batch."""
        gpu = self.gpu
        lock = self.dev._lock
        gpu.unsynced = True
        lock.release()
        t0 = clock() - extra_s
        try:
            with gpu.kernel_lock:
                gpu.in_kernel = True
                try:
                    return run(*args, **kwargs)
                finally:
                    gpu.in_kernel = False
        finally:
            ran = clock() - t0
            lock.acquire()
            gpu.kernels_ran(ran)

def forget_fence_history(enc: Encoder) -> None:
    """A finished encoder no longer needs the encoders it waited for (its waits were met at its start) nor the
    previous updaters of its fences (only an encoder of a command buffer released uncommitted rolls a fence back,
    and a finished one was committed). Dropping them ends the chain through which every encoder ever run stayed
    reachable from the fence's last updater: about 5 KB per submit, without bound."""
    enc.fence_waits = []
    enc.fence_prev = {}


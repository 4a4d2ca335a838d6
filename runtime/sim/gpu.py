"""The simulated GPU: schedules committed command buffers asynchronously, in order per queue, one operation per step.

Each committed command buffer becomes a generator (``executor.Executor.execute``) that yields after every operation
(its start, one dispatch, one ICB command, an event signal) or yields a ``Gate`` it must wait for (a fence update at
an encoder's start, ``encodeWaitForEvent:value:``). ``step_locked`` advances the oldest runnable head of any queue by
one yield (with autorun, on through the next ones up to a gate or its end while its queue alone has work:
``_advance``); a worker thread calls it while there is work (``autorun``), a host thread waiting for the work
(``drive``), or tests call ``SimDevice.step`` (one yield). A gate
that stays closed longer than ``gpu_timeout_s`` fails its command buffer with MTLCommandBufferErrorTimeout, like
the GPU watchdog: nothing waits forever; when the command buffer is part of a deadlock (``rules.deadlock``: a wait
cycle, or a full queue the host is blocked on) its error describes the deadlock.

What the GPU checks while it runs (``executor``, ``dispatch``; both modes; strict mode has refused most of these at
the call already): rule 8 (range past the ICB, commands past 16,384, unbound buffer indices), 10 (residency), 13
(dispatch dropped), 14 (buffers and pipelines released while only ICB commands referenced them: a command buffer
retains what was encoded into it directly, and lets go of it in ``_finish``), 16 (warm-up on pre-Apple9), and the
dispatch limits of ``checks.size_problem``: nothing reaches the kernel runner with 2**32 threads or more on a grid
axis (a wrapped size), which ends the command buffer in Error, Timeout (2); a kernel access outside its buffers
(skipped by the translator's bounds checks, ``KernelAccessError``) ends it in Error, PageFault (3), and strict mode
also raises ``MetalValidationError`` at the host's next message to the device (``SimDevice.defer_error``). Rule 9:
the commands between two barriers run in reverse order, which exposes a race a program hides by relying on program
order. Rule 6: a failed command buffer skips its remaining event signals. A fault ends the command buffer in status
Error with the MTLCommandBufferError code and an NSError saying what happened; fence updates of a failed command
buffer are released so later work does not hang (a modelling choice: Metal recovers the channel).
"""
from __future__ import annotations

import math
import numbers
import random
import threading
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from mtlir.errors import ArgumentError
from mtlir.metal import MTL
from mtlir.runtime.sim.executor import KERNELS_IN_FLIGHT, WOULD_BLOCK, Executor, forget_fence_history
from mtlir.runtime.sim.faults import GPUFault
from mtlir.runtime.sim.injection import Fault, arm_fault, unfired_fault
from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.lifetime import release_references
from mtlir.runtime.sim.objects import CommandBuffer, CommandQueue, Encoder, Pipeline, SharedEvent, SignalStep, clock
from mtlir.runtime.sim.rules.deadlock import find_deadlock
from mtlir.runtime.sim.rules.rule import Rule
from mtlir.runtime.sim.waiting import notify_waiters

if TYPE_CHECKING:
    from mtlir.runtime.sim.device import SimDevice

__all__ = ["GPU"]

_BATCH_S = 0.002  # the longest the worker holds the lock for a run of GPU operations
_IDLE_EXIT_S = 1.0  # the worker thread ends after this long without work and restarts at the next commit
# the longest the idle worker naps: a command buffer committed without waking it (``submit``) starts within this
# when no host thread waits for it
_START_S = 0.01
# what a kernel batch (seconds, a recent average) must take for a pipelining host's commits to wake the worker at once
# (``GPU.overlap_s``, ``SimDevice(overlap_s=...)``): below it the hand-offs cost more than the overlap saves
OVERLAP_S = 0.0005
_RECENT_BATCHES = 8  # the kernel batches whose median time ``lazy`` compares with ``overlap_s``


def _stops_start(gate: object) -> bool:
    """Whether a step that starts a command buffer at its commit stops at ``gate`` (what its generator yielded)."""
    return gate is KERNELS_IN_FLIGHT or gate is WOULD_BLOCK


class GPU:
    """The scheduler of one SimDevice (docs/simulator.md): queues committed command buffers, advances them one
    operation at a time (``executor`` runs them), fails a gate that outlives the watchdog, ends them (``_finish``).
    Every method expects the device lock held, except where said; kernels run with the lock released."""

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
        self.host_blocked: CommandQueue | None = None  # the queue a host thread is blocked on in commandBuffer
        # a kernel ran with its results left on the OpenCL device since the last ``sync`` (False: a sync has
        # nothing to bring back nor to mark stale, and is skipped)
        self.unsynced = False
        # command buffers a host thread waits for (``SimDevice.wait_command_buffers``): set when they end, so that
        # thread wakes once, at the end, not at every notify of the device's condition
        self.end_waiters: dict[CommandBuffer, threading.Event] = {}
        self.executor = Executor(self)  # runs the command buffers: their batches and kept launches
        self._shuffle: random.Random | None = None  # the queues' order under the device's order_seed (step_locked)
        # committed work the worker thread was not woken for (``submit``): a wait runs it (``drive``) or wakes the
        # worker (``wake``), or the worker finds it when its nap ends (``_START_S``)
        self.unwoken = False
        # the last command buffer committed while the host has sent no message since (``submit``), and whether the
        # host waited for its last commit before sending anything else (``waits_next``): the commit after such a
        # one leaves the worker asleep; a host that goes on encoding first (``moved_on``) gets the worker at once
        self.fresh: CommandBuffer | None = None
        self.waits_next = False
        self.drivers = 0  # host threads running the GPU's steps while they wait (``drive``): the worker naps then
        # the step running now is a committing host thread's start of its command buffer (``_may_start``): it stops
        # at the first kernels (the executor's ``KERNELS_IN_FLIGHT``, ``WOULD_BLOCK``)
        self.starting = False
        # what the idle worker naps on (``_worker``), not the device's condition: the notifies of the steps a host
        # runs (``drive``) would wake it at each, at a cost to both threads; ``wake`` and ``stop`` set it
        self._nudge = threading.Event()
        self.napping = False  # the worker thread is idle, napping on ``_nudge`` (a host's wait may then ``drive``)
        # the recent kernel batches' wall times (seconds: ``kernels_ran``), their median (``batch_s``) and the least
        # of it for which committed work wakes the worker at once (``lazy``)
        self._recent: deque[float] = deque([0.0] * _RECENT_BATCHES, maxlen=_RECENT_BATCHES)
        self._batch_s = 0.0
        self._overlap_s = OVERLAP_S

    @property
    def running(self) -> tuple[str, str, int] | None:
        """The kernel running now: (its function, the dispatch, its command buffer's handle); None between
        kernels. In a batch, the first of its kernels that has not completed (the runner's events say)."""
        if self._running is not None:
            return self._running
        flight = self.executor.in_flight
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
        idle = not self.pending()
        cb.seq = self.seq
        self.seq += 1
        cb.run = self.executor.execute(cb)
        arm_fault(self, cb)
        if cb.queue not in self.queues:
            self.queues.append(cb.queue)
        cb.queue.pending.append(cb)
        self.fresh = cb
        if self.dev.autorun and self.thread is not None and self.thread.is_alive():
            if idle and self.waits_next or self.lazy:
                # a host that waited for its last commit at once (the eager pattern: submit, then wait), or work of
                # short kernels (``lazy``): the worker is not woken now (waking a thread costs ~15 µs of the
                # committing thread's CPU here), the host's next wait runs the command buffer itself (``drive``);
                # else a blocking call wakes the worker (``wake``), or the worker finds it at its nap's end
                # (``_START_S``)
                self.unwoken = True
                if idle and self._may_start():
                    self._advance(cb, starting=True)
            else:  # work in flight already, or a host that goes on encoding after a commit (a pipelining host: its
                # GPU work overlaps its Python): the worker runs it meanwhile, as it runs the earlier ones
                self._rouse()
            return
        self.dev._cv.notify_all()
        if self.dev.autorun:
            self._ensure_worker()

    def _may_start(self, driving: int = 0) -> bool:
        """Whether the committing host thread starts the command buffer it just committed to an idle GPU itself, up
        to its first batch of kernels (``_advance(starting=True)``), instead of leaving it all to its next wait: the
        kernels then run on the OpenCL device while the host's Python goes on (the commit's return, the wait's
        messages), as Metal's GPU starts at the commit. The conditions of a host's ``drive``
        (``DeviceWaits._may_drive``) but the wait's length: the OpenCL kernel runner without Oclgrind's checks
        (``checked``) and no fault armed, on a thread that is not the worker, with no other thread in a step nor
        driving (``driving``: the calling thread's own ``drive``, 1 there); and not with the device's
        ``order_seed``, whose runs keep the scheduler's shuffled order alone (``step_locked``)."""
        if self.busy or self.drivers > driving or self.injected_fault is not None or self.faulty or self.dev.checked \
                or self.dev.order_seed is not None:
            return False
        runner = self.dev._runner
        worker = self.thread
        return (runner is None or type(runner) is KernelRunner) and \
            (worker is None or worker.ident != threading.get_ident())

    @property
    def overlap_s(self) -> float:
        """The least recent kernel batch time (seconds) for which committed work wakes the worker at once
        (``lazy``; ``SimDevice(overlap_s=...)``): a number >= 0, ``inf`` for always lazy, 0 for never. Setting
        anything else raises ``TypeError`` (not a number) or ``ArgumentError`` (negative, NaN)."""
        return self._overlap_s

    @overlap_s.setter
    def overlap_s(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"overlap_s: seconds are a number, got {type(value).__name__} {value!r}")
        try:
            seconds = float(value) + 0.0  # (-0.0 becomes 0.0)
        except OverflowError:
            seconds = math.inf if value > 0 else -math.inf
        if not seconds >= 0:  # NaN too
            raise ArgumentError(f"overlap_s: {value!r} seconds: a number >= 0 is needed (inf: always lazy)")
        self._overlap_s = seconds

    @property
    def lazy(self) -> bool:
        """Whether committed work is left to the host's next wait (or the worker's nap end, ``_START_S``) instead of
        waking the worker at once: while the recent kernel batches ran shorter than ``overlap_s`` seconds. Their
        overlap with the host's Python is then worth less than the thread hand-offs it costs (on two cores with the
        GIL, a TinyJit loop of 8 short kernels ran ~5-10% more CPU per call with the worker woken at each commit);
        a batch as long as ``overlap_s`` switches a pipelining host back to the overlap (docs/simulator.md, "Who
        runs the GPU")."""
        return self._batch_s < self._overlap_s

    def polling(self, obj: object) -> bool:
        """Whether a host reading a one-field getter of ``obj`` (``status``, ``signaledValue``, ``contents``:
        lockless messages) with committed work ``unwoken`` may be polling for it, which should then start (``wake``):
        never for an ended command buffer (a host reading the status and times of what it waited for); while the GPU
        is ``lazy``, only for a command buffer that has not ended (a Session reads its timeline event's value
        before each wait; a host spinning on an event's value sees the work start at the worker's nap end).
        Otherwise yes."""
        if type(obj) is CommandBuffer:
            return obj.status < MTL.StatusCompleted
        return not self.lazy

    def kernels_ran(self, seconds: float) -> None:
        """A batch of kernels ran ``seconds`` (wall time, the device lock released): one of the recent batches whose
        median ``lazy`` reads."""
        recent = self._recent
        recent.append(seconds)
        self._batch_s = sorted(recent)[_RECENT_BATCHES // 2]

    @property
    def batch_s(self) -> float:
        """The recent kernel batches' wall time, seconds: the (upper) median of the last ``_RECENT_BATCHES``
        (``kernels_ran``), which one slow batch (a burst of load on the machine) does not move. Setting it makes
        every recent batch that long."""
        return self._batch_s

    @batch_s.setter
    def batch_s(self, seconds: float) -> None:
        self._recent.extend([seconds] * _RECENT_BATCHES)
        self._batch_s = seconds

    def wake(self) -> None:
        """Wake the worker thread for work ``submit`` left without waking it (the lock held): called by a wait that
        does not run the GPU itself (``SimDevice.wait_for``, ``wait_command_buffers``, ``run_until_idle``) and by the
        host's next message (``msg_send``: a host that goes on encoding, or polls a status, sees the GPU go on)."""
        if self.unwoken:
            self.unwoken = False
            self._rouse()

    def waited(self, targets: list[CommandBuffer]) -> None:
        """A host thread waits for ``targets`` (the lock held): when they hold the last commit and the host sent no
        message since it, the next commit made with nothing in flight leaves the worker asleep (``submit``)."""
        if self.fresh is not None and self.fresh in targets:
            self.fresh = None
            self.waits_next = True

    def moved_on(self) -> None:
        """The host sends a message after a commit without having waited for it (the lock held): it pipelines, so
        commits wake the worker from now on, and the worker starts now on what the commit left it."""
        self.fresh = None
        self.waits_next = False
        if not self.lazy:
            self.wake()

    def _rouse(self) -> None:
        """End the worker's nap. It counts as awake from now on (``napping``), before it has run: a host that waits
        meanwhile blocks instead of driving, so the two do not take turns (each turn a hand-off)."""
        self.napping = False
        self._nudge.set()

    def pending(self) -> bool:
        """True while a committed command buffer has not finished."""
        return any(q.pending for q in self.queues)

    def step_locked(self) -> bool:
        """Advance the oldest runnable command buffer by one operation, or fail one whose gate outlived the
        watchdog. Returns False when nothing could run. With the device's ``order_seed`` the heads of the queues
        are tried in a shuffled order instead (Metal orders no two queues without a wait between them: a race
        between queues then shows as a result that depends on the seed)."""
        if self.busy:
            return False
        queues = self.queues
        if len(queues) == 1:  # one queue (a Session's, a context's): its head alone, no list to sort
            pending = queues[0].pending
            if not pending:
                return False
            head = pending[0]
            if head.gate is None:
                self._advance(head)
                return True
            heads = [head]
        else:
            heads = [q.pending[0] for q in queues if q.pending]
        if len(heads) > 1:
            heads.sort(key=lambda c: c.seq)
            if self.dev.order_seed is not None:
                if self._shuffle is None:
                    self._shuffle = random.Random(self.dev.order_seed)
                self._shuffle.shuffle(heads)
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

    def _advance(self, cb: CommandBuffer, starting: bool = False) -> None:
        """Run ``cb``'s next operation. With autorun (the worker thread, or a host thread running the steps it
        waits for: ``drive``), it runs on through the operations after it, up to a gate that is not met or the end,
        for at most ``_BATCH_S`` seconds, while no other queue has work: the steps that ``step_locked`` would run
        next are then exactly these (a queue runs its head alone; no other head to order before it, shuffle or
        watch), so one step saves the scheduling rounds between them (an eager command buffer: four rounds in one).
        A step that runs kernels releases the lock meanwhile, so the check is made again after each operation.
        ``SimDevice.step`` (autorun False) runs one operation. ``starting`` (a commit's start, ``_may_start``): stop
        once a batch of kernels is enqueued (``KERNELS_IN_FLIGHT``) or before one that would be waited for
        (``WOULD_BLOCK``), leaving the rest to the next step."""
        run = cb.run
        assert run is not None
        self.busy = True
        self.advancing = cb
        try:
            self.starting = starting
            gate = next(run)
            if self.dev.autorun and (gate is None or gate.ready()) and not (starting and _stops_start(gate)):
                until = clock() + _BATCH_S
                queues = self.queues
                while (len(queues) == 1 or self._alone(cb)) and clock() < until:
                    gate = next(run)
                    if gate is not None and (starting and _stops_start(gate) or not gate.ready()):
                        break
        except StopIteration:
            self._finish(cb, None)
        except GPUFault as fault:
            self._finish(cb, fault)
        except Exception as e:  # a bug of the simulator: fail this command buffer loudly, keep the GPU alive
            self.last_exception = e
            self._finish(cb, GPUFault(MTL.ErrorInternal, f"the simulated GPU failed: {type(e).__name__}: {e}"))
        except BaseException as e:  # KeyboardInterrupt on a host thread running the step (``drive``): the step is
            # lost (its generator is closed), so the command buffer ends in Error instead of looking completed later
            self._finish(cb, GPUFault(MTL.ErrorInternal, f"the simulated GPU's step was interrupted on the host "
                                                         f"thread running it ({type(e).__name__})"))
            raise
        else:
            if gate is not None and not gate.ready():
                lost = self._synced()  # the host may be what the gate waits for: it sees the results so far
                if lost is not None:
                    self._finish(cb, lost)
                else:
                    cb.gate, cb.blocked_since = gate, clock()
        finally:
            self.busy = self.starting = False
            self.advancing = None

    def _alone(self, cb: CommandBuffer) -> bool:
        """Whether ``cb``'s queue is the only one with committed work (``_advance`` runs on)."""
        mine = cb.queue
        for q in self.queues:
            if q.pending and q is not mine:
                return False
        return True

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
                if self.drivers:  # a host thread runs the GPU while it waits (``drive``)
                    idle_since = clock()
                else:
                    self.unwoken = False
                    start = clock()
                    did = False
                    while self.step_locked():
                        did = True
                        if clock() - start > _BATCH_S:
                            break
                    if did:
                        idle_since = clock()
                        continue
                    if self.pending():  # the heads wait on gates: a signal, an end or the host notifies
                        cv.wait(0.005)
                        continue
                    if clock() - idle_since > _IDLE_EXIT_S:
                        self.thread = None
                        return
                self.napping = True  # under the lock, as ``_rouse``: a rouse from now on ends the nap below
            self._nudge.wait(_START_S)  # idle: a commit's work is found at the latest when the nap ends
            self.napping = False
            self._nudge.clear()

    def drive(self, targets: list[CommandBuffer], deadline: float) -> bool | None:
        """Run the GPU's steps on the calling host thread (the device lock held) until every command buffer of
        ``targets`` has ended, or until ``deadline`` (``clock()`` seconds): True when they all ended, False at the
        deadline (``SimDevice.wait_command_buffers``); None when another thread is running a step (the worker, or
        a host thread driving too): it goes on with the rest, and the caller blocks until the end instead (waking
        at every step's notify would cost more). The host would only block meanwhile; running the steps itself
        saves the thread hand-offs of a submit (the worker's wake at the commit, the host's at the end: each costs
        both threads CPU, ~15 µs on the waking side here). Every queue's command buffers advance, oldest first,
        with the watchdogs (``step_locked``); a step that runs kernels releases the lock meanwhile, as on the
        worker. The worker thread naps while a host drives and is woken for what is left. A step is not cut short:
        a batch of kernels running at the deadline keeps this thread until it ends (``kernel_timeout_s`` bounds a
        kernel that does not end), so ``wait_command_buffers`` drives only for a wait at least that long."""
        cv = self.dev._cv
        self.drivers += 1
        self.unwoken = False  # this thread runs what is committed
        ended = MTL.StatusCompleted
        try:
            while True:
                for cb in targets:
                    if cb.status < ended:
                        break
                else:
                    self._start_next()
                    return True
                left = deadline - clock()
                if left <= 0 or self.stopping:
                    return False
                if not self.step_locked():
                    if self.busy:
                        return None
                    cv.wait(min(left, 0.005))  # the heads wait on gates: a signal or an end notifies
        finally:
            self.drivers -= 1
            if self.pending():  # later work (a pipelining host's next submit): the worker runs it meanwhile, or
                if self.lazy:  # the host's next wait (short kernels: ``lazy``)
                    self.unwoken = True
                else:
                    self._rouse()

    def _start_next(self) -> None:
        """After a host's ``drive`` ended what it waited for: start the oldest command buffer committed since (a
        pipelining host's next one, which its next wait runs) up to its first kernels, as a commit to an idle GPU
        does (``_may_start``), so they run while the host goes on; not while another command buffer's batch is
        in flight (the executor's ``in_flight``: starting would wait for it), and only while the GPU is lazy (else
        the worker runs it, woken in ``drive``'s end)."""
        if not self.lazy or self.executor.in_flight is not None:
            return
        head = None
        for q in self.queues:  # the oldest head, as ``step_locked`` picks it
            if q.pending and (head is None or q.pending[0].seq < head.seq):
                head = q.pending[0]
        if head is not None and head.status == MTL.StatusCommitted and self.dev.autorun and self._may_start(driving=1):
            self._advance(head, starting=True)  # (Committed: not begun, so not stopped before a blocking operation)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the worker thread (called without the lock held): it ends after the operation it is running. When
        that is a kernel that is not finishing (one past its timeout, which OpenCL cannot stop) it is left running
        on its daemon thread instead of being waited for. A batch of kernels started at a commit and not waited for
        yet is waited for, at most ``timeout_s`` seconds (``KernelRunner.drain``): its kernels work in host memory."""
        with self.dev._cv:
            self.stopping = True
            thread = self.thread
            self.dev._cv.notify_all()
            self._nudge.set()
            for ended in self.end_waiters.values():  # host threads blocked until a command buffer ends: they go
                ended.set()  # on now, and their next call to the device names it closed (not their timeout)
        if thread is not None and thread is not threading.current_thread():
            deadline = clock() + timeout_s
            while thread.is_alive() and clock() < deadline:
                thread.join(0.05)
                if self.in_kernel:
                    thread.join(0.2)  # a kernel that ends now still gets its command buffer finished
                    return
        runner = self.dev._runner
        if type(runner) is KernelRunner:  # kernels started at a commit (``_may_start``) and not waited for
            runner.drain(timeout_s)

    def signal(self, ev: SharedEvent, value: int) -> None:
        """The GPU signals ``ev``: the value only increases, a smaller one is ignored (rule 12). The results so far
        reach the host first (``sync``): a waiter may read them once it sees the value."""
        self.sync()
        if value > ev.value:
            ev.value = value
            notify_waiters(self.dev._cv)

    def run_kernel_now(self, p: Pipeline, bindings: dict[int, tuple[np.ndarray, int]], grid: tuple[int, int, int],
                       threadgroup: tuple[int, int, int]) -> None:
        """Run one kernel at once on the caller's thread (strict mode's dry runs; the lock stays held)."""
        with self.kernel_lock:
            p.kernel.run(bindings, grid, threadgroup)

    def _synced(self) -> GPUFault | None:
        """``sync``, with a kernel runner that fails to bring the results back (OpenCL's context lost after a
        device fault: ``CL_INVALID_COMMAND_QUEUE``) turned into the command buffer's fault, Internal, naming the
        error: the thread running the step (the worker, or a host driving its wait) goes on, and the command buffer
        ends in Error instead of being left half-finished."""
        try:
            self.sync()
        except Exception as e:
            self.last_exception = e
            return GPUFault(MTL.ErrorInternal, f"the kernels' results could not be brought back to the host: "
                                               f"{type(e).__name__}: {e}")
        return None

    def _finish(self, cb: CommandBuffer, fault: GPUFault | None) -> None:
        if self.unsynced:  # the command buffer's results reach the host before its status says completed
            lost = self._synced()
            fault = fault or lost
        if self.faulty:
            fault = unfired_fault(self, cb, fault)
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
                    forget_fence_history(step)
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
        notify_waiters(self.dev._cv)
        release_references(self.dev, cb)  # retainedReferences: what was encoded into it lives until now
        self.dev._release_internal(cb)

"""Session: link a Program once, then replay it: ``submit(**values)`` many times, ``wait(value, timeout_s)``.

A submit runs the Program with this run's values (the timeline value, symbolic sizes, variables) inside an
autorelease pool (``objc_autoreleasePoolPush``/``Pop``), then reads the command buffers it committed from the
``cbslots`` table (the Program retains each one it stores there: ``commandBuffer`` returns +0) and keeps them in
an in-flight record: O(1) work and memory per submit, whatever the history. ``wait(value)`` reads the timeline
(``signaledValue`` on the shared event) and the ``status`` of those command buffers (between reads it blocks until
they end on a bridge that offers ``wait_command_buffers``, a SimDevice; elsewhere it sleeps), and returns only once the
timeline has reached ``value`` and the command buffers of every submit up to the one that signals it are complete:
status Error raises ``GPUExecutionError`` with Metal's error code, its name and the NSError's description (Metal
skips a failed command buffer's event signals, METAL.md §3 rule 6, so waiting for the value alone would hang); past
the timeout ``WaitTimeoutError`` names the value awaited and the last value signaled. A completed submit's
``GPUStartTime``/``GPUEndTime`` (seconds; 0.0 is Metal's "not available", kept as None) are read and converted once
to integer nanoseconds (``GpuSpan``: one per command buffer, never split per kernel), the timestamp slots of a
profiled submit filled (``Stamp`` entries of the ``cbslots`` payload), then its command buffers are released.

An error raised while the Program runs (a strict-mode ``MetalValidationError``, a ``BridgeError``) is re-raised
as it is: what the cleanup after it raises in turn (the pool pop deallocating the encoder the error left open:
rule 2) is attached to it as a note, never in its place.

By default a submit first waits for the previous one: a submit patches the variables buffer and the ICB's
commands from the CPU, which races with a command buffer still reading them (METAL.md §3 rule 15).
"""
from __future__ import annotations

import collections
import itertools
import math
import operator
import struct
import time
import warnings
from collections.abc import Mapping
from typing import Any

from mtlir.metal import MTL
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.bridge.recording import Message, RecordingBridge
from mtlir.errors import (ArgumentError, DeviceClosedError, GPUExecutionError, LinkError, MtlirError, StateError,
                          WaitTimeoutError)
from mtlir.runtime.executors.executor import Executor, bind_variables
from mtlir.runtime.link.link import link
from mtlir.runtime.link.linked import Linked
from mtlir.runtime.executors.replay import make_executor
from mtlir.runtime.submission import GpuSpan, Submission, TimelineValues, gpu_seconds, seconds_to_ns

__all__ = ["Session", "DEFAULT_TIMELINE_VAR", "device_closed"]

DEFAULT_TIMELINE_VAR = "timeline"


class Session:
    """A linked Program replayed many times through one Bridge.

    ``initial``: buffer name -> bytes (``link``). ``executor``: ``"compiled"`` (default) or ``"interpreter"``.
    ``timeline_var``: the Program variable holding the value a submit signals on the timeline; when the Program
    has it and ``submit`` is not given it, each submit takes the next value of ``timeline_values`` (1, 2, ...:
    above every value submitted, refused or signaled by the host, ``TimelineValues``; a ``DeviceContext`` passes
    the one its Sessions share). ``timeout_s``: the default
    wait timeout in seconds. ``serialize``: wait for the previous submit before the next (METAL.md §3 rule 15).
    ``keep_completed``: how many completed Submissions ``completed`` keeps (``submits_completed`` counts them all).
    ``shared``: objects made elsewhere that the Program uses instead of making its own (``link``'s ``shared``: a
    ``mtlir.runtime.context.DeviceContext`` shares its queue, event, fence, pipelines and residency set).

    Raises ``DeviceClosedError`` on a closed device, ``TypeError`` when ``program`` is not a ``Program`` (the
    result of ``mtlir.lower`` is a ``Lowered``:
    pass its ``.program``), ``TypeError``/``ValueError`` for a ``timeout_s`` that is not a positive finite number
    of seconds, and what ``link`` raises (``TypeError`` for initial data that is not bytes, naming the buffer; ``LinkError``); use
    as a context manager or call ``close()``."""

    def __init__(self, program: Program, bridge: Bridge, *, initial: Mapping[str, Any] | None = None,
                 executor: str = "compiled", timeline_var: str = DEFAULT_TIMELINE_VAR, timeout_s: float = 30.0,
                 serialize: bool = True, max_command_buffers: int = 1024, keep_completed: int = 64,
                 shared: Mapping[str, int] | None = None, timeline_values: TimelineValues | None = None) -> None:
        if not isinstance(program, Program):
            hint = (f"pass its .program (Session(lowered.program, ...)): mtlir.lower returns a {type(program).__name__}"
                    " that holds the Program" if isinstance(getattr(program, "program", None), Program)
                    else "lower a Queue with mtlir.lower(...) and pass the result's .program")
            raise TypeError(f"Session(program, ...): a Program is needed, got {type(program).__name__}: {hint}")
        closed = device_closed(bridge, "Session(...)")
        if closed is not None:
            raise closed
        self.program, self.bridge = program, bridge
        self.timeout_s = _seconds(timeout_s, "Session(timeout_s=...)", zero=False)
        self.serialize = serialize
        self.timeline_var = timeline_var if timeline_var in program.variables else None
        self.linked: Linked = link(program, bridge, initial=initial, max_command_buffers=max_command_buffers,
                                   shared=shared)
        self.executor_kind = executor
        self.executor: Executor = make_executor(executor, program, bridge, self.linked.registers)
        self.messenger = self.linked.messenger  # the bookkeeping messages (pool, status, release, errors)
        events = self.linked.of_kind("event")  # the default queue's timeline, "event", is the one submits wait for
        timeline = "event" if "event" in events else (events[0] if events else None)
        self.event: int | None = self.linked.handles[timeline] if timeline is not None else None
        self.timeline_reader = "none" if self.event is None else "message"
        self._read_timeline: Executor | None = None
        if self.event is not None and program.timeline_read is not None:
            self._read_timeline = self._timeline_program(program.timeline_read, executor)
        slots = self.linked.of_kind("cbslots")
        if len(slots) > 1:
            raise ValueError(f"a Program with {len(slots)} cbslots tables: one is supported")
        self._slots = None
        self.stamps: tuple[Any, ...] = ()
        if slots:
            payload = self.linked.objects[slots[0]].payload
            self._slots = (self.linked.handles[slots[0]], int(payload[0]))
            self.stamps = tuple(payload[1]) if len(payload) > 1 else ()
        self.inflight: collections.deque[Submission] = collections.deque()
        self.completed: collections.deque[Submission] = collections.deque(maxlen=keep_completed)
        self.last_value = 0  # the timeline value of the last submit recorded
        self.highest_value = 0  # the highest timeline value a submit of this Session committed
        self.timeline_values = timeline_values if timeline_values is not None else TimelineValues()
        # the Sessions whose submits share this one's queue and event (a DeviceContext's: it sets its list here);
        # a fault the device reports late (``_deferred_fault``) is looked for among their submits in flight
        self.peers: list[Session] = [self]
        self.submits = 0
        self.submits_completed = 0  # submits whose command buffers all completed (waited for: ``_finish``)
        self.host_s_total = 0.0
        self.closed = False

    def _timeline_program(self, read: Program, executor: str) -> Executor:
        """An executor of ``read`` (``Program.timeline_read``: the lowered timeline read) over this link's objects.
        Raises ``LinkError`` when it names a placeholder this link did not make."""
        regs = self.linked.registers_for(read)
        ex = make_executor(executor, read, self.bridge, regs, results=(read.results["timeline"],))
        self.timeline_reader = "program"
        return ex

    def timeline_value(self) -> int:
        """The timeline's current value (``signaledValue`` of the shared event), read by the Program's lowered
        timeline read (``Program.timeline_read``), or with the message itself for a Program without one (written
        by hand); 0 when there is no event. Raises ``StateError`` on a closed Session or device."""
        self._check_open("timeline_value")
        return self._read_value()

    def _read_value(self) -> int:
        if self._read_timeline is not None:
            return int(self._read_timeline.run()[0])
        return int(self.messenger.send(self.event, "signaledValue")) if self.event else 0

    # ---- any event of the Program, from the host (several queues: docs/runtime.md)

    def _event(self, name: str) -> int:
        if name not in self.linked.of_kind("event"):
            raise ArgumentError(f"no event {name!r} in this Program: it has "
                                f"{', '.join(self.linked.of_kind('event')) or 'none'}")
        return int(self.linked.handles[name])

    def event_value(self, name: str) -> int:
        """The ``signaledValue`` of the Program's event ``name`` (``"event"``, ``"event:copy"``: a queue's timeline or
        a shared_event). Raises ``ValueError`` for a name the Program has no event of."""
        self._check_open("event_value")
        return int(self.messenger.send(self._event(name), "signaledValue"))

    def signal_event(self, name: str, value: int) -> None:
        """Signal event ``name`` from the host (``setSignaledValue:``; Metal keeps the larger of the two values):
        command buffers waiting for ``value`` or less go on. On the timeline's event the next default timeline
        value is then above ``value`` (``timeline_values``: rule 12 would refuse a lower one for ever). Raises
        ``ValueError`` for an unknown name."""
        self._check_open("signal_event")
        handle = self._event(name)
        self.messenger.send(handle, "setSignaledValue:", int(value))
        if handle == self.event:
            self.timeline_values.see(int(value))

    def wait_event(self, name: str, value: int, timeout_s: float | None = None) -> None:
        """Wait on the host until event ``name`` reaches ``value`` (``waitUntilSignaledValue:timeoutMS:``); raises
        ``WaitTimeoutError`` after ``timeout_s`` seconds (default: the session's) naming the event, the value and its
        current value, ``ValueError`` for an unknown name."""
        self._check_open("wait_event")
        timeout = self.timeout_s if timeout_s is None else _seconds(timeout_s, "wait_event(timeout_s=...)")
        handle = self._event(name)
        if not self.messenger.send(handle, "waitUntilSignaledValue:timeoutMS:", int(value), int(timeout * 1000)):
            raise WaitTimeoutError(f"wait_event({name!r}, {value}): not reached after {timeout} s (its value is "
                                   f"{self.event_value(name)})")

    # ---- submit

    def submit(self, **values: Any) -> Submission:
        """Run the Program once with ``values`` (variables by name); returns the in-flight Submission.

        The timeline variable, when not given, is the next value of ``timeline_values`` (above every value
        submitted, refused, or signaled by the host on the timeline's event). Raises ``ValueError``/``TypeError``
        for a missing, unknown or out-of-bounds variable (before anything is sent, and before waiting for the
        previous submit), ``StateError`` on a closed Session (``DeviceClosedError``: a closed device),
        ``GPUExecutionError`` or ``TimeoutError`` from waiting for the previous submit, and what the Bridge raises
        while the Program runs: that error itself, with what the cleanup after it raised as notes
        (``_failed_run``)."""
        self._check_open("submit")
        if self.timeline_var is not None and self.timeline_var not in values:
            values[self.timeline_var] = self.timeline_values.value + 1
        if self.serialize and self.inflight:
            bind_variables(self.program, values)  # this submit's own bad value first, not behind the wait
            self._wait(None, self.timeout_s)
        value = int(values[self.timeline_var]) if self.timeline_var is not None else None
        b = self.bridge
        t0 = time.perf_counter()
        slots = self._slots
        if slots is not None:
            b.write(slots[0], bytes(8 * slots[1]))
        try:
            pool = self.messenger.push()
        except BaseException as e:  # nothing of this submit ran: an error the device deferred, a closed device
            self._deferred_fault(e, time.monotonic() + self.timeout_s)
            raise
        try:
            self.executor.run(**values)
            cbs = self._read_slots()
            self.messenger.pop(pool)
        except BaseException as e:
            self._failed_run(e, pool, value, t0)
            raise
        return self._record(value, cbs, t0)

    def _read_slots(self) -> tuple[int, ...]:
        """The command buffers this submit stored into ``cbslots`` (0 for an empty slot)."""
        slots = self._slots
        if slots is None:
            return ()
        return struct.unpack(f"<{slots[1]}Q", self.bridge.read(slots[0], 8 * slots[1]))

    def _record(self, value: int | None, cbs: tuple[int, ...], t0: float) -> Submission:
        dt = time.perf_counter() - t0
        rec = Submission(self.submits, value, cbs, dt)
        self.inflight.append(rec)
        self.submits += 1
        self.host_s_total += dt
        if value is not None:
            self.last_value = value
            self.highest_value = max(self.highest_value, value)
            self.timeline_values.see(value)
        return rec

    def _failed_run(self, error: BaseException, pool: int, value: int | None, t0: float) -> None:
        """Clean up after the Program raised ``error`` mid-submit, without ever hiding it: drain the autorelease
        pool (which may raise in turn, e.g. rule 2 for the encoder the error left open), release the command
        buffers it retained that were never committed, and keep the committed ones in flight (``wait`` checks
        and releases them; they signal no value the session relies on). The run's timeline ``value`` is skipped
        by the next default one, unless the run refused a variable's value before sending anything (its
        ``ArgumentError``/``TypeError``): a value rule 12 refused would be refused again. An error the device
        deferred (earlier work's fault) is accounted for (``_deferred_fault``). Each secondary error becomes a note
        on ``error``, which the caller re-raises."""
        def note(step: str, e: BaseException) -> None:
            error.add_note(f"then, while {step}: {type(e).__name__}: {' '.join(str(e).split())}")
        cbs: tuple[int, ...] = ()
        try:
            cbs = self._read_slots()
        except Exception as e:
            note("reading the command buffers of the failed submit from cbslots", e)
        try:
            self.messenger.pop(pool)
        except Exception as e:
            note("draining the failed submit's autorelease pool", e)
        kept: list[int] = []
        for cb in cbs:
            if not cb:
                kept.append(0)
                continue
            try:
                if int(self.messenger.send(cb, "status")) >= MTL.StatusCommitted:
                    kept.append(cb)
                    continue
                kept.append(0)
                self.messenger.send(cb, "release")
            except Exception as e:
                kept.append(0)
                note(f"releasing the uncommitted command buffer {cb:#x} of the failed submit", e)
        if any(kept):
            self._record(None, tuple(kept), t0)
            if value is not None:  # its signal may be encoded: the next submit takes a higher value
                self.last_value = max(self.last_value, value)
                self.highest_value = max(self.highest_value, value)
        if value is not None and not isinstance(error, (ArgumentError, TypeError)):
            self.timeline_values.see(value)  # refused or used: the next default value is above it
        self._deferred_fault(error, time.monotonic() + self.timeout_s)

    def record_submit(self, **values: Any) -> list[Message]:
        """The messages one submit sends, in order, as ``RecordingBridge`` records them (the Program's messages
        only: no waits). The submit really runs and is in flight afterwards."""
        rec_bridge = RecordingBridge(self.bridge, names=self.linked.names)
        recorder = make_executor(self.executor_kind, self.program, rec_bridge, self.linked.registers)
        saved, self.executor = self.executor, recorder
        rec_bridge.clear()
        try:
            self.submit(**values)
        finally:
            self.executor = saved
        return rec_bridge.messages

    # ---- wait

    def wait(self, value: int | None = None, timeout_s: float | None = None) -> list[Submission]:
        """Wait until the timeline has reached ``value`` (``signaledValue`` >= ``value``) and every submit up to
        the first one that signals ``value`` or more has completed (default, ``value=None``: every submit in
        flight); returns the Submissions that completed, with their GPU times, their command buffers released.

        A ``value`` between the values of two submits (1 and 3: explicit values, or one skipped after a failed
        submit) waits for the submit that signals 3, unless a failed submit before it (its command buffers
        committed) signals the value first. Returns at once when the timeline is already at ``value`` and
        nothing in flight comes before it: a value above this Session's submits that the timeline has reached
        (signaled by the host, or by another Session on the same event: a ``DeviceContext``'s) waits only for this
        Session's submits in flight. Raises ``ValueError`` naming the last value signaled when no submit will
        signal ``value``: above the highest value this Session submitted and not reached yet, or once every submit
        that could have signaled it has ended without doing so (Metal skips the signals of a command buffer that
        failed, METAL.md §3 rule 6, and a submit that failed before committing its signal signals nothing);
        ``GPUExecutionError`` (``code``, ``name``) as soon as one of the command buffers waited for is in status
        Error; ``WaitTimeoutError`` (a ``DeviceError`` and a ``TimeoutError``) after ``timeout_s`` seconds
        (default: the session's) naming the value awaited, the last value signaled and the statuses of the
        command buffers still pending; an error the device deferred (strict mode's out-of-bounds access) as it
        is, its submit released (``_deferred_fault``: it is reported once). ``timeout_s`` must be a finite number
        of seconds >= 0 (0 polls once) and ``value`` an int >= 0: ``TypeError``/``ValueError`` otherwise;
        ``StateError`` (a ``RuntimeError``) on a closed Session, ``DeviceClosedError`` at once on a closed
        device."""
        self._check_open("wait")
        return self._wait(value, timeout_s)

    def _wait(self, value: int | None, timeout_s: float | None) -> list[Submission]:
        """``wait`` without the checks of a closed Session; an error the device deferred is accounted for
        (``_deferred_fault``) before it is raised."""
        timeout = self.timeout_s if timeout_s is None else _seconds(timeout_s, "wait(timeout_s=...)")
        deadline = time.monotonic() + timeout
        try:
            return self._wait_until(value, timeout, deadline)
        except MtlirError as e:
            self._deferred_fault(e, deadline)
            raise

    def _wait_until(self, value: int | None, timeout: float, deadline: float) -> list[Submission]:
        if value is not None:
            try:
                if isinstance(value, bool):
                    raise TypeError
                value = operator.index(value)
            except TypeError:
                raise TypeError(f"wait(value={value!r}): a timeline value is an int (or None: everything "
                                f"submitted), got {type(value).__name__}") from None
            if value < 0:
                raise ArgumentError(f"wait({value}): timeline values are >= 0")
            if value > self.highest_value:
                current = self._timeline_now()
                if current is None or current < value:
                    raise ArgumentError(self._unsubmitted_text(value, current))
        target = self.last_value if value is None else value
        pending = self._pending(value)
        delay = 0.0
        done: list[Submission] = []
        block = getattr(self.bridge, "wait_command_buffers", None)  # a SimDevice: block until they end
        if block is not None and pending and value is None:  # everything is awaited: block before the first reads
            block([cb for cb in pending[0].cbs if cb], timeout)
        while True:
            current = self._timeline_now()
            running: list[int] = []  # the head submit's command buffers that have not ended
            while pending:
                rec = pending[0]
                live = [cb for cb in rec.cbs if cb]
                statuses = [int(self.messenger.send(cb, "status")) for cb in live]
                if MTL.StatusError in statuses:
                    self._fail(rec, deadline)
                reached = rec.value is None or current is None or current >= rec.value
                if not reached or any(st != MTL.StatusCompleted for st in statuses):
                    running = [cb for cb, st in zip(live, statuses) if st < MTL.StatusCompleted]
                    break
                self._finish(rec)
                done.append(pending.pop(0))
            if value is not None and current is not None and len(pending) == 1 \
                    and value <= current < (pending[0].value or 0):
                return done  # a failed submit before it signaled the value: the next one has not signaled yet
            if not pending:
                if value is None or current is None or current >= value:
                    return done
                current = self._timeline_now()  # once more: what completed has signaled by now
                if current is not None and current < value:
                    raise ArgumentError(f"wait({value}): no submit will signal timeline value {value}: every submit "
                                     f"that could have signaled it has ended without doing so (its command "
                                     f"buffer failed, or the submit failed before committing its signal), and "
                                     f"{self._signaled_text(current)}")
                return done
            left = deadline - time.monotonic()
            if left < 0:
                raise WaitTimeoutError(self._timeout_text(target, current, pending, timeout))
            if block is not None and running:
                block(running, left)  # wakes when they end (or at the deadline): the loop then reads them
            else:  # any other bridge, or what is awaited is not the end of a command buffer (another queue's signal)
                time.sleep(delay)
                delay = min(delay * 2 or 1e-5, 1e-3)

    def _pending(self, value: int | None) -> list[Submission]:
        """The in-flight submits a wait for ``value`` waits for, oldest first: every one for None; else every one up
        to the first that signals ``value`` or more (reaching ``value`` needs it), or all of them when none does
        (the failed submits among them may still signal it)."""
        if value is None:
            return list(self.inflight)
        for i, rec in enumerate(self.inflight):
            if rec.value is not None and rec.value >= value:
                return list(itertools.islice(self.inflight, i + 1))
        return list(self.inflight)

    def _timeline_now(self) -> int | None:
        """The timeline's value (``timeline_value``), None when the Program has no event."""
        return self._read_value() if self.event is not None else None

    def _unsubmitted_text(self, value: int, current: int | None) -> str:
        """Why ``wait(value)`` for a value above this Session's submits, not reached yet, is refused."""
        if self.timeline_var is None:
            why = "this Program signals no timeline value"
        else:
            why = f"the highest timeline value submitted is {self.highest_value}"
            given = self.timeline_values.value
            if len(self.peers) > 1 and value <= given:
                why += (f" by this Session (the timeline is shared with the other Sessions of its DeviceContext, "
                        f"which hand out values up to {given}: wait on the Session that submitted {value}, or "
                        "DeviceContext.synchronize)")
        return f"wait({value}): no submit signals timeline value {value}: {why}, and {self._signaled_text(current)}"

    @staticmethod
    def _signaled_text(current: int | None) -> str:
        return ("this Program has no timeline" if current is None
                else f"the last value signaled is {current}")

    def _check_open(self, what: str) -> None:
        """``StateError`` when this Session is closed, ``DeviceClosedError`` when its device (the Bridge) says it
        is (``closed``: ``SimDevice.close()``): nothing sent to it would answer, a wait would sit out its timeout."""
        if self.closed:
            raise StateError(f"{what} on a closed Session (its close() was called)")
        closed = device_closed(self.bridge, f"{what} on a Session")
        if closed is not None:
            raise closed

    def _deferred_fault(self, error: BaseException, deadline: float) -> None:
        """When ``error`` is one the device deferred (``deferred``: strict mode's out-of-bounds access, a buffer
        freed in flight, a checked kernel's report: raised at the host's next call, docs/simulator.md), the GPU
        work that caused it ends its command buffer in status Error: find that submit among the submits in flight
        of this Session and its peers (a DeviceContext's Sessions), release it and name it in a note on
        ``error``, so no later wait reports the same fault again as ``GPUExecutionError``. The command buffers
        already ended are looked at first; then, until ``deadline``, each submit in flight in turn is waited
        for. Any other error is left alone; what the search raises becomes a note."""
        if not getattr(error, "deferred", False) or isinstance(error, DeviceClosedError):
            return
        block = getattr(self.bridge, "wait_command_buffers", None)
        try:
            if block is not None:
                block((), 0.0)  # the device's lock: what the GPU was finishing when it deferred the error is done
            for patient in (False, True):
                for s in self.peers:
                    for rec in list(s.inflight):
                        live = [cb for cb in rec.cbs if cb]
                        if patient and block is not None:
                            block(live, max(0.0, deadline - time.monotonic()))
                        statuses = [int(s.messenger.send(cb, "status")) for cb in live]
                        if MTL.StatusError in statuses:
                            s._account(rec, error, live[statuses.index(MTL.StatusError)], self)
                            return
                        if patient and any(st < MTL.StatusCompleted for st in statuses):
                            break  # still running at the deadline: the later ones of that Session have not run
        except Exception as e:
            error.add_note(f"then, while looking for the submit the error belongs to: {type(e).__name__}: {e}")

    def _account(self, rec: Submission, error: BaseException, cb: int, reporter: Session) -> None:
        """``rec``'s command buffer ``cb`` failed with ``error``, which ``reporter`` raises: release and drop the
        submit (``_fail``'s cleanup without the wait) and say so in a note."""
        code, name, _ = self._error_of(cb)
        self._release(rec)
        self._drop(rec)
        val = f" (timeline value {rec.value})" if rec.value is not None else ""
        whose = "" if reporter is self else " of another Session of its DeviceContext"
        error.add_note(f"it is the fault of submit {rec.index}{val}{whose}: its command buffer {rec.cbs.index(cb)} "
                       f"ended in status Error, MTLCommandBufferError {code} ({name}); the submit is released, no "
                       "later wait reports it again")

    def _finish(self, rec: Submission) -> None:
        """Read the GPU times of a completed submit (``gpu_times``, ``spans``, ``timestamps``), release its command
        buffers and move it to ``completed``."""
        m = self.messenger
        rec.gpu_times = [(gpu_seconds(m.send(cb, "GPUStartTime")), gpu_seconds(m.send(cb, "GPUEndTime"))) if cb
                         else (None, None) for cb in rec.cbs]
        rec.spans = [GpuSpan(slot, seconds_to_ns(start), seconds_to_ns(end))
                     for slot, (cb, (start, end)) in enumerate(zip(rec.cbs, rec.gpu_times)) if cb]
        for st in self.stamps:  # Stamp(slot, cb, which): slot <- GPUStartTime/GPUEndTime of cbslots[cb]
            if st.cb < len(rec.cbs) and rec.cbs[st.cb]:
                rec.timestamps[st.slot] = rec.gpu_times[st.cb][0 if st.which == "GPUStartTime" else 1]
        self._release(rec)
        self._drop(rec)
        self.completed.append(rec)
        self.submits_completed += 1

    def _release(self, rec: Submission) -> None:
        """Release the command buffers the Program retained when it stored them into cbslots."""
        for cb in rec.cbs:
            if cb:
                self.messenger.send(cb, "release")

    def _drop(self, rec: Submission) -> None:
        if self.inflight and self.inflight[0] is rec:  # the oldest: O(1)
            self.inflight.popleft()
        else:
            self.inflight = collections.deque(r for r in self.inflight if r is not rec)

    def _fail(self, rec: Submission, deadline: float) -> None:
        """A command buffer of ``rec`` is in status Error: wait (until ``deadline``, the wait's own) for the submit's
        other command buffers to end, release them all and raise ``GPUExecutionError`` for the first failed one in
        cbslots order: its slot, Metal's code, its name and the NSError's description, and what became of the
        command buffers after it (ran: Completed; failed: Error and its code's name; still in flight at the
        timeout), in the message and in ``command_buffers``."""
        m = self.messenger
        live = [(slot, cb) for slot, cb in enumerate(rec.cbs) if cb]
        delay = 0.0
        while True:
            statuses = {slot: int(m.send(cb, "status")) for slot, cb in live}
            if all(st >= MTL.StatusCompleted for st in statuses.values()) or time.monotonic() > deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2 or 1e-5, 1e-3)
        errors = {slot: self._error_of(cb) for slot, cb in live if statuses[slot] == MTL.StatusError}
        which = min(errors)
        code, name, desc = errors[which]
        final = {slot: (f"Error ({errors[slot][1]})" if slot in errors else
                        MTL.STATUS_NAMES[st] if 0 <= st < len(MTL.STATUS_NAMES) else str(st))
                 for slot, st in statuses.items()}
        self._release(rec)
        self._drop(rec)
        val = f" (timeline value {rec.value})" if rec.value is not None else ""
        after = [f"command buffer {slot} {text} ({_ran(text)})" for slot, text in final.items() if slot > which]
        after_text = f"after it: {', '.join(after)}" if after else "no command buffer of the submit comes after it"
        raise GPUExecutionError(f"submit {rec.index}{val}: command buffer {which} failed with status Error, "
                                f"MTLCommandBufferError {code} ({name}); {after_text}: {desc}", code, name,
                                submit=rec.index, command_buffer=which, command_buffers=final)

    def _error_of(self, cb: int) -> tuple[int, str, str]:
        """The failed command buffer ``cb``'s NSError: (code, the code's name, localizedDescription)."""
        err = int(self.messenger.send(cb, "error") or 0)
        code, desc = 0, "no NSError"
        if err:
            code = int(self.messenger.send(err, "code"))
            text = self.messenger.send(err, "localizedDescription")
            desc = self.bridge.read_cstring(self.messenger.send(text, "UTF8String")) if text else "(no description)"
        return code, MTL.ERROR_NAMES.get(code, "Unknown"), desc

    def _timeout_text(self, target: int, current: int | None, pending: list[Submission], timeout: float) -> str:
        parts = []
        for rec in pending[:4]:
            sts = [MTL.STATUS_NAMES[s] if 0 <= s < 6 else str(s)
                   for s in (int(self.messenger.send(cb, "status")) for cb in rec.cbs)]
            parts.append(f"submit {rec.index} (value {rec.value}): {', '.join(sts) or 'no command buffers'}")
        more = f" and {len(pending) - 4} more" if len(pending) > 4 else ""
        return (f"timed out after {timeout:g} s waiting for timeline value {target} "
                f"({self._signaled_text(current)}){self._running_text()}; command buffer statuses: "
                f"{'; '.join(parts)}{more}")

    def _running_text(self) -> str:
        """``: kernel 'k' is still running (ICB command 0 of ...), in command buffer 0 of submit 3 (value 4)`` when
        the bridge can tell which kernel runs now (``SimDevice.running_kernel``; real Metal cannot), else ""."""
        running = getattr(self.bridge, "running_kernel", None)
        if not running:
            return ""
        function, dispatch, cb = running
        where = next((f", in command buffer {rec.cbs.index(cb)} of submit {rec.index} (value {rec.value})"
                      for rec in self.inflight if cb and cb in rec.cbs), "")
        return f": kernel {function!r} is still running ({dispatch}){where}"

    # ---- data and teardown

    def read(self, name: str, offset: int = 0, nbytes: int | None = None) -> bytes:
        """Bytes of buffer ``name`` (``Linked.read_buffer``); call after ``wait``: reading while a submit is in
        flight races with the GPU. ``StateError`` on a closed Session (its buffers are released),
        ``DeviceClosedError`` on a closed device."""
        self._check_open("read")
        return self.linked.read_buffer(name, offset, nbytes)

    def write(self, name: str, data: bytes, offset: int = 0) -> None:
        """Write into buffer ``name`` (``Linked.write_buffer``); call with nothing in flight. Errors as ``read``."""
        self._check_open("write")
        self.linked.write_buffer(name, data, offset)

    @property
    def host_s_per_submit(self) -> float:
        """Mean host seconds per submit so far (0.0 before the first)."""
        return self.host_s_total / self.submits if self.submits else 0.0

    def close(self, timeout_s: float | None = None) -> None:
        """Wait up to ``timeout_s`` seconds (default: the session's) for what is in flight, then release every
        command buffer still held and everything link made.

        A submit nobody waited for that fails (status Error) or is still running at the timeout is not an error
        of ``close``: it raises nothing for it (``wait`` is where a submit's error is reported). Releasing a
        command buffer still in flight is fine on Metal (its queue keeps it until it completes), and so is
        releasing what it encoded directly (it retains that); a buffer or pipeline only its ICB commands reach
        is not retained (METAL.md §3 rule 14), so one the device refuses to release stays alive: it is kept,
        named in a ``ResourceWarning``, and released by a later ``close()`` once the work has ended. A Bridge that
        says it is closed (``closed``: ``SimDevice.close()`` was called) took its objects with it: nothing is sent
        to it. Raises ``LinkError`` only for a release that failed for another reason than work in flight."""
        closed_bridge = bool(getattr(self.bridge, "closed", False))
        if self.closed:
            if self.linked.cleanup and not closed_bridge:
                self._release_linked()  # what the first close had to keep alive
            return
        self.closed = True
        if closed_bridge:
            self.inflight.clear()
            self.linked.cleanup.clear()
            return
        timeout = self.timeout_s if timeout_s is None else _seconds(timeout_s, "close(timeout_s=...)")
        deadline = time.monotonic() + timeout
        try:
            while self.inflight:
                try:
                    self._wait(None, max(deadline - time.monotonic(), 0.0))
                except GPUExecutionError:  # that submit ended (released by ``_fail``): wait for the others
                    continue
                except WaitTimeoutError:
                    break
                except MtlirError as e:
                    if getattr(e, "deferred", False):  # its submit is released (``_deferred_fault``)
                        continue
                    raise
        finally:
            while self.inflight:
                rec = self.inflight.popleft()
                try:
                    self._release(rec)
                except Exception:  # keep releasing: the rest must not leak for one refusal
                    pass
            self._release_linked()

    def _release_linked(self) -> None:
        """``Linked.release``; what the device refused because work in flight still reaches it is kept alive
        (``Linked.cleanup``) and named in a ``ResourceWarning`` instead of raised."""
        try:
            self.linked.release()
        except LinkError as e:
            if not self.linked.cleanup:  # nothing was refused: a real failure
                raise
            warnings.warn(f"Session.close: kept alive, a command buffer still in flight reaches them: {e}",
                          ResourceWarning, stacklevel=3)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            # After an error, wait a little for what is in flight so it can be released cleanly; not at all after a
            # wait that timed out: the GPU is stuck, waiting again would only delay the error.
            stuck = isinstance(exc[1], TimeoutError)
            try:
                self.close(timeout_s=0.0 if stuck else min(self.timeout_s, 5.0))
            except Exception:  # do not hide the original error
                pass


def device_closed(bridge: Bridge, what: str) -> DeviceClosedError | None:
    """The error of ``what`` (``"submit on a Session"``) on ``bridge`` when it says it is closed (``closed``:
    ``SimDevice.close()`` was called), naming the device; None while it is open."""
    if not getattr(bridge, "closed", False):
        return None
    number = getattr(bridge, "number", None)
    device = type(bridge).__name__ + (f" #{number}" if number is not None else "")
    return DeviceClosedError(f"{what}: the device, {device}, is closed (its close() was called: what was committed "
                             "and had not run never runs, and the device answers no more calls): make a new device")


def _ran(status: str) -> str:
    """What a command buffer's final status says of its work: ran, failed, or still in flight."""
    if status == "Completed":
        return "ran"
    if status.startswith("Error"):
        return "failed"
    return "still in flight at the timeout"


def _seconds(value: Any, what: str, *, zero: bool = True) -> float:
    """``value`` as seconds: a finite real number, >= 0 (> 0 unless ``zero``). ``TypeError`` for anything else
    than a number (a str, a bool), ``ValueError`` for a negative, zero (when not allowed), infinite or NaN one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what}: seconds are a number, got {type(value).__name__} {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        need = ">= 0" if zero else "> 0"
        raise ArgumentError(f"{what}: {value!r} seconds: a finite number {need} is needed (nothing waits forever)")
    return seconds

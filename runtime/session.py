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
import struct
import time
import warnings
from collections.abc import Mapping
from typing import Any

from mtlir.metal import MTL
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.bridge.recording import Message, RecordingBridge
from mtlir.errors import ArgumentError, GPUExecutionError, LinkError, MtlirError, WaitTimeoutError
from mtlir.runtime.executors.executor import Executor, bind_variables
from mtlir.runtime.link.link import link
from mtlir.runtime.link.linked import Linked
from mtlir.runtime.executors.replay import make_executor
from mtlir.runtime.submission import Submission, TimelineValues
from mtlir.runtime.waits import SessionWaits, device_closed, seconds_arg

__all__ = ["Session", "DEFAULT_TIMELINE_VAR"]

DEFAULT_TIMELINE_VAR = "timeline"


class Session(SessionWaits):
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
        self.timeout_s = seconds_arg(timeout_s, "Session(timeout_s=...)", zero=False)
        self.serialize = serialize
        self.timeline_var = timeline_var if timeline_var in program.variables else None
        self.linked: Linked = link(program, bridge, initial=initial, max_command_buffers=max_command_buffers,
                                   shared=shared)
        self.executor_kind = executor
        self.executor: Executor = make_executor(executor, program, bridge, self.linked.registers)
        self.messenger = self.linked.messenger  # the bookkeeping messages (pool, status, release, errors)
        # the messages a wait sends for every command buffer, resolved once (``Messenger.getter``)
        m = self.messenger
        self._status, self._release_cb = m.getter("status"), m.getter("release")
        self._gpu_start, self._gpu_end = m.getter("GPUStartTime"), m.getter("GPUEndTime")
        # the Program's timeline is the event its timeline read reads (chosen by passes/timeline.py: the default
        # queue's, else the first queue's own in the SINK's order, never a shared event); a Program without a read
        # (built by hand, or naming an event not linked here): "event", else the first "event:<q>" of a queue
        # placeholder "queue:<q>" (register order)
        events = self.linked.of_kind("event")
        read = program.timeline_read
        chosen = next((o.name for o in read.objects.values() if o.kind == "event"), None) if read else None
        timeline = (chosen if chosen in events else "event" if "event" in events
                    else next((e for e in events if f"queue:{e.partition(':')[2]}" in self.linked.handles), None))
        self.event: int | None = self.linked.handles[timeline] if timeline is not None else None
        self.timeline_reader = "none" if self.event is None else "message"
        self._read_timeline: Executor | None = None
        if self.event is not None and program.timeline_read is not None:
            self._read_timeline = self._timeline_program(program.timeline_read, executor)
        slots = self.linked.of_kind("cbslots")
        if len(slots) > 1:
            raise ValueError(f"a Program with {len(slots)} cbslots tables: one is supported")
        self._slots = None
        self._slot_view: memoryview | None = None  # the table's bytes, where the bridge lends a view of them
        self.stamps: tuple[Any, ...] = ()
        if slots:
            payload = self.linked.objects[slots[0]].payload
            self._slots = (self.linked.handles[slots[0]], int(payload[0]))
            self._slot_zeros = bytes(8 * self._slots[1])
            self._slot_struct = struct.Struct(f"<{self._slots[1]}Q")
            self.stamps = tuple(payload[1]) if len(payload) > 1 else ()
            host_view = getattr(bridge, "host_view", None)  # a SimDevice: no look-up per read and write
            if host_view is not None:
                self._slot_view = host_view(*self._slots[:1], 8 * self._slots[1])
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
        timeout = self.timeout_s if timeout_s is None else seconds_arg(timeout_s, "wait_event(timeout_s=...)")
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
        return self._submit(values)

    def _submit(self, values: dict[str, Any]) -> Submission:
        """``submit`` with its variables as a dict it may change (the timeline value goes into it): a
        ``SessionRing`` passes its own, with no second copy."""
        self._check_open("submit")
        tv = self.timeline_var
        if tv is not None and tv not in values:
            values[tv] = self.timeline_values.value + 1
        if self.serialize and self.inflight:
            bind_variables(self.program, values)  # this submit's own bad value first, not behind the wait
            self._wait(None, self.timeout_s)
        value = int(values[tv]) if tv is not None else None
        t0 = time.perf_counter()
        view = self._slot_view  # (a view only where there is a cbslots table)
        if view is not None:
            view[:] = self._slot_zeros
        elif self._slots is not None:
            self.bridge.write(self._slots[0], self._slot_zeros)
        try:
            pool = self.messenger.push()
        except BaseException as e:  # nothing of this submit ran: an error the device deferred, a closed device
            self._deferred_fault(e, time.monotonic() + self.timeout_s)
            raise
        try:
            self.executor.run(**values)
            cbs = self._slot_struct.unpack(view) if view is not None else self._read_slots()
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
        view = self._slot_view
        if view is not None:
            return self._slot_struct.unpack(view)
        return self._slot_struct.unpack(self.bridge.read(slots[0], 8 * slots[1]))

    def _record(self, value: int | None, cbs: tuple[int, ...], t0: float) -> Submission:
        dt = time.perf_counter() - t0
        rec = Submission(self.submits, value, cbs, dt)
        self.inflight.append(rec)
        self.submits += 1
        self.host_s_total += dt
        if value is not None:
            self.last_value = value
            if value > self.highest_value:  # (max() parses keywords: a few hundred instructions per submit)
                self.highest_value = value
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
        self._slot_view = None  # the table is freed with the link below
        if closed_bridge:
            self.inflight.clear()
            self.linked.cleanup.clear()
            return
        timeout = self.timeout_s if timeout_s is None else seconds_arg(timeout_s, "close(timeout_s=...)")
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

"""How a ``Session`` waits for its submits (``SessionWaits``, a base class of ``Session``): the timeline read,
the command buffers' status, a GPU error turned into ``GPUExecutionError`` with Metal's code (a failed command
buffer skips its signals, METAL.md §3 rule 6, so a wait for the value alone would hang), a fault the device
deferred accounted for once, a completed submit's GPU times read and its command buffers released, and the texts
of a wait that times out or cannot be met (docs/runtime.md)."""
from __future__ import annotations

import collections
import itertools
import math
import operator
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mtlir.errors import (ArgumentError, DeviceClosedError, GPUExecutionError, MtlirError, StateError,
                          WaitTimeoutError)
from mtlir.metal import MTL
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.bridge.messenger import Messenger
from mtlir.runtime.executors.executor import Executor
from mtlir.runtime.link.linked import Linked
from mtlir.runtime.submission import GpuSpan, Submission, TimelineValues, gpu_seconds, seconds_to_ns

if TYPE_CHECKING:
    from mtlir.runtime.session import Session

__all__ = ["SessionWaits", "device_closed", "seconds_arg"]


class SessionWaits:
    """``wait`` and what it needs, for ``Session`` (whose attributes these are)."""

    bridge: Bridge
    linked: Linked
    messenger: Messenger
    executor: Executor
    event: int | None
    timeline_var: str | None
    timeout_s: float
    inflight: collections.deque[Submission]
    completed: collections.deque[Submission]
    last_value: int
    highest_value: int
    timeline_values: TimelineValues
    peers: list[Session]
    submits_completed: int
    stamps: tuple[Any, ...]
    closed: bool
    _read_timeline: Executor | None
    _status: Callable[[int], Any]
    _release_cb: Callable[[int], Any]
    _gpu_start: Callable[[int], Any]
    _gpu_end: Callable[[int], Any]

    def _read_value(self) -> int:
        """The timeline's value now: the Program's own read of it, or a ``signaledValue`` message."""
        if self._read_timeline is not None:
            return int(self._read_timeline.run()[0])
        return int(self.messenger.send(self.event, "signaledValue")) if self.event else 0

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
        if timeout_s is None:
            timeout = self.timeout_s
        elif type(timeout_s) is float and 0.0 <= timeout_s < math.inf:  # the usual: seconds_arg's answer at once
            timeout = timeout_s
        else:
            timeout = seconds_arg(timeout_s, "wait(timeout_s=...)")
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
            cbs = pending[0].cbs  # the usual one command buffer: the tuple itself
            block(cbs if len(cbs) == 1 and cbs[0] else [cb for cb in cbs if cb], timeout)
        status = self._status
        while True:
            current = self._timeline_now()
            running: list[int] = []  # the head submit's command buffers that have not ended
            while pending:
                rec = pending[0]
                cbs = rec.cbs
                live = cbs if len(cbs) == 1 and cbs[0] else [cb for cb in cbs if cb]
                statuses = [int(status(cb)) for cb in live]
                if MTL.StatusError in statuses:
                    self._fail(rec, deadline)
                reached = rec.value is None or current is None or current >= rec.value
                if not reached or statuses.count(MTL.StatusCompleted) != len(statuses):  # one not completed
                    running = [cb for cb, st in zip(live, statuses) if st < MTL.StatusCompleted]
                    if (not running and not reached and (value is None or current is None or current < value)
                            and self._hopeless(rec, pending)):  # (a value the timeline reached ends the wait below)
                        self._unsignaled(rec, current)
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

    def _hopeless(self, rec: Submission, pending: list[Submission]) -> bool:
        """Whether ``rec``'s timeline value can no longer be reached by what is in flight: its command buffers all
        completed (a completed command buffer has run its signals) and every later submit awaited has ended too
        (their command buffers no longer Committed or Scheduled), the timeline still below ``rec.value``."""
        m = self.messenger
        return all(int(m.send(cb, "status")) >= MTL.StatusCompleted for later in pending[1:] for cb in later.cbs if cb)

    def _unsignaled(self, rec: Submission, current: int | None) -> None:
        """``rec`` completed without its timeline value: release it (a wait or a submit after this one would
        otherwise sit out its whole timeout for it) and raise ``ArgumentError`` (a ``ValueError``) saying so."""
        self._finish(rec)
        raise ArgumentError(f"submit {rec.index} (timeline value {rec.value}) completed, but the timeline is at "
                            f"{current}: the Program's command buffers ran without signaling its value (a signal "
                            f"of the timeline event with another value, e.g. `timeline - 1`, or none at all), so no "
                            f"wait for {rec.value} can end; the submit is released")

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
        if getattr(self.bridge, "closed", False):  # the error's text is made only then (every submit passes here)
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

    def _account(self, rec: Submission, error: BaseException, cb: int, reporter: SessionWaits) -> None:
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
        start, end = self._gpu_start, self._gpu_end
        times: list[tuple[float | None, float | None]] = []
        spans: list[GpuSpan] = []
        for slot, cb in enumerate(rec.cbs):  # one pass: the usual submit has one command buffer
            if cb:
                t0, t1 = gpu_seconds(start(cb)), gpu_seconds(end(cb))
                times.append((t0, t1))
                spans.append(GpuSpan(slot, seconds_to_ns(t0), seconds_to_ns(t1)))
            else:
                times.append((None, None))
        rec.gpu_times, rec.spans = times, spans
        for st in self.stamps:  # Stamp(slot, cb, which): slot <- GPUStartTime/GPUEndTime of cbslots[cb]
            if st.cb < len(rec.cbs) and rec.cbs[st.cb]:
                rec.timestamps[st.slot] = rec.gpu_times[st.cb][0 if st.which == "GPUStartTime" else 1]
        self._release(rec)
        self._drop(rec)
        self.completed.append(rec)
        self.submits_completed += 1

    def _release(self, rec: Submission) -> None:
        """Release the command buffers the Program retained when it stored them into cbslots."""
        release = self._release_cb
        for cb in rec.cbs:
            if cb:
                release(cb)

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
        queues = {slot: self._queue_text(cb) for slot, cb in live}  # before the release: " (queue 'copy')"
        errors = {slot: self._error_of(cb) for slot, cb in live if statuses[slot] == MTL.StatusError}
        which = min(errors)
        code, name, desc = errors[which]
        final = {slot: (f"Error ({errors[slot][1]})" if slot in errors else
                        MTL.STATUS_NAMES[st] if 0 <= st < len(MTL.STATUS_NAMES) else str(st))
                 for slot, st in statuses.items()}
        self._release(rec)
        self._drop(rec)
        val = f" (timeline value {rec.value})" if rec.value is not None else ""
        after = [f"command buffer {slot}{queues[slot]} {text} ({_ran(text)})" for slot, text in final.items()
                 if slot > which]
        after_text = f"after it: {', '.join(after)}" if after else "no command buffer of the submit comes after it"
        raise GPUExecutionError(f"submit {rec.index}{val}: command buffer {which}{queues[which]} failed with status "
                                f"Error, MTLCommandBufferError {code} ({name}); {after_text}: {desc}", code, name,
                                submit=rec.index, command_buffer=which, command_buffers=final)

    def _queue_text(self, cb: int) -> str:
        """`` (queue 'copy')``: the queue of a Program with several queues that made command buffer ``cb``, when
        the bridge can tell (``SimDevice.queue_of``; real Metal's command buffers are not asked); "" otherwise."""
        queue_of = getattr(self.bridge, "queue_of", None)
        queues = [name for name in self.linked.handles if name == "queue" or name.startswith("queue:")]
        if queue_of is None or len(queues) < 2:
            return ""
        handle = queue_of(cb)
        name = next((n for n in queues if self.linked.handles[n] == handle), None)
        if name is None:
            return ""
        return " (the default queue)" if name == "queue" else f" (queue {name.partition(':')[2]!r})"

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
        blocked_on = getattr(self.bridge, "blocked_on", None)  # a SimDevice can tell what a command buffer waits for
        for rec in pending[:4]:
            sts = []
            for slot, cb in enumerate(rec.cbs):
                st = int(self.messenger.send(cb, "status"))
                text = MTL.STATUS_NAMES[st] if 0 <= st < 6 else str(st)
                what = blocked_on(cb) if blocked_on is not None and cb and st < MTL.StatusCompleted else None
                sts.append(f"{text} (command buffer {slot}{self._queue_text(cb)} waits for {what})" if what else text)
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


def _ran(status: str) -> str:
    """What a command buffer's final status says of its work: ran, failed, or still in flight."""
    if status == "Completed":
        return "ran"
    if status.startswith("Error"):
        return "failed"
    return "still in flight at the timeout"


def seconds_arg(value: Any, what: str, *, zero: bool = True) -> float:
    """``value`` as seconds: a finite real number, >= 0 (> 0 unless ``zero``). ``TypeError`` for anything else
    than a number (a str, a bool), ``ValueError`` for a negative, zero (when not allowed), infinite or NaN one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what}: seconds are a number, got {type(value).__name__} {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        need = ">= 0" if zero else "> 0"
        raise ArgumentError(f"{what}: {value!r} seconds: a finite number {need} is needed (nothing waits forever)")
    return seconds


def device_closed(bridge: Bridge, what: str) -> DeviceClosedError | None:
    """The error of ``what`` (``"submit on a Session"``) on ``bridge`` when it says it is closed (``closed``:
    ``SimDevice.close()`` was called), naming the device; None while it is open."""
    if not getattr(bridge, "closed", False):
        return None
    number = getattr(bridge, "number", None)
    device = type(bridge).__name__ + (f" #{number}" if number is not None else "")
    return DeviceClosedError(f"{what}: the device, {device}, is closed (its close() was called: what was committed "
                             "and had not run never runs, and the device answers no more calls): make a new device")

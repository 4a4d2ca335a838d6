"""DeviceContext: what a runtime client (a framework's device, e.g. ``mtlir.tinygrad``) needs from mtlir: one Metal
device whose command queue, timeline (MTLSharedEvent), fence, residency set and compiled pipelines are shared by
many Programs, and device-level buffers every one of those Programs can bind.

```
ctx = DeviceContext(SimDevice("x86_64", family="Apple7"), name="METAL")
buf = ctx.alloc(4096)                    # a DeviceBuffer: resident for every Program of the context
ctx.write(buf, data); ctx.read(buf, 0, 64); ctx.free(buf)
s = ctx.session(lowered.program)         # linked with the shared queue, event, fence, pipelines, residency set
ctx.submit(s, x=buf.handle)              # the context hands out the timeline values: one timeline for all
ctx.synchronize()                        # waits for every Program's submits
```

Why (issue 11): a Session links its own queue, event and fence, so each Program of a client cost a link of
everything (the pipeline's compile: tens of ms) and ordering between Programs needed a wait after every submit;
a buffer made outside a link was in no residency set (METAL.md §3 rule 10: the first dispatch faults); two devices
handed out the same handle numbers, so a handle of one used on the other named no device. Here:

- the Programs of one context share the queue (command buffers run in commit order, METAL.md §1), the fence (each
  Program's encoder waits for the previous one's update, so a kernel sees what the kernel before it wrote, with no
  host wait in between) and the timeline event (``timeline``: one increasing value per submit of any of them,
  rule 12, whether it goes through ``submit`` or the Session's own ``submit``);
- a pipeline is compiled once per kernel key (``pipeline``) and adopted by every Program that names it
  (``link``'s ``shared``);
- ``alloc`` adds each buffer to the context's residency set (``addAllocation:`` + ``commit``; the set is on the
  queue), so every Program reaches it; ``free`` removes it first. A device without residency sets
  (``DeviceSpec.residency_set`` False) lowers Programs that list their buffer variables in
  ``useResources:count:usage:`` instead (passes/encode);
- a ``DeviceBuffer`` carries its context's name: using it on another context is a ``ContextError`` naming both.
"""
from __future__ import annotations

import itertools
import operator
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtlir.errors import LinkError, MetalValidationError, StateError
from mtlir.metal import MTL, DeviceSpec, Kernel, Obj
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.link.link import collect_objects
from mtlir.runtime.link.linked import above_max_buffer_length
from mtlir.runtime.link.kinds import make_pipeline
from mtlir.runtime.link.state import LinkState
from mtlir.runtime.session import Session
from mtlir.runtime.waits import device_closed
from mtlir.runtime.submission import Submission, TimelineValues

__all__ = ["DeviceContext", "DeviceBuffer", "ContextError", "SessionRing"]

_IDS = itertools.count(1)


class ContextError(StateError):
    """A handle used on a context that did not make it, or after it was freed; a context used after ``close``."""


@dataclass(frozen=True)
class DeviceBuffer:
    """A buffer of a ``DeviceContext``: the MTLBuffer ``handle``, its ``contents`` host address, its size in bytes
    (``nbytes``) and the ``device`` name of the context that made it (for errors)."""

    handle: int
    contents: int
    nbytes: int
    device: str

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.device}, {self.nbytes} bytes, handle {self.handle:#x})"


class DeviceContext:
    """One Metal device (a ``Bridge``: ``SimDevice`` or the real Metal bridge) shared by many Programs.

    ``name``: the device's name in errors (``"METAL"``; a number is added when two contexts share a name);
    ``spec``: the ``DeviceSpec`` the Programs are lowered for (default: the bridge's ``spec`` when it has one, else
    ``DeviceSpec()``); ``timeout_s``: the default wait in seconds; ``max_command_buffers``: the queue's
    maxCommandBufferCount. Makes the device (``MTLCreateSystemDefaultDevice``), the queue, the shared event, the
    fence and, with residency sets, the residency set (added to the queue) at once. Raises ``LinkError`` when Metal
    returns nil for one of them, ``DeviceClosedError`` on a closed device. Use as a context manager or call ``close()``."""

    def __init__(self, bridge: Bridge, *, name: str = "device", spec: DeviceSpec | None = None,
                 timeout_s: float = 30.0, max_command_buffers: int = 1024) -> None:
        closed = device_closed(bridge, "DeviceContext(...)")
        if closed is not None:
            raise closed
        self.bridge = bridge
        self.name = f"{name}#{next(_IDS)}" if name in _NAMES else name
        _NAMES.add(self.name)
        self.spec = spec if spec is not None else getattr(bridge, "spec", None) or DeviceSpec()
        self.timeout_s = timeout_s
        self._ls = LinkState(Program([], 0, target=bridge.target, device=self.spec), bridge, {},
                             max_command_buffers, MTL.ResourceStorageModeShared)
        ls, m = self._ls, self._ls.messenger
        self.closed = False
        self.buffers: dict[int, DeviceBuffer] = {}
        self.sessions: list[Session] = []
        self.pipelines: dict[str, int] = {}
        self._kernels: dict[str, Kernel] = {}  # what each pipeline was compiled from
        self.timeline = TimelineValues()  # the values of the shared event, handed out to every Session's submits
        pool = m.push()  # what Metal hands back autoreleased (a refused residency set's NSError) goes with it
        try:
            self.device = ls.keep("device", ls.checked(m.device(), "MTLCreateSystemDefaultDevice (no Metal device)"))
            self.queue = ls.keep("queue", ls.checked(
                m.send(self.device, "newCommandQueueWithMaxCommandBufferCount:", max_command_buffers), "command queue"))
            self.event = ls.keep("event", ls.checked(m.send(self.device, "newSharedEvent"), "shared event"))
            self.fence = ls.keep("fence", ls.checked(m.send(self.device, "newFence"), "fence"))
            self.residency_set = 0
            if self.spec.residency_set:
                desc = ls.checked(m.send(m.cls("MTLResidencySetDescriptor"), "new"), "MTLResidencySetDescriptor")
                try:
                    self.residency_set = ls.keep("residency_set", ls.with_error(
                        "residency set (macOS 15 or later)", self.device, "newResidencySetWithDescriptor:error:", desc))
                finally:
                    m.send(desc, "release")
                m.send(self.residency_set, "commit")
                m.send(self.queue, "addResidencySet:", self.residency_set)
        except BaseException:
            m.pop(pool)
            ls.out.release()
            raise
        m.pop(pool)

    # ---- buffers

    def alloc(self, nbytes: int) -> DeviceBuffer:
        """A new shared-storage MTLBuffer of ``nbytes`` bytes (``newBufferWithLength:options:``), resident for every
        Program of the context. Raises ``ValueError`` for a size below 1, ``LinkError`` when Metal returns nil (the
        message says when the size is above the device's maxBufferLength)."""
        self._open("alloc")
        if type(nbytes) is not int or nbytes < 1:
            raise ValueError(f"{self.name}: alloc of {nbytes!r} bytes: the size is an int >= 1")
        m = self._ls.messenger
        made = int(m.send(self.device, "newBufferWithLength:options:", nbytes, MTL.ResourceStorageModeShared) or 0)
        if not made:
            above_max_buffer_length(m, self.device, f"{self.name}: alloc", nbytes)
            raise LinkError(f"{self.name}: alloc of {nbytes} bytes: Metal returned nil")
        buf = DeviceBuffer(made, int(m.send(made, "contents")), nbytes, self.name)
        if self.residency_set:
            m.send(self.residency_set, "addAllocation:", made)
            m.send(self.residency_set, "commit")
        self.buffers[made] = buf
        return buf

    def _mine(self, buf: DeviceBuffer, what: str) -> DeviceBuffer:
        self._open(what)
        if not isinstance(buf, DeviceBuffer):
            raise TypeError(f"{self.name}: {what} takes a DeviceBuffer, got {type(buf).__name__}")
        if buf.device != self.name:
            raise ContextError(f"{what}: {buf!r} belongs to device {buf.device}, not to {self.name}")
        if self.buffers.get(buf.handle) is not buf:
            raise ContextError(f"{what}: {buf!r} of {self.name} was freed")
        return buf

    @staticmethod
    def _int(value: Any, arg: str, what: str) -> int:
        """``value`` as an int: ``TypeError`` naming the argument for a non-integer (a float, a bool, a str)."""
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{what}: {arg} (bytes) must be an int, got {type(value).__name__} {value!r}")
        return operator.index(value)

    def _range(self, buf: DeviceBuffer, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > buf.nbytes:
            raise ValueError(f"{what}: bytes [{offset}, {offset + nbytes}) are outside the {buf.nbytes} bytes of "
                             f"{buf!r}")

    def write(self, buf: DeviceBuffer, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
        """Copy ``data`` into ``buf`` at byte ``offset`` through ``contents`` (the host writes shared storage
        directly: call ``synchronize`` first when a submit in flight reads it). ``data``: any object with the
        buffer protocol (bytes, bytearray, memoryview, a numpy array); its size is counted in bytes
        (``memoryview(data).nbytes``: a memoryview of float32 is 4 bytes an element), a non-contiguous one is
        copied in C order. Raises ``ContextError`` for a buffer of another context or a freed one, or on a closed
        context; ``DeviceClosedError`` on a closed device; ``TypeError`` for data without the buffer protocol (a
        str: encode it first) or a non-integer offset; ``ValueError`` for a byte range outside the buffer."""
        self._mine(buf, "write")
        if type(data) is bytes:
            raw = data
        else:
            try:
                view = memoryview(data)  # anything with the buffer protocol (a numpy array too)
            except TypeError:
                raise TypeError(f"write: data is bytes, bytearray, memoryview or another object with the buffer "
                                f"protocol (a numpy array), got {type(data).__name__}") from None
            raw = view.tobytes()  # its bytes in C order: len(raw) is the size in bytes, whatever the item size
        offset = self._int(offset, "offset", "write")
        self._range(buf, offset, len(raw), "write")
        if raw:
            self.bridge.write(buf.contents + offset, raw)

    def read(self, buf: DeviceBuffer, offset: int = 0, nbytes: int | None = None) -> bytes:
        """``nbytes`` bytes of ``buf`` from byte ``offset`` (default: to its end; ``b""`` for 0 bytes, also at
        the end). Errors as ``write``: ``TypeError`` for a non-integer offset or size."""
        self._mine(buf, "read")
        offset = self._int(offset, "offset", "read")
        n = buf.nbytes - offset if nbytes is None else self._int(nbytes, "nbytes", "read")
        self._range(buf, offset, n, "read")
        return self.bridge.read(buf.contents + offset, n) if n else b""

    def free(self, buf: DeviceBuffer) -> None:
        """Take ``buf`` out of the residency set and release it. The caller makes sure no submit in flight uses it
        (``synchronize``; rule 14). Errors as ``write``, and ``MetalValidationError`` when the device refuses the
        release (the simulated device in strict mode: a command buffer in flight reaches the buffer through ICB
        commands). Then nothing has changed: the buffer is back in the residency set (committed) and still the
        context's, so a submit may bind it and ``free`` after ``synchronize`` releases it.

        The order is Metal's: a residency set does not retain its allocations (docs/simulator.md, object
        lifetimes), so the buffer leaves the set (``removeAllocation:`` + ``commit``) while it is alive; after the
        release it is a deallocated object no message may name."""
        self._mine(buf, "free")
        m, rset = self._ls.messenger, self.residency_set
        if rset:
            m.send(rset, "removeAllocation:", buf.handle)
            m.send(rset, "commit")
        try:
            m.send(buf.handle, "release")
        except MetalValidationError:  # refused: the buffer is alive, so it goes back where it was
            if rset:
                m.send(rset, "addAllocation:", buf.handle)
                m.send(rset, "commit")
            raise
        del self.buffers[buf.handle]

    # ---- Programs

    def pipeline(self, kernel: Kernel) -> int:
        """The compute pipeline state of ``kernel``, compiled at the first call for its key and kept (link's
        messages for a pipeline: docs/runtime.md). Raises what the compile raises (``LinkError`` with the MSL
        error, ``UnsupportedKernelError``), and ``LinkError`` for a kernel whose key names a pipeline compiled
        from another function or MSL (a Program would silently run the other kernel)."""
        name = f"pipeline:{kernel.key}"
        if name not in self.pipelines:
            self._open("pipeline")
            m = self._ls.messenger
            pool = m.push()  # as link's: the +0 NSStrings of the MSL and the function name (and a compile error's
            try:             # NSError) are autoreleased; without a pool of its own they outlive the context
                make_pipeline(self._ls, self.device, Obj("pipeline", name, (kernel,)))
            finally:
                m.pop(pool)
            self.pipelines[name] = self._ls.out.handles[name]
            self._kernels[name] = kernel
        else:
            first = self._kernels[name]
            if (first.function, first.msl) != (kernel.function, kernel.msl):
                what = "function" if first.function != kernel.function else "MSL"
                raise LinkError(f"{self.name}: kernel key {kernel.key!r} names a pipeline compiled from another "
                                f"{what} ({first.function!r} before, {kernel.function!r} now): the Programs of a "
                                "context share pipelines by key, so kernels of different source need different keys")
        return self.pipelines[name]

    def shared(self, program: Program) -> dict[str, int]:
        """The objects of this context that ``program`` adopts (``link``'s ``shared``): the device, queue, event,
        fence, residency set and the pipeline of each kernel it names (compiled here when new)."""
        out = {"device": self.device, "queue": self.queue, "event": self.event, "fence": self.fence}
        if self.residency_set:
            out["residency_set"] = self.residency_set
        for obj in collect_objects(program).values():
            if obj.kind == "pipeline" and obj.payload and isinstance(obj.payload[0], Kernel):
                out[obj.name] = self.pipeline(obj.payload[0])
        return out

    def session(self, program: Program, *, shared_extra: Mapping[str, int] | None = None, **kwargs: Any) -> Session:
        """A ``Session`` of ``program`` on the shared objects (``serialize=False``: the shared fence orders the
        Programs' encoders and a Program that patches its own ICB or variables waits for its previous submit
        itself, ``submit``). ``shared_extra``: more placeholders to adopt, e.g. ``{"buffer:w": buf.handle}`` for a
        BUFFER of the Program that is a buffer of this context (bound once, at link). ``kwargs`` go to ``Session``. Raises ``LinkError`` as ``link`` does, and for a
        Program lowered for another device spec."""
        self._open("session")
        if program.device != self.spec:
            raise LinkError(f"{self.name}: the Program was lowered for {program.device}, the context is {self.spec}")
        kwargs.setdefault("timeout_s", self.timeout_s)
        kwargs.setdefault("serialize", False)
        shared = self.shared(program)
        for name, handle in (shared_extra or {}).items():
            if name.startswith("buffer:") and handle not in self.buffers:
                raise ContextError(f"{self.name}: {name} is handle {handle:#x}, which is no live buffer of this device")
            shared[name] = handle
        kwargs.setdefault("timeline_values", self.timeline)
        s = Session(program, self.bridge, shared=shared, **kwargs)
        self.sessions.append(s)
        s.peers = self.sessions  # a fault the device reports late may be another Session's (``_deferred_fault``)
        return s

    def ring(self, program: Program, size: int = 2, *, shared_extra: Mapping[str, int] | None = None) -> SessionRing:
        """A ``SessionRing`` of up to ``size`` Sessions of ``program`` on this context (the first linked now, each
        other one at its first use, ``session``). Raises ``ValueError`` for a size below 1, ``LinkError`` as
        ``session`` does."""
        return SessionRing(self, program, size, shared_extra)

    @property
    def value(self) -> int:
        """The highest value of the shared timeline handed out so far (``timeline.value``)."""
        return self.timeline.value

    def next_value(self) -> int:
        """The next value of the shared timeline, marked used (rule 12 wants the values increasing). A Session of
        the context takes its values from the same ``timeline`` (``Session.timeline_values``)."""
        return self.timeline.take()

    def submit(self, session: Session, **values: Any) -> Submission:
        """``session.submit`` (its default timeline value is the context's next: ``timeline``); first waits for
        that session's previous submit when it is still in flight (its Program patches its variables and ICB from
        the CPU: rule 15). Raises ``ContextError`` on a closed context, ``DeviceClosedError`` on a closed device,
        and what ``Session.submit`` raises."""
        self._open("submit")
        if session.inflight:
            session.wait(timeout_s=self.timeout_s)
        return session.submit(**values)

    def synchronize(self, timeout_s: float | None = None) -> None:
        """Wait until every submit of every Program of the context has completed. Raises ``WaitTimeoutError`` /
        ``GPUExecutionError`` as ``Session.wait`` does, ``ContextError``/``DeviceClosedError`` at once on a closed
        context or device."""
        self._open("synchronize")
        for s in self.sessions:
            if s.inflight:
                s.wait(timeout_s=self.timeout_s if timeout_s is None else timeout_s)

    def _open(self, what: str) -> None:
        if self.closed:
            raise ContextError(f"{what} on device {self.name}, which is closed")
        if getattr(self.bridge, "closed", False):  # the error's text is made only then (every submit passes here)
            closed = device_closed(self.bridge, f"{what} on DeviceContext {self.name}")
            if closed is not None:
                raise closed

    def close(self, timeout_s: float | None = None) -> None:
        """Wait at most ``timeout_s`` seconds (default: the context's) for the work in flight, close every Session
        (``Session.close``), release the buffers, pipelines, residency set, fence, event and queue.

        As ``Session.close``: an error of a submit nobody waited for (status Error) is not ``close``'s, and work
        still running at the timeout is not waited for: what the device refuses to release because a command buffer
        in flight still reaches it (METAL.md §3 rule 14: a buffer or pipeline only ICB commands use) stays alive,
        is named in a ``ResourceWarning`` and is released by a later ``close()`` once the work has ended (until
        then ``closed`` is True and the context refuses every other call). After the bridge's own close
        (``SimDevice.close()``) nothing is sent: the device took its objects with it. Raises ``LinkError`` only
        for a release that failed for another reason than work in flight."""
        bridge_closed = bool(getattr(self.bridge, "closed", False))
        if self.closed:
            if not bridge_closed and self._kept():
                self._release_all(0.0)  # what the first close had to keep alive
            return
        self.closed = True
        _NAMES.discard(self.name)
        if bridge_closed:
            for s in self.sessions:
                s.close()  # sends nothing
            self.sessions.clear()
            self.buffers.clear()
            self._ls.out.cleanup.clear()
            return
        self._release_all(self.timeout_s if timeout_s is None else timeout_s)

    def _kept(self) -> bool:
        """Something a close had to keep alive (work in flight reached it) is still held."""
        return bool(self.sessions or self.buffers or self._ls.out.cleanup)

    def _release_all(self, timeout_s: float) -> None:
        """Close the Sessions within ``timeout_s`` seconds in all, release the buffers and the context's own
        objects; keep what the device refuses (rule 14) and name it in one ``ResourceWarning``."""
        deadline = time.monotonic() + timeout_s
        for s in self.sessions:
            s.close(timeout_s=max(0.0, deadline - time.monotonic()))  # warns for what it keeps itself
        self.sessions[:] = [s for s in self.sessions if s.linked.cleanup]
        refused: list[str] = []
        failed: list[str] = []
        m = self._ls.messenger
        for buf in list(self.buffers.values()):
            try:
                m.send(buf.handle, "release")
            except MetalValidationError as e:  # still reached by work in flight: kept for a later close()
                refused.append(f"{buf!r}: {e}")
                continue
            except Exception as e:  # gone, or the bridge cannot release it: dropped, the rest still released
                failed.append(f"{buf!r}: {e}")
            self.buffers.pop(buf.handle)
        try:
            self._ls.out.release()
        except LinkError as e:
            (refused if self._ls.out.cleanup else failed).append(str(e))
        if refused:
            warnings.warn(f"DeviceContext.close: {self.name}: kept alive, a command buffer still in flight reaches "
                          f"them: {'; '.join(refused)}; close() again once the work has ended releases them",
                          ResourceWarning, stacklevel=3)
        if failed:
            raise LinkError(f"DeviceContext.close: {self.name}: release failed for {'; '.join(failed)}")

    def __enter__(self) -> DeviceContext:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:  # as Session.__exit__: wait a little for what is in flight, never hide the error
            stuck = isinstance(exc[1], TimeoutError)
            try:
                self.close(timeout_s=0.0 if stuck else min(self.timeout_s, 5.0))
            except Exception:
                pass


class SessionRing:
    """Up to ``size`` Sessions of one Program used in turn, so the CPU patches one while the GPU runs another
    (a Session's ICB and variables are patched by the CPU per submit: METAL.md §3 rule 15 makes a submit wait
    for that Session's previous one; tinygrad's later Metal graph rotates a ring of ICBs for the same reason).
    The shared fence still orders the submits in commit order, so results are as with one Session. The first
    Session is linked at once, each other one at its first use (a link of its ICB and variables buffer, a few
    ms). ``sessions``: those linked so far; ``last``: the one the last ``submit`` used."""

    def __init__(self, ctx: DeviceContext, program: Program, size: int,
                 shared_extra: Mapping[str, int] | None) -> None:
        if type(size) is not int or size < 1:
            raise ValueError(f"{ctx.name}: a ring of {size!r} Sessions: the size is an int >= 1")
        self.ctx, self.program, self.size, self.shared_extra = ctx, program, size, dict(shared_extra or {})
        self.sessions: list[Session] = [ctx.session(program, shared_extra=self.shared_extra)]
        self.last = self.sessions[0]

    def submit(self, **values: Any) -> Submission:
        """``DeviceContext.submit`` on the next Session of the ring: one that is idle when there is one (linked
        now when the ring is not full), else the one whose turn it is (the context waits for its previous
        submit, the oldest of the ring). Raises what ``DeviceContext.submit`` raises."""
        s = self.last
        if s.inflight:
            idle = [x for x in self.sessions if not x.inflight]
            if idle:
                s = idle[0]
            elif len(self.sessions) < self.size:
                s = self.ctx.session(self.program, shared_extra=self.shared_extra)
                self.sessions.append(s)
            else:  # the one after the last: its submit is the oldest
                s = self.sessions[(self.sessions.index(s) + 1) % len(self.sessions)]
        self.last = s
        ctx = self.ctx  # DeviceContext.submit, inline: one copy of the values less per submit
        ctx._open("submit")
        if s.inflight:
            s.wait(timeout_s=ctx.timeout_s)
        return s._submit(values)  # ``values`` is this call's own dict: no copy

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for every submit of the ring's Sessions (``Session.wait``)."""
        for s in self.sessions:
            if s.inflight:
                s.wait(timeout_s=self.ctx.timeout_s if timeout_s is None else timeout_s)


_NAMES: set[str] = set()

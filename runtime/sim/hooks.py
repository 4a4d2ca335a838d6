"""What a SimDevice offers beyond the Bridge (``DeviceHooks``, a base class of ``SimDevice``): stepping the GPU by
hand (``autorun=False``), running until idle, arming faults (docs/reliability.md), a pipeline's thread limit, a
buffer's bytes and the live objects by class, for tests and tools that look inside the simulated device."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from mtlir.errors import BridgeError, WaitTimeoutError
from mtlir.metal import MTL
from mtlir.runtime.sim.injection import Fault, FaultPlan
from mtlir.runtime.sim.objects import ICB, Buffer, ClassObject, Device, Pipeline, SimObject, clock

if TYPE_CHECKING:
    from mtlir.runtime.sim.gpu import GPU

__all__ = ["DeviceHooks"]


class DeviceHooks:
    """The inspection and control methods of ``SimDevice`` that are not part of the Bridge. Each takes the device
    lock itself."""

    # provided by SimDevice
    _lock: threading.Lock
    _cv: threading.Condition
    _objects: dict[int, SimObject]
    _lookup: Callable[[Any, str], SimObject]
    gpu: GPU
    autorun: bool
    timeout_s: float
    faults: FaultPlan

    def step(self) -> bool:
        """Run one GPU operation (start a command buffer, one dispatch or ICB command, a signal, a finish);
        False when nothing can run. Meant for ``autorun=False``."""
        with self._lock:
            return self.gpu.step_locked()

    def run_until_idle(self, timeout_s: float | None = None) -> None:
        """Run (or, with autorun, wait for) every committed command buffer to the end. Command buffers blocked on
        a fence or event end by the watchdog. Raises ``TimeoutError`` after ``timeout_s`` (default
        ``timeout_s`` of the device)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = clock() + limit
        with self._lock:
            self.gpu.wake()
            while self.gpu.pending():
                if clock() > deadline:
                    raise WaitTimeoutError(f"run_until_idle: command buffers still running after {limit} s")
                if self.autorun or not self.gpu.step_locked():
                    self._cv.wait(0.005)

    def inject_fault(self, code: int = MTL.ErrorPageFault, after_commands: int = 0) -> None:
        """Fault injection: ``after_commands`` more kernel dispatches run normally, then the next one faults and
        its command buffer ends in status Error with MTLCommandBufferError ``code`` (one shot)."""
        if code not in MTL.ERROR_NAMES or code == MTL.ErrorNone:
            raise ValueError(f"inject_fault: {code} is not an MTLCommandBufferError code")
        if after_commands < 0:
            raise ValueError(f"inject_fault: after_commands must be >= 0, got {after_commands}")
        with self._lock:
            self.gpu.injected_fault = (code, after_commands)

    def inject(self, *faults: str | Fault) -> list[Fault]:
        """Arm ``faults`` (``runtime/sim/injection.py``, docs/reliability.md), each given as ``mtlir run
        --inject-fault`` spells it or as a ``Fault``; indices count from this call. ``"K:NAME"``/``"K:CODE"``: the
        K-th command buffer committed from now ends in status Error with that MTLCommandBufferError (Timeout 2,
        PageFault 3, NotPermitted 7, OutOfMemory 8, InvalidResource 9, ...) at its first kernel, before it runs;
        ``"K:hang"``: its first kernel never finishes, the GPU watchdog (``gpu_timeout_s``) ends it in Error,
        Timeout; ``"alloc:KIND[:N]"``: the N-th buffer, icb or pipeline allocation from now returns nil. Each fires
        once; ``faults.fired`` lists those that struck. Returns the faults armed. Raises ``ArgumentError`` for a
        spelling it cannot read or two faults for one command buffer or allocation (nothing is armed then)."""
        parsed = [f if isinstance(f, Fault) else Fault.parse(f) for f in faults]
        with self._lock:
            plan = self.faults
            saved = (dict(plan.by_commit), dict(plan.by_allocation))
            try:
                for fault in parsed:
                    plan.arm(fault)
            except Exception:
                plan.by_commit, plan.by_allocation = saved
                raise
        return parsed

    def set_max_total_threads(self, pipeline: int, n: int) -> None:
        """Test hook: the pipeline with handle ``pipeline`` reports maxTotalThreadsPerThreadgroup ``n``
        (real devices report 1024, 896, 832, 256...). Raises ``BridgeError``/``ValueError`` for bad input."""
        if not 1 <= n <= 1024:
            raise ValueError(f"maxTotalThreadsPerThreadgroup must be in [1, 1024], got {n}")
        with self._lock:
            obj = self._lookup(pipeline, "set_max_total_threads")
            if not isinstance(obj, Pipeline):
                raise BridgeError(f"set_max_total_threads: {obj.describe()} is not an MTLComputePipelineState")
            obj.max_threads = n
            for o in self._objects.values():
                if isinstance(o, ICB):
                    o.analysis.clear()  # its cached checks used the old limit

    def buffer_bytes(self, buffer: int) -> np.ndarray:
        """The storage of an MTLBuffer (uint8, the bytes the kernels see), also for private buffers."""
        with self._lock:
            obj = self._lookup(buffer, "buffer_bytes")
            if not isinstance(obj, Buffer):
                raise BridgeError(f"buffer_bytes: {obj.describe()} is not an MTLBuffer")
            return obj.storage

    def live_objects(self) -> dict[str, int]:
        """How many live objects of each class (class objects and the device excluded): for leak tests."""
        with self._lock:
            out: dict[str, int] = {}
            for o in self._objects.values():
                if not isinstance(o, (ClassObject, Device)):
                    out[o.objc_class] = out.get(o.objc_class, 0) + 1
            return out

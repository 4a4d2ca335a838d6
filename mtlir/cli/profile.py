"""``mtlir run ... --profile FILE``: a profile of the run in the Chrome trace event format (the JSON object form),
which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Events are complete events (``"ph": "X"``) with ``ts`` and ``dur`` in microseconds, plus metadata events
(``"ph": "M"``) naming the two processes and their threads:

- pid 1 ``host``: ``lower``, ``link``, each ``submit N`` and each ``wait``, timed with ``time.perf_counter`` on the
  host, from the start of the run;
- pid 2 ``GPU``: each command buffer a submit committed, from its ``GPUStartTime``/``GPUEndTime``
  (``Submission.spans``; a time Metal reports as not available, 0.0, gives no event). The GPU's clock has another
  origin than the host's: its spans are shifted so the first command buffer starts where its submit started on the
  host, and keep their durations and distances exactly. A command buffer's span covers every kernel it ran (Apple GPUs
  time command buffers, METAL.md §1); a profiled submit (``Queue.timestamp``: one command buffer per command) has one
  span per command, named after its kernel.

``check_chrome_trace(doc)`` checks a document against this schema (what Perfetto's JSON importer needs).
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtlir.cli.report import UsageError

__all__ = ["HostSpan", "HostClock", "chrome_trace", "check_chrome_trace", "write_profile", "HOST_PID", "GPU_PID"]

HOST_PID, GPU_PID = 1, 2


@dataclass(frozen=True)
class HostSpan:
    """A span of host time: ``name``, ``start_s`` and ``end_s`` from ``time.perf_counter`` (seconds), ``args``
    shown with the event."""

    name: str
    start_s: float
    end_s: float
    args: Mapping[str, Any] = field(default_factory=dict)


class HostClock:
    """The host spans of a run, taken as it goes: ``start(name)`` opens a span, ``stop()`` closes the open one
    (``time.perf_counter``); ``origin`` is the moment the clock was made (``ts`` 0 of the profile), ``spans`` the
    closed spans in order. ``record=False`` keeps none (a run without ``--profile``: one span per submit would
    grow without bound over ``--repeat``)."""

    def __init__(self, *, record: bool = True) -> None:
        self.origin = time.perf_counter()
        self.record = record
        self.spans: list[HostSpan] = []
        self._open: tuple[str, float, dict[str, Any]] | None = None

    def start(self, name: str, **args: Any) -> float:
        """Open span ``name`` (closing one still open); returns its start (``perf_counter`` seconds)."""
        if self._open is not None:
            self.stop()
        now = time.perf_counter()
        self._open = (name, now, args)
        return now

    def stop(self) -> None:
        """Close the open span (nothing when none is open)."""
        if self._open is not None:
            name, start, args = self._open
            if self.record:
                self.spans.append(HostSpan(name, start, time.perf_counter(), args))
            self._open = None

    def starts(self, prefix: str) -> list[float]:
        """The start of every span whose name begins with ``prefix``, in order (``submit`` gives each submit's)."""
        return [sp.start_s for sp in self.spans if sp.name.startswith(prefix)]


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def chrome_trace(host: Sequence[HostSpan], submissions: Sequence[Any], submit_starts: Sequence[float],
                 kernels: Sequence[str], *, origin_s: float, metadata: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The profile (module docstring) as a JSON-ready dict ``{"traceEvents": [...], "displayTimeUnit": "ns",
    "otherData": metadata}``. ``host``: the host spans; ``submissions``: the completed ``Submission``s (their
    ``index`` and ``spans``); ``submit_starts``: the host ``perf_counter`` second each submit began, by index;
    ``kernels``: the kernel names of the queue in command order (each command buffer's event lists them, and a
    submit with one command buffer per kernel names each span after its kernel); ``origin_s``: the host time of
    ``ts`` 0."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": HOST_PID, "tid": 1, "args": {"name": "host"}},
        {"name": "thread_name", "ph": "M", "pid": HOST_PID, "tid": 1, "args": {"name": "mtlir run"}},
        {"name": "process_name", "ph": "M", "pid": GPU_PID, "tid": 1, "args": {"name": "GPU"}},
        {"name": "thread_name", "ph": "M", "pid": GPU_PID, "tid": 1, "args": {"name": "command buffers"}},
    ]
    for span in host:
        events.append({"name": span.name, "cat": "host", "ph": "X", "pid": HOST_PID, "tid": 1,
                       "ts": _us(span.start_s - origin_s), "dur": _us(max(span.end_s - span.start_s, 0.0)),
                       "args": dict(span.args)})
    gpu_origin: int | None = None
    host_origin = 0.0
    for rec in submissions:
        timed = [sp for sp in rec.spans if sp.ns is not None]
        per_kernel = len(timed) == len(kernels) and len(timed) > 1
        for k, sp in enumerate(timed):
            if gpu_origin is None:
                gpu_origin = sp.start_ns
                start = submit_starts[rec.index] if rec.index < len(submit_starts) else origin_s
                host_origin = start - origin_s
            name = kernels[k] if per_kernel else f"command buffer (submit {rec.index})"
            events.append({"name": name, "cat": "gpu", "ph": "X", "pid": GPU_PID, "tid": 1,
                           "ts": round(host_origin * 1e6 + (sp.start_ns - gpu_origin) / 1e3, 3),
                           "dur": round(sp.ns / 1e3, 3),
                           "args": {"submit": rec.index, "cbslot": sp.cb,
                                    "kernels": [kernels[k]] if per_kernel else list(kernels),
                                    "GPUStartTime_ns": sp.start_ns, "GPUEndTime_ns": sp.end_ns}})
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": dict(metadata or {})}


_X_FIELDS: dict[str, type | tuple[type, ...]] = {"name": str, "ph": str, "pid": int, "tid": int, "ts": (int, float),
                                                 "dur": (int, float)}


def check_chrome_trace(doc: Any) -> None:
    """Check ``doc`` is a Chrome trace event document as this module writes it: an object with a ``traceEvents``
    list whose events are objects with ``name``, ``ph`` (``X`` or ``M``), integer ``pid``/``tid``; an ``X`` event
    with numeric ``ts`` >= 0 and ``dur`` >= 0 (microseconds) and an object ``args`` when present; an ``M`` event
    naming a process or thread in ``args.name``. Raises ``ValueError`` naming the first event that is not."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError("a Chrome trace is an object with a 'traceEvents' list")
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        raise ValueError(f"displayTimeUnit {doc['displayTimeUnit']!r} is not 'ms' or 'ns'")
    for i, ev in enumerate(doc["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(ev, dict):
            raise ValueError(f"{where} is not an object")
        ph = ev.get("ph")
        if ph not in ("X", "M"):
            raise ValueError(f"{where}: ph {ph!r} is not 'X' (complete) or 'M' (metadata)")
        for key, typ in _X_FIELDS.items():
            if ph == "M" and key in ("ts", "dur"):
                continue
            if key not in ev or isinstance(ev[key], bool) or not isinstance(ev[key], typ):
                raise ValueError(f"{where}: {key!r} is missing or not a {typ}")
        if ph == "X" and (ev["ts"] < 0 or ev["dur"] < 0):
            raise ValueError(f"{where}: negative ts or dur ({ev['ts']}, {ev['dur']})")
        if "args" in ev and not isinstance(ev["args"], dict):
            raise ValueError(f"{where}: args is not an object")
        if ph == "M" and (ev["name"] not in ("process_name", "thread_name")
                          or not isinstance(ev.get("args", {}).get("name"), str)):
            raise ValueError(f"{where}: a metadata event names a process or thread in args.name")


def write_profile(path: Path, doc: Mapping[str, Any]) -> Path:
    """Write the profile ``doc`` as JSON to ``path`` after ``check_chrome_trace``. Raises ``UsageError`` naming
    ``--profile`` when the file cannot be written."""
    check_chrome_trace(doc)
    try:
        path.write_text(json.dumps(doc, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--profile {path}: cannot write the profile: {e.strerror or e}") from None
    return path

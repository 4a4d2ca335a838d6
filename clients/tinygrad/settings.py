"""The settings of mtlir's tinygrad device, read when tinygrad opens the device (``Device["METAL"]``): set them
before, with ``mtlir.tinygrad.configure(...)`` or the launcher's flags (``python -m mtlir.tinygrad --family Apple7
script.py``)."""
from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields

from mtlir.errors import ArgumentError, StateError
from mtlir.metal import FAMILIES, TARGETS
from mtlir.runtime.bridge.bridge import Bridge

__all__ = ["Settings", "SETTINGS", "configure"]


@dataclass
class Settings:
    """``family``: the GPU family the device reports (tinygrad renders for it: Apple7 and later get SIMD-group
    matrix code for matrix multiplies); ``target``: the ABI of the simulated device (None: this machine's);
    ``strict``: the simulated device's validation layer (METAL.md §3 rules raise); ``residency_set``: a device with
    residency sets (else Programs list their buffers in ``useResources:count:usage:``); ``timeout_s``: every wait,
    in seconds; ``bridge``: a function returning the Bridge to use instead of a ``SimDevice`` (real Metal)."""

    family: str = "Apple9"
    target: str | None = None
    strict: bool = True
    residency_set: bool = True
    timeout_s: float = 30.0
    bridge: Callable[[], Bridge] | None = None


SETTINGS = Settings()


def configure(**kwargs: object) -> Settings:
    """Change ``SETTINGS`` by keyword (the fields of ``Settings``) before tinygrad opens the METAL device; returns
    them. Every value is checked here, all before any is set (a bad one used to surface at the first tensor, as
    ``Session(timeout_s=...)``). Raises ``TypeError`` for an unknown keyword or a value of the wrong type
    (``strict``/``residency_set`` not a bool, ``bridge`` not callable), ``ArgumentError`` (a ``ValueError``) for an
    unknown family or target or a ``timeout_s`` that is not a finite number of seconds above 0, and ``StateError``
    (a ``RuntimeError``) for a change once the device is open: the device was made from the settings then (its family, target, strict mode and
    timeouts), so a later change would be returned but would change nothing. Setting a value it already has is
    allowed."""
    names = {f.name for f in fields(Settings)}
    new: dict[str, object] = {}
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"configure: unknown setting {k!r} (settings: {', '.join(sorted(names))})")
        new[k] = _checked(k, v)
    changed = {k: v for k, v in new.items() if getattr(SETTINGS, k) != v}
    if changed and (opened := _metal_opened()):
        given = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        raise StateError(f"configure({given}): the METAL device is already open ({opened}): it was made from "
                              "the settings then and would not change; configure before the first tensor (or "
                              "run it in a new process)")
    for k, v in new.items():
        setattr(SETTINGS, k, v)
    return SETTINGS


def _checked(name: str, value: object) -> object:
    """``value`` for the setting ``name``, in its canonical form (a family's spelling, ``timeout_s`` as a float);
    ``TypeError``/``ValueError`` naming the setting."""
    if name == "family":
        fam = {f.lower(): f for f in FAMILIES}.get(str(value).lower())
        if fam is None:
            raise ArgumentError(f"configure: unknown GPU family {value!r}: expected one of {', '.join(FAMILIES)}")
        return fam
    if name == "target" and value is not None and value not in TARGETS:
        raise ArgumentError(f"configure: unknown target {value!r}: expected one of {', '.join(TARGETS)}")
    if name in ("strict", "residency_set") and not isinstance(value, bool):
        raise TypeError(f"configure: {name}={value!r}: expected True or False")
    if name == "timeout_s":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"configure: timeout_s={value!r}: expected a number of seconds")
        if not math.isfinite(value) or value <= 0:
            raise ArgumentError(f"configure: timeout_s={value!r}: the timeout must be a finite number of seconds "
                             "above 0")
        return float(value)
    if name == "bridge" and value is not None and not callable(value):
        raise TypeError(f"configure: bridge={value!r}: expected a function returning a Bridge, or None")
    return value


def _metal_opened() -> str:
    """``"Apple9, strict"``-like words when tinygrad has opened the METAL device in this process, else "" (read
    from ``tinygrad.device.Device._opened_devices`` when tinygrad is imported; nothing is imported here)."""
    device_module = sys.modules.get("tinygrad.device")
    opened = getattr(getattr(device_module, "Device", None), "_opened_devices", ())
    if "METAL" not in opened:
        return ""
    return f"{SETTINGS.family}, {'strict' if SETTINGS.strict else 'faithful'}, timeout {SETTINGS.timeout_s:g} s"

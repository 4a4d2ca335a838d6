"""The settings of mtlir's tinygrad device, read when tinygrad opens the device (``Device["METAL"]``): set them
before, with ``mtlir.tinygrad.configure(...)`` or the launcher's flags (``python -m mtlir.tinygrad --family Apple7
script.py``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

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
    """Change ``SETTINGS`` by keyword (the fields of ``Settings``); returns them. Raises ``TypeError`` for an
    unknown keyword, ``ValueError`` for an unknown family or target."""
    names = {f.name for f in fields(Settings)}
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"configure: unknown setting {k!r} (settings: {', '.join(sorted(names))})")
        if k == "family":
            fam = {f.lower(): f for f in FAMILIES}.get(str(v).lower())
            if fam is None:
                raise ValueError(f"configure: unknown GPU family {v!r}: expected one of {', '.join(FAMILIES)}")
            v = fam
        if k == "target" and v is not None and v not in TARGETS:
            raise ValueError(f"configure: unknown target {v!r}: expected one of {', '.join(TARGETS)}")
        setattr(SETTINGS, k, v)
    return SETTINGS

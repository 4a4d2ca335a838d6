"""The OpenCL devices the simulated device can run kernels on: listing them (``mtlir run --list-devices``), picking
one by index or name (``--opencl-device``, ``SimDevice(opencl_device=...)``), and what kind each is (a CPU works in
host memory, a GPU keeps its own copies: docs/kernels.md). ``NoDeviceError`` says what to install when pyopencl or an
OpenCL platform is missing."""
from __future__ import annotations

import importlib
from typing import Any

from mtlir.errors import NoDeviceError

__all__ = ["INSTALL_HINT", "list_devices", "select_device", "device_name", "device_kind"]

INSTALL_HINT = ("install an OpenCL runtime for the CPU (Debian/Ubuntu: `sudo apt-get install pocl-opencl-icd "
                "ocl-icd-libopencl1`) and the Python package pyopencl (`pip install pyopencl`)")


def _import_pyopencl() -> Any:
    """The pyopencl module; ``NoDeviceError`` saying what to install when it is missing."""
    try:
        return importlib.import_module("pyopencl")
    except ImportError:
        raise NoDeviceError(f"pyopencl is not installed: {INSTALL_HINT}") from None


def _devices(cl: Any) -> list[Any]:
    """Every OpenCL device, platform by platform in the order the ICD loader gives; ``NoDeviceError`` when there is
    no platform."""
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:
        raise NoDeviceError(f"no OpenCL platform found ({e}): {INSTALL_HINT}") from None
    devices: list[Any] = []
    for platform in platforms:
        try:
            devices += platform.get_devices()
        except cl.Error:
            continue
    return devices


def device_name(device: Any) -> str:
    """``"platform / device"``: the name ``--opencl-device`` matches and the run's result reports."""
    return f"{device.platform.name.strip()} / {device.name.strip()}"


def list_devices(cl: Any = None) -> list[str]:
    """One line per OpenCL device, ``"index: platform / device (type, OpenCL version)"``, in the order
    ``select_device`` counts them. Raises ``NoDeviceError`` when pyopencl or an OpenCL platform is missing."""
    cl = _import_pyopencl() if cl is None else cl
    return [f"{i}: {_describe(cl, d)}" for i, d in enumerate(_devices(cl))]


def _describe(cl: Any, device: Any) -> str:
    """``"platform / device (type, OpenCL version)"``."""
    return f"{device_name(device)} ({device_kind(cl, device)}, {device.version.strip()})"


def device_kind(cl: Any, device: Any) -> str:
    """``GPU``, ``CPU``, ``accelerator`` or ``custom``: the one kind ``CL_DEVICE_TYPE`` names; ``unknown`` where it
    sets several (Oclgrind sets them all)."""
    t = cl.device_type
    kinds = [name for bit, name in ((t.GPU, "GPU"), (t.CPU, "CPU"), (t.ACCELERATOR, "accelerator"),
                                    (getattr(t, "CUSTOM", 0), "custom")) if bit and int(device.type) & int(bit)]
    return kinds[0] if len(kinds) == 1 else "unknown"


def select_device(cl: Any, which: str | int | None = None) -> Any:
    """The OpenCL device ``which`` names: ``None`` the first device of the first platform that has one; an int (or
    a string of digits) its index in ``list_devices``; another string the first device whose line there
    (``"platform / device (type, version)"``: ``pocl``, ``nvidia``, ``gpu``, ``oclgrind``) contains it, in any case.
    ``NoDeviceError`` saying what to install when there is none, or naming the devices present when none matches."""
    devices = _devices(cl)
    if not devices:
        raise NoDeviceError(f"no OpenCL device found: {INSTALL_HINT}")
    if which is None:
        return devices[0]
    names = [_describe(cl, d) for d in devices]
    present = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
    if isinstance(which, int) or which.strip().isdigit():
        index = int(which)
        if not 0 <= index < len(devices):
            raise NoDeviceError(f"no OpenCL device {index}: the devices present are {present}")
        return devices[index]
    for d, n in zip(devices, names):
        if which.strip().lower() in n.lower():
            return d
    raise NoDeviceError(f"no OpenCL device matches {which!r}: the devices present are {present}")

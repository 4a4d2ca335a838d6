"""A Program on a ctypes bridge: the stand-in libobjc of tests/native driven by an unmodified ``MetalBridge``.

``tests/native/fakeobjc.c`` (with ``objc_msgSend_x86_64.S``) is a minimal libobjc whose ``objc_msgSend`` finds a
method through the receiver's isa as Apple's does and whose methods, at the exact C prototypes of Metal's
selectors, only record their arguments (docs/metal-bridge.md, "Testing without a Mac"): a call costs what ctypes
and the dispatch cost, nothing more, so an executor's own overhead shows in full. It cannot compile kernels, so a
Program is linked on a ``RecordingBridge`` (its fake device) and its registers are then remade on the stand-in by
kind: the device, queue, shared event, ICB and its commands are the stand-in's objects, every other object (a
pipeline, a fence, a buffer) a stand-in object whose class answers nothing (a message to it returns 0, as a message
to an unrecognized selector does), and every host table (``cbslots``, ``resources``, ``contents``, ``table``, ...)
host memory of the ``MetalBridge`` of the size link gave it, with link's bytes (the handles in a ``table`` or
``resources`` array replaced by the stand-in's). x86_64 only (the stand-in's objc_msgSend is
x86_64 assembly); needs a C compiler (``cc``).
"""
from __future__ import annotations

import platform
import struct
import shutil
import subprocess
from pathlib import Path
from typing import Any

from mtlir.metal import abi_prototype, c_prototype
from mtlir.program.program import Program
from mtlir.runtime.bridge.recording import RecordingBridge
from mtlir.runtime.executors.executor import prepare_registers
from mtlir.runtime.link.link import link
from mtlir.runtime.metal.bridge import MetalBridge

__all__ = ["StandInError", "build_standin", "standin_registers", "available"]

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "tests" / "native"
_HOST_KINDS = ("contents", "resources", "cbslots", "struct", "scratch", "table")


class StandInError(RuntimeError):
    """The stand-in libobjc cannot be built or used here (not x86_64, no C compiler, a compiler error)."""


def available() -> str | None:
    """None where the stand-in can be built; else why not."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the stand-in libobjc is x86_64 only (this machine is {platform.machine()})"
    if not (shutil.which("cc") or shutil.which("gcc")):
        return "no C compiler (cc or gcc) on PATH"
    return None


def build_standin(out: Path = ROOT / "build" / "bench") -> MetalBridge:
    """Compile the stand-in libobjc into ``out`` (again only when its sources are newer) and return a
    ``MetalBridge`` on it (x86_64 target). Raises ``StandInError`` when it cannot be built."""
    why = available()
    if why is not None:
        raise StandInError(why)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / "libfakeobjc.so"
    srcs = [NATIVE / "fakeobjc.c", NATIVE / "objc_msgSend_x86_64.S"]
    if not lib.exists() or any(s.stat().st_mtime > lib.stat().st_mtime for s in srcs):
        cc = shutil.which("cc") or shutil.which("gcc") or "cc"
        done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), *map(str, srcs)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise StandInError(f"building the stand-in libobjc failed:\n{done.stdout}{done.stderr}")
    return MetalBridge(target="x86_64", libobjc=str(lib), metal=str(lib), coregraphics=None)


class _Sizes(RecordingBridge):
    """A RecordingBridge that also keeps the size of every host region link names."""

    def __init__(self, target: str) -> None:
        super().__init__(target=target)
        self.sizes: dict[int, int] = {}

    def name_region(self, addr: int, nbytes: int, name: str) -> None:
        self.sizes[addr] = nbytes
        super().name_region(addr, nbytes, name)


def standin_registers(program: Program, bridge: MetalBridge) -> list[Any]:
    """The register file of ``program`` (lowered for x86_64) on the stand-in ``bridge``: link on a
    ``RecordingBridge``, then each object register remade on the stand-in by kind (module docstring)."""
    if program.target != "x86_64":
        raise StandInError(f"the stand-in takes a Program lowered for x86_64, not {program.target}")
    rec = _Sizes("x86_64")
    linked = link(program, rec)

    def send(recv: int, sel: str, *a: Any) -> Any:
        return bridge.msg_send(abi_prototype(sel, "x86_64"), (recv, bridge.sel_registerName(sel), *a))
    device = int(bridge.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ()))
    icb = int(send(device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", 0, 1, 0))
    made = {"device": device, "queue": int(send(device, "newCommandQueueWithMaxCommandBufferCount:", 4)),
            "event": int(send(device, "newSharedEvent")), "icb": icb,
            "icbcmd": int(send(icb, "indirectComputeCommandAtIndex:", 0))}
    # every object link made (also those only named inside a host table), remade on the stand-in: device objects
    # as above, host memory of the same size; then the host memory filled with link's bytes, the handles and host
    # addresses inside a table or a resources array replaced by the stand-in's
    remade: dict[int, int] = {}
    host: list[tuple[int, int, int, str]] = []  # (stand-in address, fake address, bytes, kind)

    def remake(value: int, kind: str) -> int:
        if value in remade:
            return remade[value]
        if kind in _HOST_KINDS:
            nbytes = rec.sizes.get(value, 0)
            if kind == "contents":
                nbytes = next((n for _, c, n in linked.buffers.values() if c == value), nbytes)
            remade[value] = bridge.malloc(max(nbytes, 64))
            host.append((remade[value], value, nbytes, kind))
        else:  # made[kind], or a stand-in object that answers no message
            remade[value] = made.get(kind) or int(send(device, "newBufferWithLength:options:", 16, 0))
        return remade[value]
    for name, handle in linked.handles.items():
        if name in linked.objects and type(handle) is int:
            remake(handle, linked.objects[name].kind)
    objects = {r: remake(linked.registers[r], obj.kind) for r, obj in program.objects.items()}
    for addr, value, nbytes, kind in host:
        data = rec.read(value, nbytes) if nbytes else b""
        if kind in ("table", "resources") and nbytes >= 8:
            words = struct.unpack(f"<{nbytes // 8}Q", data[:nbytes // 8 * 8])
            data = struct.pack(f"<{len(words)}Q", *(remade.get(w, w) for w in words)) + data[len(words) * 8:]
        if data:
            bridge.write(addr, data)
    linked.release()
    return prepare_registers(program, bridge, objects)

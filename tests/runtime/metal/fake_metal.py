"""The fake Metal of tests/native as the tests drive it: build it for an architecture, run ``mtlir run --device
metal`` on it (in this process, ``mtlir.cli.main.main`` with an unmodified ``MetalBridge`` on the built libraries),
and read back what arrived: the messages of one submit with objects by name, and the dispatch records.

Used by test_fake_metal.py (x86_64, in ``make test``) and by tests/arm64/run_arm64.py (the same runs in an AArch64
Python under qemu, ``make test-arm64``), so both ABIs are measured by the same code.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtlir.cli.main import main
from mtlir.ir.dtypes import PtrDType, dtypes
from mtlir.metal import SELECTORS
from mtlir.runtime.bridge.recording import RecordingBridge
from mtlir.runtime.metal.bridge import MetalBridge, host_target

NATIVE = Path(__file__).resolve().parents[2] / "native"
TRACES = Path(__file__).resolve().parents[3] / "examples" / "traces"
APPLE7 = sorted(str(p) for p in TRACES.glob("*.apple7.json"))
# the lowerings of one trace a device can get: residency set and ICB, no ICB (paravirtual Metal), no residency set
FLAGS: dict[str, list[str]] = {"icb": [], "direct": ["--no-icb"], "no-rs": ["--no-residency-set"]}

# per architecture: the C/Objective-C compiler and the objc_msgSend shim
COMPILERS = {"x86_64": ("gcc-12", "objc_msgSend_gnu_x86_64.S"),
             "aarch64": ("aarch64-linux-gnu-gcc-12", "objc_msgSend_gnu_aarch64.S")}


class BuildError(Exception):
    """The fake Metal did not build (the compiler's output is the message)."""


@dataclass(frozen=True)
class Libs:
    """The built stand-in libobjc (GNU's libobjc4 + an objc_msgSend) and the fake Metal framework."""

    libobjc: str
    metal: str

    @property
    def env(self) -> str:
        """The value of ``MTLIR_METAL_LIBS`` that points a ``MetalBridge`` here."""
        return f"{self.libobjc}:{self.metal}"


def compiler(arch: str) -> str | None:
    """The compiler that builds the fake for ``arch`` when it is installed with Objective-C (gobjc), else None."""
    cc = shutil.which(COMPILERS[arch][0])
    if cc is None:
        return None
    probe = subprocess.run([cc, "-x", "objective-c", "-fsyntax-only", "-"], input="@interface A\n@end\n",
                           capture_output=True, text=True)
    return cc if probe.returncode == 0 else None


def build(arch: str, out: Path, cc: str | None = None) -> Libs:
    """Compile the stand-in libobjc and the fake Metal for ``arch`` into ``out``; raises ``BuildError``."""
    cc = cc or compiler(arch)
    if cc is None:
        raise BuildError(f"no {COMPILERS[arch][0]} with Objective-C (Debian: gobjc-12 / gobjc-12-aarch64-linux-gnu)")
    out.mkdir(parents=True, exist_ok=True)
    libs = Libs(str(out / "libobjc-apple.so"), str(out / "libFakeMetal.so"))
    flags = ["-std=gnu11", "-shared", "-fPIC", "-O2", "-Wall", "-Werror"]
    for cmd in ([cc, *flags, "-o", libs.libobjc, str(NATIVE / "objc_apple.c"), str(NATIVE / COMPILERS[arch][1]),
                 "-lobjc"],
                [cc, *flags, "-Wno-objc-root-class", "-o", libs.metal, str(NATIVE / "fakemetal.m"), "-lobjc"]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"{' '.join(cmd)}\n{done.stdout}{done.stderr}")
    return libs


@dataclass
class Run:
    """One ``mtlir run`` and what the fake received: ``code`` and ``doc`` (its --json), ``log`` (every message that
    arrived, as the fake logged it), ``names`` (handle -> name, from link), ``dispatches`` (the kernel server's
    records, in order)."""

    code: int
    doc: dict[str, Any]
    stderr: str
    log: list[dict[str, Any]]
    names: RecordingBridge
    dispatches: list[dict[str, Any]] = field(default_factory=list)

    def first_submit(self, count: int) -> list[dict[str, Any]]:
        """The last ``count`` messages up to the first command buffer's ``commit`` (the first submit, when it sent
        ``count`` messages), in the form of ``mtlir lower --json``: objects by name, structs as lists."""
        end = next(i for i, m in enumerate(self.log)
                   if m["sel"] == "commit" and self.names.name_of(m["self"]) == "cmdbuf")
        return [self.named(m) for m in self.log[max(0, end + 1 - count):end + 1]]

    def named(self, m: dict[str, Any]) -> dict[str, Any]:
        """A logged message with its objects and pointers named (``RecordingBridge.name_of``)."""
        sig = SELECTORS[m["sel"]]
        args = [self.names.name_of(v) if isinstance(dt, PtrDType) or dt in (dtypes.id, dtypes.SEL) else v
                for dt, v in zip(sig.args, m["args"])]
        return {"receiver": self.names.name_of(m["self"]), "selector": m["sel"], "args": args}


def canonical(dispatches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dispatch records with each buffer (a handle, an object id) replaced by its number in order of first use,
    so records of different devices compare: ``{"function", "grid", "threadgroup", "bindings": [[index, buffer
    number, offset, length], ...]}`` (bindings by index)."""
    numbers: dict[Any, int] = {}
    out = []
    for d in dispatches:
        binds = sorted([i, numbers.setdefault(b, len(numbers)), off, n] for i, b, off, n in d["bindings"])
        out.append({"function": d["function"], "grid": list(d["grid"]), "threadgroup": list(d["threadgroup"]),
                    "bindings": binds})
    return out


def run_on_fake(trace: str, flags: list[str], libs: Libs, socket_path: str, log_path: Path,
                repeat: int = 1) -> Run:
    """``mtlir run TRACE --device metal --json FLAGS`` in this process on a ``MetalBridge`` over ``libs`` (wrapped in
    a ``RecordingBridge`` only to learn the names link gives the objects); the fake logs to ``log_path`` and runs
    kernels through the server at ``socket_path``."""
    log_path.write_text("")  # truncated, not removed: the fake may hold it open (it appends)
    made: list[RecordingBridge] = []

    def bridge() -> RecordingBridge:
        made.append(RecordingBridge(MetalBridge(libobjc=libs.libobjc, metal=libs.metal, coregraphics=None)))
        return made[-1]
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in ("FAKE_METAL_LOG", "FAKE_METAL_KERNELS")}
    os.environ.update(FAKE_METAL_LOG=str(log_path), FAKE_METAL_KERNELS=socket_path)
    try:
        code = main(["run", trace, "--device", "metal", "--json", "--repeat", str(repeat), *flags], out=out,
                    log=err, metal_available=lambda: True, metal_bridge=bridge)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    doc = json.loads(out.getvalue()) if out.getvalue().strip() else {}
    log = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    return Run(code, doc, err.getvalue(), log, made[0] if made else RecordingBridge(target=host_target()))


def lowered_messages(trace: str, flags: list[str], target: str) -> list[dict[str, Any]]:
    """What ``mtlir lower TRACE --json`` lists for one submit on ``target``."""
    out, err = io.StringIO(), io.StringIO()
    code = main(["lower", trace, "--json", "--target", target, *flags], out=out, log=err)
    assert code == 0, err.getvalue()
    messages: list[dict[str, Any]] = json.loads(out.getvalue())["messages"]
    return messages


class RecordingRunner:
    """A kernel runner for the simulated device that records each dispatch as the kernel server does (the
    storage array stands for the buffer) and runs it on ``runner`` (a ``KernelRunner``)."""

    def __init__(self, runner: Any, records: list[dict[str, Any]]) -> None:
        self.runner, self.records = runner, records
        self._keep: list[Any] = []  # the storages recorded stay alive, so their ids are never reused

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def compile(self, msl: str, function: str) -> Any:
        return _RecordingKernel(self, self.runner.compile(msl, function), function)


class _RecordingKernel:
    def __init__(self, owner: RecordingRunner, kernel: Any, function: str) -> None:
        self.owner, self.kernel, self.function = owner, kernel, function

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def run(self, bindings: dict[int, tuple[Any, int]], grid: tuple[int, int, int],
            threadgroup: tuple[int, int, int], **kw: Any) -> None:
        if 0 not in tuple(grid) + tuple(threadgroup):  # an empty dispatch runs nothing on either device
            self.owner._keep += [s for s, _ in bindings.values()]
            self.owner.records.append({"function": self.function, "grid": list(grid),
                                       "threadgroup": list(threadgroup),
                                       "bindings": [[i, id(s), off, s.nbytes] for i, (s, off) in bindings.items()]})
        self.kernel.run(bindings, grid, threadgroup, **kw)


def run_on_sim(trace: str, flags: list[str], runner: Any) -> tuple[int, list[dict[str, Any]]]:
    """``mtlir run TRACE --device sim FLAGS`` in this process (strict), its kernels on ``runner``: the exit code and
    the dispatch records."""
    from mtlir.runtime.sim.device import SimDevice
    records: list[dict[str, Any]] = []

    def make(kind: str, target: str, faithful: bool, program: Any, metal: Any) -> tuple[Any, str]:
        dev = program.device
        return SimDevice(target, family=dev.family, residency_sets=dev.residency_set, icb=dev.icb,
                         kernel_runner=RecordingRunner(runner, records)), "sim"
    out, err = io.StringIO(), io.StringIO()
    code = main(["run", trace, "--device", "sim", "--json", *flags], out=out, log=err, make_bridge=make)
    return code, records

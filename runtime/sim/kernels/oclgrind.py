"""Checked kernels: a kernel run on Oclgrind, which reports out-of-bounds accesses and data races between work-items.

``SimDevice(checked=True)`` and ``mtlir run --check-kernels`` run every kernel, before the kernel runner runs it as
usual, once more on Oclgrind (Debian's package ``oclgrind``, ``make oclgrind``: an OpenCL device that interprets
the kernel and checks every access). What Oclgrind runs is the kernel translated *without* mtlir's bounds checks
(``msl.translate(bounds_checks=False)``, what ``mtlir translate --no-bounds-checks`` prints): the checks would skip
an out-of-bounds access before Oclgrind saw it. Oclgrind runs in a child process of its own (``check_kernel``):
its ICD is found through ``OCL_ICD_VENDORS`` and reads its options (``OCLGRIND_DATA_RACES=1``: race detection;
``OCLGRIND_UNIFORM_WRITES`` left off, so two work-items writing the same value are not a race) when the context is
made, which a process that already uses PoCL could not arrange. The child works on copies of the buffers; the
results the program sees are the kernel runner's.

Oclgrind writes its reports to the child's file descriptor 2, captured around the kernel with ``stderr``'s
``_native_stderr``; ``parse_reports`` reads each (``Invalid read of size 4 at global memory address ...``,
``Read-write data race at global memory address ...``) into a ``Report`` and maps its OpenCL line (``At line 7
(column 12) of input.cl``) back to the MSL line with the translation's line map (``Translation.msl_position``).
The first report becomes a ``KernelCheckError`` naming the kernel, the MSL line and the kind of problem.

The child never outlives the process that started it (``_Child``): it runs in a session of its own (a Ctrl-C at
the terminal reaches mtlir, which decides), is killed when its time limit passes, on any exception in the parent
(``KeyboardInterrupt`` included) and at interpreter exit (``atexit``); and it ends itself when its parent does,
even one that leaves with ``os._exit`` or is killed: on Linux through ``prctl(PR_SET_PDEATHSIG, SIGKILL)``
(prctl(2)), everywhere through a pipe whose write end only the parent holds (a thread of the child waits for its
end of file). A check's time limit is the device's ``check_timeout_s`` (``mtlir run`` sets it to ``--timeout``;
``CHECK_TIMEOUT_S`` without), not the runner's per-kernel limit: Oclgrind interprets kernels, many times slower.

Each distinct launch is checked once per device (``CheckedRuns``): the same MSL and kernel, the same grid and
threadgroup, and every bound buffer the same (its byte offset and a BLAKE2b digest of its bytes as they are when
the launch runs). A launch whose inputs changed, or whose outputs hold other values than before, is checked again;
``mtlir run --check-kernels --repeat 50`` checks each launch of a run once or twice (the second run sees the
first's results in its output buffers), not fifty times.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtlir.errors import KernelCheckError, NoDeviceError
from mtlir.runtime.sim.msl.translate import Translation, translate

__all__ = ["OCLGRIND_ICD", "Report", "available", "check_kernel", "parse_reports", "check_launch", "CheckedRuns",
           "launch_key", "CHECK_TIMEOUT_S"]

OCLGRIND_ICD = Path("/usr/lib/oclgrind/liboclgrind-rt-icd.so")  # Debian's package oclgrind
CHECK_TIMEOUT_S = 120.0  # a check's time limit (seconds) on a device without ``check_timeout_s``
_FAULT_WORDS = 64  # the fault record the translated kernel writes to (unused without the bounds checks)


def available() -> bool:
    """Whether Oclgrind's ICD library is installed."""
    return OCLGRIND_ICD.exists()


@dataclass(frozen=True)
class Report:
    """One problem Oclgrind reported: ``kind`` (``out-of-bounds read``, ``out-of-bounds write``, ``data race``
    with its flavour, or Oclgrind's own first line), the kernel, the OpenCL ``cl_line`` and the ``msl_line`` it
    maps to (None: not known), and Oclgrind's ``text``."""

    kind: str
    kernel: str
    cl_line: int | None
    msl_line: int | None
    text: str


_HEAD = re.compile(r"^(Invalid (read|write) of size \d+|(\w+-\w+) data race|Work-group divergence|"
                   r"Uninitialized value|Invalid [\w ]+|Unaligned [\w ]+)", re.M)
_LINE = re.compile(r"At line (\d+)(?: \(column (\d+)\))?")
_KERNEL = re.compile(r"Kernel: (\w+)")


def parse_reports(text: str, translation: Translation | None = None, msl: str = "") -> list[Report]:
    """The problems in Oclgrind's output ``text``, in order. A report starts at a line such as ``Invalid read of
    size 4 at global memory address 0x...`` or ``Write-write data race at ...`` and runs to the next blank line;
    its ``At line N (column C) of input.cl`` is mapped to the MSL line through ``translation`` (the first column
    of that line that comes from the MSL when no column is given)."""
    starts = [m.start() for m in _HEAD.finditer(text)]
    out = []
    for a, b in zip(starts, starts[1:] + [len(text)]):
        block = text[a:b].split("\n\n")[0].strip()
        head = _HEAD.match(block)
        assert head is not None
        if head.group(2):
            kind = f"out-of-bounds {head.group(2)}"
        elif head.group(3):
            kind = f"data race ({head.group(3).lower()})"
        else:
            kind = head.group(1)
        kernel = _KERNEL.search(block)
        at = _LINE.search(block)
        cl_line = int(at.group(1)) if at else None
        msl_line = None
        if at and translation is not None:
            assert cl_line is not None
            width = len(translation.source.split("\n")[cl_line - 1]) if cl_line <= translation.source.count("\n") + 1 \
                else 0
            cols = [int(at.group(2))] if at.group(2) else list(range(1, width + 1))
            for col in cols:
                pos = translation.msl_position(cl_line, col)
                if pos is not None:
                    msl_line = pos[0]
                    break
        out.append(Report(kind, kernel.group(1) if kernel else "", cl_line, msl_line, block))
    return out


def check_kernel(msl: str, function: str, bindings: dict[int, tuple[np.ndarray, int]],
                 grid: tuple[int, int, int], threadgroup: tuple[int, int, int], *, timeout_s: float = 120.0,
                 children: set[subprocess.Popen[bytes]] | None = None) -> None:
    """Run kernel ``function`` of the MSL library ``msl`` on Oclgrind (module docstring) with copies of
    ``bindings`` (Metal buffer index -> (storage bytes as a uint8 array, byte offset)), ``grid`` threadgroups of
    ``threadgroup`` threads. Returns when Oclgrind reported nothing.

    Raises ``KernelCheckError`` for the first problem it reports (naming the kernel, the MSL line and the kind),
    ``NoDeviceError`` when Oclgrind is not installed or its device cannot be used, ``TimeoutError`` when the child
    has not finished after ``timeout_s`` seconds (it is killed: nothing waits forever). ``children``: a set the
    child process is in while it runs (``CheckedRuns.stop`` kills those of one device)."""
    if not available():
        raise NoDeviceError(f"checked kernels need Oclgrind ({OCLGRIND_ICD} is missing: install Debian's package "
                            "oclgrind, `make oclgrind`)")
    request = (msl, function, {i: (bytes(s.tobytes()), int(off)) for i, (s, off) in bindings.items()},
               tuple(grid), tuple(threadgroup))
    with tempfile.TemporaryDirectory(prefix="mtlir-oclgrind-") as vendors:
        Path(vendors, "oclgrind.icd").write_text(f"{OCLGRIND_ICD}\n")
        env = dict(os.environ, OCL_ICD_VENDORS=vendors, OCLGRIND_DATA_RACES="1", PYTHONSAFEPATH="1")
        env.pop("OCLGRIND_UNIFORM_WRITES", None)
        returncode, stdout, stderr = _Child(env, children).run(pickle.dumps(request), function, timeout_s)
    if returncode != 0:
        tail = stderr.decode("utf-8", "replace")[-2000:]
        raise NoDeviceError(f"Oclgrind could not run kernel {function!r} (exit {returncode}): {tail}")
    captured = pickle.loads(stdout)
    assert isinstance(captured, str)
    translation = translate(msl, bounds_checks=False)
    info = translation.kernels.get(function)
    cl_function = function if info is None else info.opencl_function  # Oclgrind names the OpenCL kernel
    reports = [r for r in parse_reports(captured, translation, msl) if r.kernel in ("", function, cl_function)]
    if reports:
        raise _error(reports[0], function, msl, len(reports))


_LIVE: set[subprocess.Popen[bytes]] = set()  # the children running now, killed at interpreter exit
_LIVE_LOCK = threading.Lock()
_PARENT_ENV = "MTLIR_OCLGRIND_PARENT"  # the parent's pid, for the child's check that it has not gone already
_REAP_S = 5.0  # how long a killed child is waited for (SIGKILL ends it at once unless the kernel holds it)


class _Child:
    """One run of the child (``_serve``) with environment ``env``: the request on its stdin, its pickled output on
    stdout, Oclgrind's complaints about itself on stderr. It never outlives the parent (module docstring)."""

    def __init__(self, env: dict[str, str], children: set[subprocess.Popen[bytes]] | None = None) -> None:
        self.env = dict(env, **{_PARENT_ENV: str(os.getpid())})
        self.children = children

    def run(self, request: bytes, function: str, timeout_s: float) -> tuple[int, bytes, bytes]:
        """Run the child on ``request`` within ``timeout_s`` seconds: (exit status, stdout, stderr). Raises
        ``TimeoutError`` naming kernel ``function`` when it has not finished by then; the child is killed then and
        on any exception (``KeyboardInterrupt`` too) before it propagates."""
        watch_r, watch_w = os.pipe()  # the parent holds the write end (close-on-exec: no other child inherits it)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "mtlir.runtime.sim.kernels.oclgrind", str(watch_r)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self.env, pass_fds=(watch_r,), start_new_session=True)
        except BaseException:
            os.close(watch_w)
            raise
        finally:
            os.close(watch_r)
        with _LIVE_LOCK:
            _LIVE.add(proc)
            if self.children is not None:
                self.children.add(proc)
        try:
            stdout, stderr = proc.communicate(request, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"Oclgrind did not finish kernel {function!r} in {timeout_s:g} s (its check was "
                               "stopped)") from None
        finally:
            _kill(proc)
            os.close(watch_w)
            if self.children is not None:
                with _LIVE_LOCK:
                    self.children.discard(proc)
        return proc.returncode, stdout, stderr


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` if it still runs and reap it (waiting at most ``_REAP_S`` seconds)."""
    with _LIVE_LOCK:
        _LIVE.discard(proc)
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(timeout=_REAP_S)
        except subprocess.TimeoutExpired:
            pass  # SIGKILL was sent: the kernel ends it; nothing waits forever


@atexit.register
def _kill_live() -> None:
    """At interpreter exit: kill the children still running (a GPU worker thread may be waiting for one)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _kill(proc)


def _die_with_parent(watch_fd: int) -> None:
    """In the child: end when the parent ends. On Linux the kernel sends SIGKILL when the parent thread that started
    it exits (``prctl(PR_SET_PDEATHSIG)``; a parent already gone is seen through ``getppid``); everywhere a daemon
    thread waits for the end of file of the pipe whose write end the parent holds, and leaves with ``os._exit``."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1 (linux/prctl.h)
        except (OSError, AttributeError):
            pass  # the pipe below still ends the child
    if os.environ.get(_PARENT_ENV) not in (None, str(os.getppid())):
        os._exit(70)  # the parent ended before the guard was set

    def watch() -> None:
        while os.read(watch_fd, 1):
            pass
        os._exit(70)
    threading.Thread(target=watch, name="mtlir-oclgrind-parent-watch", daemon=True).start()


def _error(r: Report, function: str, msl: str, count: int) -> KernelCheckError:
    lines = msl.split("\n")
    where = (f"MSL line {r.msl_line}: `{lines[r.msl_line - 1].strip()}`"
             if r.msl_line is not None and 0 < r.msl_line <= len(lines) else "no MSL line known")
    more = f" (and {count - 1} more reports)" if count > 1 else ""
    return KernelCheckError(f"kernel {function!r}: {r.kind} at {where}{more}; Oclgrind: "
                            f"{r.text.splitlines()[0]}", function=function, kind=r.kind, msl_line=r.msl_line,
                            report=r.text)


def check_launch(msl: str, launch: Any, timeout_s: float = 120.0,
                 children: set[subprocess.Popen[bytes]] | None = None) -> None:
    """The checked-mode hook of the kernel runner: ``check_kernel`` for one ``Launch`` (its kernel, bindings as
    they are on the host now, and its OpenCL sizes turned back into threadgroups), within ``timeout_s`` seconds."""
    local = tuple(launch.local_size) + (1,) * (3 - len(launch.local_size))
    glob = tuple(launch.global_size) + (1,) * (3 - len(launch.global_size))
    grid = tuple(g // t for g, t in zip(glob, local))
    check_kernel(msl, launch.ck.function, launch.bindings, grid, local, timeout_s=timeout_s, children=children)


def _msl_of(runner: Any, ck: Any) -> str:
    """The MSL library the runner compiled ``ck`` from (its cache is keyed by (MSL, function))."""
    for (msl, _), compiled in list(runner._kernels.items()):
        if compiled is ck:
            return str(msl)
    raise KeyError(f"kernel {ck.function!r} was not compiled by this runner")


def launch_key(msl: str, launch: Any) -> tuple[Any, ...]:
    """What makes two launches the same for a check (module docstring): the MSL, the kernel, the OpenCL sizes and,
    for each bound buffer, its index, byte offset, size in bytes and a BLAKE2b digest of its bytes now."""
    buffers = tuple((i, int(off), int(store.nbytes), hashlib.blake2b(np.ascontiguousarray(store).data).digest())
                    for i, (store, off) in sorted(launch.bindings.items()))
    return (msl, launch.ck.function, tuple(launch.global_size), tuple(launch.local_size), buffers)


class CheckedRuns:
    """The kernel runner's checked-mode hook for SimDevice ``dev`` (``KernelRunner.checker``): each launch of a
    batch runs alone, after ``check_launch`` on Oclgrind with the host data as it is then (the runner syncs first,
    so a launch sees what the one before it wrote), unless this device checked the same launch (``launch_key``)
    before. A check's time limit is ``dev.check_timeout_s`` where the device has one (seconds; ``mtlir run`` sets
    it to ``--timeout``), else ``CHECK_TIMEOUT_S``: not the runner's ``timeout_s``, a real device's limit, since
    Oclgrind interprets the kernel, many times slower. While launch ``k`` is checked and runs, the runner's
    ``checking`` is ``k``, so a wait that times out names it (``SimDevice.running_kernel``). A
    ``KernelCheckError`` is handed to ``dev.defer_error``, so the host's next message to the device raises it, and
    raised: the command buffer ends in status Error; a check past its time limit raises ``TimeoutError`` naming
    the kernel. ``stop()`` (``SimDevice.close``) kills the device's checks in flight: the check then raises
    ``TimeoutError`` saying the device was closed."""

    def __init__(self, dev: Any) -> None:
        self.dev = dev
        self.checked: set[tuple[Any, ...]] = set()
        self.children: set[subprocess.Popen[bytes]] = set()  # this device's Oclgrind children running now
        self.stopped = False

    def stop(self) -> None:
        """Kill this device's Oclgrind children still running (reaped, at most ``_REAP_S`` seconds each)."""
        self.stopped = True
        with _LIVE_LOCK:
            live = list(self.children)
        for proc in live:
            _kill(proc)

    def __call__(self, runner: Any, launches: Sequence[Any], timeout_s: float, keep: bool) -> Any:
        limit = float(getattr(self.dev, "check_timeout_s", None) or CHECK_TIMEOUT_S)
        hook, runner.checker = runner.checker, None
        try:
            for k, launch in enumerate(launches):
                runner.checking = k
                runner.sync()
                msl = _msl_of(runner, launch.ck)
                key = launch_key(msl, launch)
                if key not in self.checked:
                    if self.stopped:
                        raise TimeoutError(f"the check of kernel {launch.ck.function!r} was not run: the SimDevice "
                                           "was closed")
                    try:
                        check_launch(msl, launch, limit, self.children)
                    except KernelCheckError as e:
                        self.dev.defer_error(e)
                        raise
                    except NoDeviceError:
                        if self.stopped:
                            raise TimeoutError(f"the check of kernel {launch.ck.function!r} was stopped: the "
                                               "SimDevice was closed") from None
                        raise
                    self.checked.add(key)
                fault = runner.run_batch([launch], timeout_s, keep)
                if fault is not None:
                    return k + fault[0], fault[1]
            return None
        finally:
            runner.checker, runner.checking = hook, None


def _serve() -> None:
    """The child (``python -m mtlir.runtime.sim.kernels.oclgrind WATCH_FD``): run one request from stdin on
    Oclgrind's device, print what it wrote to fd 2 (pickled); it ends when its parent ends (``_die_with_parent``
    on the pipe ``WATCH_FD``)."""
    if len(sys.argv) > 1:
        _die_with_parent(int(sys.argv[1]))
    import pyopencl as cl  # the ICD loader sees Oclgrind only (OCL_ICD_VENDORS)

    from mtlir.runtime.sim.kernels.stderr import _native_stderr

    msl, function, bindings, grid, tg = pickle.loads(sys.stdin.buffer.read())
    devices = [d for p in cl.get_platforms() for d in p.get_devices() if "oclgrind" in p.name.lower()]
    if not devices:
        raise SystemExit("no Oclgrind platform")
    ctx = cl.Context(devices[:1])
    queue = cl.CommandQueue(ctx)
    translation = translate(msl, bounds_checks=False)
    info = translation.kernels[function]
    from mtlir.runtime.sim.kernels.runner import BUILD_OPTIONS
    from mtlir.runtime.sim.kernels.stderr import _Captured
    captured: _Captured | None = None
    try:
        with _native_stderr() as captured:
            # the runner's options, unoptimized: LLVM's optimizer turns a rotate written as shifts ((x << 13) + (x >>
            # 19), tinygrad's random numbers) into llvm.fshl, which Oclgrind cannot run ("Undefined external
            # function"); unoptimized IR also keeps every access the kernel writes for the checks to see
            program = cl.Program(ctx, translation.source).build(options=[*BUILD_OPTIONS, "-cl-opt-disable"])
            kernel = cl.Kernel(program, info.opencl_function)
            mf = cl.mem_flags
            args: list[Any] = []
            block = np.zeros(3 * max(1, len(info.bindings)), np.uint64)
            for b in info.bindings:
                data, offset = bindings[b.arg.index]
                host = np.frombuffer(data, np.uint8).copy()
                args.append(cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host))
                block[3 * b.slot], block[3 * b.slot + 2] = offset, host.nbytes
            args.append(cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=block))
            args.append(cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.zeros(_FAULT_WORDS, np.uint32)))
            if info.simd:
                from mtlir.runtime.sim.msl.simd import scratch_bytes
                args.append(cl.LocalMemory(scratch_bytes(tg[0] * tg[1] * tg[2])))
            kernel.set_args(*args)
            cl.enqueue_nd_range_kernel(queue, kernel, tuple(g * t for g, t in zip(grid, tg)), tuple(tg))
            queue.finish()
    except cl.Error as e:  # Oclgrind's own complaint (printed on fd 2, captured) says why, not a traceback
        said = " ".join(line.strip() for line in (captured.text if captured else "").splitlines() if line.strip())
        sys.stderr.write(f"OpenCL on Oclgrind refused the kernel: {e}" + (f"; Oclgrind said: {said[:1500]}"
                                                                          if said else ""))
        raise SystemExit(1) from None
    assert captured is not None
    sys.stdout.buffer.write(pickle.dumps(captured.text))


if __name__ == "__main__":
    _serve()

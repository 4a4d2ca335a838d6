"""``mtlir run``: lower, link, submit ``--repeat`` times, read the output and compare it with the trace's.

``mtlir run TRACE.json [--device auto|sim|metal] [--arch ...] [--no-residency-set] [--no-icb] [--target ...]
[--faithful] [--viz DIR] [--repeat N] [--json] [--inject-fault SPEC ...]`` lowers, links, submits N times, reads the output and compares it
with the trace's expected output with the tolerance of its dtype (``mtlir.cli.compare``: exact for integers,
rtol 1e-4 / atol 1e-5 for float32, a few ulp for half). With ``--device metal`` the device is probed
first (``mtlir.runtime.probe``) and the submit lowered for what it offers (residency sets, ICBs); the flags can
only turn them off. ``--json``: one object ``{"match", "max_abs_err", "kernels", "messages_per_submit", "submits",
...}`` on stdout, everything else on stderr (``max_abs_err`` is null when the error is not a finite number,
``gpu_s_per_submit`` when the device reports a GPU time as not available). The time figures leave the first submit
out when there are more (its one-time costs: kernel builds at first launch; ``mtlir.cli.timing``) and say so; with
``--repeat 1`` they are the one submit's, labelled as including those costs. ``--html FILE`` writes the page of the
lowering with the run's result (``mtlir.cli.page``), ``--profile FILE`` the run as Chrome trace events
(``mtlir.cli.profile``). ``--inject-fault`` arms faults on the simulated device before link (``SimDevice.inject``,
docs/reliability.md).

The command is given its collaborators (``mtlir.cli.main.main`` passes the real ones, a test may pass others):
``lower_trace`` (``mtlir.cli.lower``), ``make_bridge`` (the device to run on), and for ``--device metal``
``metal_available`` and ``metal_bridge`` (whether this machine has Metal, and its ``MetalBridge``).
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, TextIO

from mtlir.cli.compare import Comparison, compare_output
from mtlir.cli.progress import activity, submit_bar, wanted
from mtlir.cli.report import EXIT_MATCH, EXIT_MISMATCH, UsageError
from mtlir.cli.timing import SubmitTiming, gpu_s_per_submit, submit_timing
from mtlir.cli.lower import LowerTrace, _lower, _path, _target, format_message, program_values, record_one_submit
from mtlir.ir.dtypes import dtypes

__all__ = ["compare_output", "Comparison", "gpu_s_per_submit", "cmd_run", "MakeBridge", "make_bridge", "metal_available",
           "metal_bridge"]

# make_bridge(kind, target, faithful, program, metal) -> (bridge, device name)
MakeBridge = Callable[[str, str, bool, Any, Any], tuple[Any, str]]


def metal_available() -> bool:
    """Whether this machine has Metal (``mtlir.runtime.metal.bridge.metal_available``, imported when asked)."""
    from mtlir.runtime.metal.bridge import metal_available as available
    return available()


def metal_bridge() -> Any:
    """A new ``MetalBridge`` (``mtlir.runtime.metal.bridge``, imported when asked)."""
    from mtlir.runtime.metal.bridge import MetalBridge
    return MetalBridge()


def _device_kind(kind: str, target: str, faithful: bool, available: Callable[[], bool]) -> str:
    """``--device`` resolved (auto: metal where ``available()`` says this machine has Metal, else sim) and checked
    against the other flags."""
    from mtlir.runtime.metal import bridge as mtl
    if kind == "auto":
        kind = "metal" if available() else "sim"
    if kind == "metal":
        if not available():
            raise UsageError(f"--device metal: {_why_no_metal()}")
        if faithful:
            raise UsageError("--faithful is a mode of the simulated device (--device sim)")
        if target != mtl.host_target():
            raise UsageError(f"--device metal runs this machine's ABI ({mtl.host_target()}), not --target {target}")
    return kind


def _why_no_metal() -> str:
    """Why this machine has no Metal, as the bridge says it (the library that did not load, from where:
    ``MTLIR_METAL_LIBS`` included), else the general ``NOT_AVAILABLE``."""
    from mtlir.errors import MtlirError
    from mtlir.runtime.metal.bridge import NOT_AVAILABLE, MetalBridge
    try:
        MetalBridge()
    except MtlirError as e:
        return str(e)
    return f"{NOT_AVAILABLE} (the libraries load but give no Metal device)"


def _open_metal(log: TextIO, open_bridge: Callable[[], Any]) -> tuple[Any, Any]:
    """The bridge ``open_bridge()`` makes (a MetalBridge) and what its device offers (``probe_device``); each
    missing capability is a note on ``log``, since the submit is then lowered without it."""
    from mtlir.runtime.probe import probe_device
    bridge = open_bridge()
    caps = probe_device(bridge)
    for note in caps.notes:
        print(f"mtlir: note: {note}: lowering without it", file=log)
    return bridge, caps


def make_bridge(kind: str, target: str, faithful: bool, program: Any, metal: Any = None) -> tuple[Any, str]:
    """The Bridge to run ``program`` on and the device's name: ``metal`` (the bridge ``_open_metal`` made) for
    ``kind == "metal"``, else a SimDevice for the device ``program`` was lowered for."""
    if kind == "metal":
        return metal, "metal"
    from mtlir.runtime.sim.device import SimDevice
    dev = program.device
    return (SimDevice(target, strict=not faithful, family=dev.family, residency_sets=dev.residency_set, icb=dev.icb),
            "sim (faithful)" if faithful else "sim")


def cmd_list_devices(out: TextIO, as_json: bool = False) -> int:
    """``mtlir run --list-devices``: one line per OpenCL device the simulated device can run kernels on
    (``kernels.devices.list_devices``: ``index: platform / device (type, version)``), what ``--opencl-device``
    takes; with ``as_json`` one JSON list of ``{"index": i, "device": "platform / device (type, version)"}``.
    Raises ``NoDeviceError`` (exit 2) when pyopencl or an OpenCL platform is missing."""
    from mtlir.runtime.sim.kernels.devices import list_devices
    lines = list_devices()
    if as_json:
        pairs = (line.split(": ", 1) for line in lines)
        print(json.dumps([{"index": int(i), "device": d} for i, d in pairs]), file=out)
        return 0
    for line in lines:
        print(line, file=out)
    return 0


def cmd_run(args: argparse.Namespace, out: TextIO, log: TextIO, *, lower_trace: LowerTrace, make_bridge: MakeBridge,
            metal_available: Callable[[], bool], metal_bridge: Callable[[], Any]) -> int:
    """``mtlir run``: lower (``lower_trace``), link, submit ``--repeat`` times on the bridge ``make_bridge`` gives,
    compare the output with the trace's. ``--device metal`` (or auto where ``metal_available()``) runs on the
    bridge ``metal_bridge()`` makes, probed first."""
    import numpy as np

    from mtlir.cli.profile import HostClock
    from mtlir.runtime import Session
    clock = HostClock(record=args.profile is not None)  # the host spans of --profile
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: at least one submit")
    target = _target(args)
    kind = _device_kind(args.device, target, args.faithful, metal_available)
    metal, caps = _open_metal(log, metal_bridge) if kind == "metal" else (None, None)
    show = wanted(log, args.json)  # progress on a terminal's stderr, never with --json (mtlir.cli.progress)
    args.submits_completed = 0  # what main reports when the run is interrupted (Ctrl-C)
    clock.start("lower")
    with activity("lowering", log, show):
        trace, lowered = _lower(args, log, target, lower_trace, caps)
    clock.stop()
    program = lowered.program
    values = program_values(program, trace, log)
    bridge, device_name = make_bridge(kind, target, args.faithful, program, metal)
    if getattr(args, "opencl_device", None) is not None:
        choose = getattr(bridge, "choose_opencl_device", None)
        if choose is None:
            raise UsageError(f"--opencl-device picks the OpenCL device of the simulated device; this run is on "
                             f"{device_name}")
        choose(args.opencl_device)
    _inject_faults(args, bridge, device_name)
    if hasattr(bridge, "kernel_timeout_s"):  # the kernel watchdog never cuts a kernel the run would wait for
        bridge.kernel_timeout_s = max(bridge.kernel_timeout_s, args.timeout)
    _order_and_checks(args, bridge, device_name)
    o = trace.output
    clock.start("link")
    s: Any = None
    try:
        with Session(program, bridge, initial=trace.initial_data(full=False), executor=args.executor,
                     timeout_s=args.timeout) as s:
            clock.stop()
            # what one submit sends, as `lower --json` records it; after the link, so what the device refuses (a
            # buffer above its maxBufferLength) is said by the device, not by the recording's host memory
            messages = record_one_submit(program, values, target, args.executor)
            first_host_s = 0.0
            restore: list[tuple[str, bytes]] | None = None
            with submit_bar(args.repeat, log, show) as bar:
                for i in range(args.repeat):
                    if i:  # each repeat replays the same work on the same inputs: not timed, in a span of its own
                        clock.start(f"restore {i}")
                        s.wait(timeout_s=args.timeout)
                        restore = _changed_buffers(s, trace) if restore is None else restore
                        for name, data in restore:
                            s.write(name, data)
                    clock.start(f"submit {i}")
                    s.submit(**values)
                    if i == 0:
                        first_host_s = s.host_s_total  # the first submit's, with its one-time costs
                    bar.update(1)
            clock.start("wait")
            s.wait(timeout_s=args.timeout)
            clock.stop()
            got = np.frombuffer(s.read(o.placeholder, o.offset, o.nbytes), dtype=dtypes.to_numpy(o.dtype))
            got = got.reshape(o.shape)
    except KeyboardInterrupt:
        # Session's exit has waited (a few seconds at most) for what was in flight: count what completed
        args.submits_completed = s.submits_completed if s is not None else 0
        _views_not_written(args, log, "the run was interrupted")
        raise
    except Exception as e:
        _views_not_written(args, log, f"the run failed ({type(e).__name__})")
        raise
    finally:
        close = getattr(bridge, "close", None)
        if close is not None:
            close()
        # a kernel that never ends (past --timeout) keeps its OpenCL queue: main() then leaves with os._exit
        args.kernel_stuck = bool(getattr(bridge, "kernel_running", False))
    timing = submit_timing(s.completed, s.host_s_total, first_host_s, s.submits)
    unfired = _faults_not_fired(bridge)
    for spec in unfired:
        print(f"mtlir: note: --inject-fault {spec} did not strike: the run never reached that command buffer or "
              "allocation", file=log)
    opencl = getattr(bridge, "opencl_device_name", None)  # the OpenCL device the simulated kernels ran on
    cmp = compare_output(got, o.expected_array())
    kernels = len(trace.dispatches)
    listing = log if args.json else out
    dev = program.device
    print(f"; one submit of {trace.workload} ({dev.family}, {target}, {device_name}"
          f"{'' if dev.residency_set else ', no residency set'}, {_path(program)}): "
          f"{len(messages)} messages", file=listing)
    for m in messages:
        print(format_message(m), file=listing)
    nan_text = f", {cmp.nan_mismatches} NaN positions differ" if cmp.nan_mismatches else ""
    result = "match" if cmp.match else f"MISMATCH in {cmp.mismatches} of {got.size} elements"
    tol_text = "" if cmp.match else f"; tolerance {cmp.describe_tolerance()}"
    print(f"kernels: {kernels}, messages per submit: {len(messages)}, submits: {s.submits}, "
          f"{timing.text(args.executor)}, "
          f"{f'OpenCL device: {opencl}, ' if opencl else ''}"
          f"result: {result} (max abs err {cmp.max_abs_err:.3g}{nan_text}{tol_text})", file=listing)
    checked = bool(getattr(args, "check_kernels", False))
    if checked:
        print("mtlir: note: --check-kernels: the GPU times include each kernel's check on Oclgrind (it runs inside "
              "the command buffer); run without it to time the kernels", file=log)
    if args.json:
        doc = {"match": cmp.match, "max_abs_err": cmp.json_error(), "mismatches": cmp.mismatches,
               "nan_mismatches": cmp.nan_mismatches, "kernels": kernels, "messages_per_submit": len(messages),
               "submits": s.submits, "workload": trace.workload, "arch": dev.family, "target": target,
               "residency_set": dev.residency_set, "icb": dev.icb, "path": _path(program), "device": device_name,
               "opencl_device": opencl, "executor": args.executor,
               "host_s_per_submit": timing.host_s_per_submit, "gpu_s_per_submit": timing.gpu_s_per_submit,
               "timed_submits": timing.timed_submits, "includes_first_submit": timing.includes_first_submit,
               "first_submit_host_s": timing.first_submit_host_s, "first_submit_gpu_s": timing.first_submit_gpu_s,
               "rtol": cmp.rtol, "atol": cmp.atol, "max_ulp_err": cmp.json_ulp_error(),
               "lower_s": lowered.seconds, "check_kernels": checked}
        if args.inject_fault:
            doc["faults_not_fired"] = unfired
        json.dump(doc, out, allow_nan=False)
        out.write("\n")
    _write_views(args, log, lowered, s, clock, messages, cmp, timing, device_name,
                 [d.kernel for d in trace.dispatches])
    return EXIT_MATCH if cmp.match else EXIT_MISMATCH


def _changed_buffers(s: Any, trace: Any) -> list[tuple[str, bytes]]:
    """The buffers of the trace that the first submit of Session ``s`` changed (read back after it completed), each
    with its initial contents (the trace's ``init``, zeros around it): what is written back before each later submit
    of ``--repeat``, so that every submit runs on the trace's inputs (a trace that updates its inputs in place, an
    SGD step, would otherwise compute on the previous submit's results). Buffers the submit left as they were
    (weights) are not rewritten."""
    initial = trace.initial_data(full=True)
    unused = set(trace.unused_buffers)
    changed: list[tuple[str, bytes]] = []
    for bid, b in trace.buffers.items():
        if bid in unused or b.placeholder not in s.linked.buffers:
            continue
        data = initial.get(b.placeholder) or bytes(b.size)
        if s.read(b.placeholder) != data:
            changed.append((b.placeholder, data))
    return changed


def _inject_faults(args: argparse.Namespace, bridge: Any, device_name: str) -> None:
    """``--inject-fault``: arm the faults on the simulated device before link (``SimDevice.inject``): link commits
    no command buffer, so K counts the command buffers the run commits from the first submit's first, on through
    later submits. ``UsageError`` on a device that cannot inject."""
    faults = getattr(args, "inject_fault", None) or []
    if not faults:
        return
    inject = getattr(bridge, "inject", None)
    if inject is None:
        close = getattr(bridge, "close", None)
        if close is not None:
            close()
        raise UsageError(f"--inject-fault injects faults on the simulated device (--device sim); this run is on "
                         f"{device_name}")
    inject(*faults)


def _order_and_checks(args: argparse.Namespace, bridge: Any, device_name: str) -> None:
    """``--order-seed N`` and ``--check-kernels``: the simulated device's ``order_seed`` and ``checked`` (set before
    link builds the first kernel). ``UsageError`` for a negative seed or on a device that is not simulated."""
    seed, checked = getattr(args, "order_seed", None), getattr(args, "check_kernels", False)
    if seed is None and not checked:
        return
    flag = "--order-seed" if seed is not None else "--check-kernels"
    if not hasattr(bridge, "order_seed"):
        close = getattr(bridge, "close", None)
        if close is not None:
            close()
        raise UsageError(f"{flag} is an option of the simulated device (--device sim); this run is on {device_name}")
    if seed is not None and seed < 0:
        raise UsageError(f"--order-seed {seed}: the seed is an int >= 0")
    if seed is not None:
        bridge.order_seed = seed
    if checked:
        from mtlir.runtime.sim.kernels.oclgrind import OCLGRIND_ICD, available
        if not available():
            raise UsageError(f"--check-kernels runs the kernels on Oclgrind, which is not installed ({OCLGRIND_ICD} "
                             "is missing: make oclgrind, or apt-get install oclgrind)")
        bridge.checked = True
        bridge.check_timeout_s = args.timeout  # a check on Oclgrind ends with the run's --timeout


def _faults_not_fired(bridge: Any) -> list[str]:
    """The ``--inject-fault`` faults that did not strike (a command buffer or allocation the run never reached)."""
    plan = getattr(bridge, "faults", None)
    return [f.spec() for f in getattr(plan, "armed", [])]


def _views_not_written(args: argparse.Namespace, log: TextIO, why: str) -> None:
    """Say that ``--html`` and ``--profile`` were not written: they describe a run, and there was none to show."""
    for flag, path in (("--html", getattr(args, "html", None)), ("--profile", getattr(args, "profile", None))):
        if path is not None:
            print(f"mtlir: note: {flag} {path} not written: {why}", file=log)


def _write_views(args: argparse.Namespace, log: TextIO, lowered: Any, s: Any, clock: Any, messages: list[Any],
                 cmp: Comparison, timing: SubmitTiming, device_name: str, kernels: list[str]) -> None:
    """``--html`` (the page of the lowering with the run's result, ``mtlir.cli.page``) and ``--profile`` (the
    Chrome trace of the run, ``mtlir.cli.profile``), each when asked."""
    program = lowered.program
    if args.html:
        from mtlir.cli.lower import record_setup
        from mtlir.cli.page import write_page
        result = {"match": cmp.match, "max_abs_err": cmp.max_abs_err, "mismatches": cmp.mismatches,
                  "submits": s.submits, "device": device_name, "host_s_per_submit": timing.host_s_per_submit,
                  "gpu_s_per_submit": timing.gpu_s_per_submit, "timed_submits": timing.timed_submits,
                  "includes_first_submit": timing.includes_first_submit}
        path = write_page(args.html, lowered, title=f"mtlir run {args.trace.name} ({program.device.family}, "
                          f"{program.target}, {device_name})", setup=record_setup(program, program.target),
                          messages=messages, result=result)
        print(f"mtlir: wrote {path}", file=log)
    if args.profile:
        from mtlir.cli.profile import chrome_trace, write_profile
        doc = chrome_trace(clock.spans, list(s.completed), clock.starts("submit"), kernels, origin_s=clock.origin,
                           metadata={"trace": str(args.trace), "device": device_name, "executor": args.executor})
        print(f"mtlir: wrote {write_profile(args.profile, doc)}", file=log)

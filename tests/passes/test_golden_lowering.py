"""Golden tests of the exact message sequence one submit sends (METAL.md §1), at the Program level and through the
runtime's RecordingBridge, for every combination: Apple7 vs Apple9, residency set or not, ICB or direct path,
symbolic sizes or not, timestamps or not, arm64 vs x86_64; from Python (``small_queue``) and from the traces."""
from __future__ import annotations

import itertools
import json

import pytest
from lowering_cases import TRACES, message_lines, small_queue

from mtlir.ir.dtypes import PtrDType, dtypes
from mtlir.metal import DeviceSpec
from mtlir.passes import lower
from mtlir.passes.timeline import timeline_read_program
from mtlir.passes.symbolic import simplifiable
from mtlir.frontend.trace import load_trace
from mtlir.program.instructions import Store

# ---- the blocks of METAL.md §1, literally (small_queue: saxpy(x, y[256:]), scale(y, z), saxpy(z, x))

PATCH_SYMBOLIC = ["icb[0] concurrentDispatchThreadgroups:threadsPerThreadgroup: * [32,1,1]"]
OPEN = ["queue commandBuffer", "cmdbuf retain", "cmdbuf computeCommandEncoder", "encoder waitForFence: fence"]
USE_RESOURCES = ["encoder useResources:count:usage: resources 4 3"]  # x, y, z and the variables buffer
WARMUP_SAXPY = ["encoder setComputePipelineState: pipeline:saxpy",
                "encoder dispatchThreadgroups:threadsPerThreadgroup: [0,0,0] [0,0,0]"]
WARMUP_SCALE = ["encoder setComputePipelineState: pipeline:scale",
                "encoder dispatchThreadgroups:threadsPerThreadgroup: [0,0,0] [0,0,0]"]
CLOSE = ["encoder updateFence: fence", "encoder endEncoding"]
SIGNAL = ["cmdbuf encodeSignalEvent:value: event timeline"]
COMMIT = ["cmdbuf commit"]


def direct(i: int, symbolic: bool) -> list[str]:
    """The direct path's messages of command ``i`` of small_queue."""
    return [
        ["encoder setComputePipelineState: pipeline:saxpy", "encoder setBuffer:offset:atIndex: buffer:x 0 0",
         "encoder setBuffer:offset:atIndex: buffer:y 256 1", "encoder setBytes:length:atIndex: contents:varbuf 4 2",
         f"encoder dispatchThreadgroups:threadsPerThreadgroup: {'*' if symbolic else '[4,1,1]'} [32,1,1]"],
        ["encoder setComputePipelineState: pipeline:scale", "encoder setBuffer:offset:atIndex: buffer:y 0 0",
         "encoder setBuffer:offset:atIndex: buffer:z 0 1",
         "encoder dispatchThreadgroups:threadsPerThreadgroup: [2,2,1] [16,2,1]"],
        ["encoder setComputePipelineState: pipeline:saxpy", "encoder setBuffer:offset:atIndex: buffer:z 0 0",
         "encoder setBuffer:offset:atIndex: buffer:x 0 1", "encoder setBytes:length:atIndex: contents:varbuf 4 2",
         "encoder dispatchThreadgroups:threadsPerThreadgroup: [8,1,1] [32,1,1]"],
    ][i]


def expected(family: str, residency: bool, icb: bool, symbolic: bool, timestamps: bool) -> list[str]:
    """The golden sequence of small_queue for one combination, assembled from the literal blocks above."""
    warm = family == "Apple7"
    res = [] if residency or not icb else USE_RESOURCES
    if icb:
        patches = PATCH_SYMBOLIC if symbolic else []
        if not timestamps:
            return (patches + OPEN + res + (WARMUP_SAXPY + WARMUP_SCALE if warm else [])
                    + ["encoder executeCommandsInBuffer:withRange: icb 0 3"] + CLOSE + SIGNAL + COMMIT)
        # profiled: one command buffer per command; the first two as a loop, the last one signals. Each encoder
        # lists only its command's buffers (+ the variables buffer) and warms up only its command's pipeline: in
        # the loop both are read per iteration from link-time tables ({iteration 0|iteration 1})
        loop_res = [] if residency else ["encoder useResources:count:usage: {resources:0|resources:1} {3|3} 3"]
        loop_warm = ["encoder setComputePipelineState: {pipeline:saxpy|pipeline:scale}", WARMUP_SAXPY[1]]
        loop = (["for 2"] + OPEN + loop_res + (loop_warm if warm else [])
                + ["encoder executeCommandsInBuffer:withRange: icb * 1"] + CLOSE + COMMIT + ["end"])
        last_res = [] if residency else ["encoder useResources:count:usage: resources:2 3 3"]  # z, x, variables
        last = (OPEN + last_res + (WARMUP_SAXPY if warm else [])
                + ["encoder executeCommandsInBuffer:withRange: icb 2 1"] + CLOSE + SIGNAL + COMMIT)
        return patches + loop + last
    if not timestamps:
        return OPEN + direct(0, symbolic) + direct(1, symbolic) + direct(2, symbolic) + CLOSE + SIGNAL + COMMIT
    return (OPEN + direct(0, symbolic) + CLOSE + COMMIT + OPEN + direct(1, symbolic) + CLOSE + COMMIT
            + OPEN + direct(2, symbolic) + CLOSE + SIGNAL + COMMIT)


COMBOS = list(itertools.product(("Apple7", "Apple9"), (True, False), (True, False), (False, True), (False, True),
                                ("arm64", "x86_64")))


def _id(c: tuple) -> str:
    fam, res, icb, sym, ts, target = c
    return "-".join([fam, "rs" if res else "nors", "icb" if icb else "direct", "sym" if sym else "const",
                     "ts" if ts else "nots", target])


@pytest.mark.parametrize("combo", COMBOS, ids=_id)
def test_every_combination(combo: tuple) -> None:
    family, residency, icb, symbolic, timestamps, target = combo
    device = DeviceSpec(family, residency_set=residency, icb=icb)
    program = lower(small_queue(device, symbolic=symbolic, timestamps=timestamps), target=target).program
    assert message_lines(program) == [_at_program_level(ln) for ln in expected(family, residency, icb, symbolic,
                                                                                timestamps)]
    assert program.target == target and program.device == device


def _at_program_level(line: str) -> str:
    """A golden line as the Program shows it: a value read per loop iteration ({a|b}) is a run-time value, ``*``."""
    return " ".join("*" if tok.startswith("{") else tok for tok in line.split())


def test_literal_apple7_icb_without_residency_set() -> None:
    """One combination written out whole, as METAL.md §1 lists the steps."""
    program = lower(small_queue(DeviceSpec("Apple7", residency_set=False), symbolic=True), target="arm64").program
    assert message_lines(program) == [
        "icb[0] concurrentDispatchThreadgroups:threadsPerThreadgroup: * [32,1,1]",  # 6: any time before the ICB runs
        "queue commandBuffer",                                                     # 1
        "cmdbuf retain",                                                           # kept for the runtime's checks
        "cmdbuf computeCommandEncoder",                                            # 2
        "encoder waitForFence: fence",                                             # 3
        "encoder useResources:count:usage: resources 4 3",                         # 4
        "encoder setComputePipelineState: pipeline:saxpy",                         # 5: each pipeline once
        "encoder dispatchThreadgroups:threadsPerThreadgroup: [0,0,0] [0,0,0]",
        "encoder setComputePipelineState: pipeline:scale",
        "encoder dispatchThreadgroups:threadsPerThreadgroup: [0,0,0] [0,0,0]",
        "encoder executeCommandsInBuffer:withRange: icb 0 3",                      # 7
        "encoder updateFence: fence",                                              # 8
        "encoder endEncoding",                                                     # 9
        "cmdbuf encodeSignalEvent:value: event timeline",                          # 10
        "cmdbuf commit",                                                           # 11
    ]


def test_literal_apple9_with_residency_set_is_ten_messages() -> None:
    program = lower(small_queue(DeviceSpec("Apple9")), target="x86_64").program
    assert message_lines(program) == [
        "queue commandBuffer", "cmdbuf retain", "cmdbuf computeCommandEncoder", "encoder waitForFence: fence",
        "encoder executeCommandsInBuffer:withRange: icb 0 3", "encoder updateFence: fence", "encoder endEncoding",
        "cmdbuf encodeSignalEvent:value: event timeline", "cmdbuf commit"]


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_struct_arguments_travel_per_target(target: str) -> None:
    """NSRange: two words on both targets; MTLSize: a pointer on arm64, by value on x86_64 (METAL.md §2)."""
    program = lower(small_queue(DeviceSpec("Apple7"), symbolic=True), target=target).program
    protos = {c.selector: c.proto for c in program.calls()}
    size = PtrDType(dtypes.MTLSize) if target == "arm64" else dtypes.MTLSize
    assert protos["dispatchThreadgroups:threadsPerThreadgroup:"].args == (dtypes.id, dtypes.SEL, size, size)
    assert protos["concurrentDispatchThreadgroups:threadsPerThreadgroup:"].args == (dtypes.id, dtypes.SEL, size, size)
    assert protos["executeCommandsInBuffer:withRange:"].args == (dtypes.id, dtypes.SEL, dtypes.id, dtypes.uint64,
                                                                  dtypes.uint64)
    assert protos["encodeSignalEvent:value:"].args == (dtypes.id, dtypes.SEL, dtypes.id, dtypes.uint64)
    kinds = {o.kind for o in program.objects.values()}
    assert ("struct" in kinds and "scratch" in kinds) == (target == "arm64")


def test_a_far_offset_goes_on_the_direct_path_with_a_diagnostic() -> None:
    lowered = lower(small_queue(DeviceSpec("Apple9"), far_offset=True), target="arm64")
    lines = message_lines(lowered.program)
    assert "encoder setBuffer:offset:atIndex: buffer:y 4294967552 1" in lines
    assert not any("executeCommandsInBuffer" in m for m in lines)
    assert len(lowered.diagnostics) == 1
    assert "command 0 (saxpy)" in lowered.diagnostics[0] and "0xFFFFFFFF" in lowered.diagnostics[0]


# ---- traces


def _warmups(lines: list[str]) -> list[str]:
    return [m.split()[-1] for m in lines if "setComputePipelineState:" in m]


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.json")), ids=lambda p: p.name.removesuffix(".json"))
def test_every_trace_warms_each_pipeline_once_in_first_use_order(path) -> None:
    trace = load_trace(path)
    first_use = list(dict.fromkeys(f"pipeline:{d.kernel}" for d in trace.dispatches))
    for family in ("Apple7", "Apple9"):
        lines = message_lines(lower(trace.queue(DeviceSpec(family)), target="arm64").program)
        assert _warmups(lines) == (first_use if family == "Apple7" else [])
        assert lines.count(f"encoder executeCommandsInBuffer:withRange: icb 0 {len(trace.dispatches)}") == 1


def test_mlp_deep_uses_one_pipeline_four_times_and_warms_it_once() -> None:
    trace = load_trace(TRACES / "mlp_deep.apple7.json")
    assert len(trace.dispatches) == 4 and len({d.kernel for d in trace.dispatches}) == 1
    program = lower(trace.queue(DeviceSpec("Apple7", residency_set=False)), target="arm64").program
    assert message_lines(program) == [
        "queue commandBuffer", "cmdbuf retain", "cmdbuf computeCommandEncoder", "encoder waitForFence: fence",
        "encoder useResources:count:usage: resources 7 3",  # buffers 6, 1, 2, 3, 4, 9, 5: no variables buffer
        "encoder setComputePipelineState: pipeline:r_16_64_16_4",
        "encoder dispatchThreadgroups:threadsPerThreadgroup: [0,0,0] [0,0,0]",
        "encoder executeCommandsInBuffer:withRange: icb 0 4", "encoder updateFence: fence", "encoder endEncoding",
        "cmdbuf encodeSignalEvent:value: event timeline", "cmdbuf commit"]
    res = next(o for o in program.objects.values() if o.kind == "resources")
    assert res.payload == ("buffer:6", "buffer:1", "buffer:2", "buffer:3", "buffer:4", "buffer:9", "buffer:5")


def test_symbolic_kv_sets_the_two_symbolic_grids_per_submit() -> None:
    trace = load_trace(TRACES / "symbolic_kv.apple7.json")
    program = lower(trace.queue(), target="x86_64").program
    lines = message_lines(program)
    assert lines[:3] == ["icb[0] concurrentDispatchThreadgroups:threadsPerThreadgroup: * [16,1,1]",
                         "icb[3] concurrentDispatchThreadgroups:threadsPerThreadgroup: * [1,1,1]",
                         "queue commandBuffer"]
    assert _warmups(lines) == ["pipeline:r_start_pos_16", "pipeline:r_start_pos", "pipeline:r_start_pos_v2",
                               "pipeline:E_start_pos", "pipeline:r_4_4_start_pos"]
    assert set(program.variables) == {"start_pos", "timeline"}
    # the variable's value is patched into the one variables buffer before anything runs
    assert any(type(i) is Store and i.value == program.variables["start_pos"][0]
               for i in program.instrs[:program.patch_end()])


def test_cnn_apple9_with_residency_set_sends_the_same_few_messages() -> None:
    trace = load_trace(TRACES / "cnn.apple9.json")
    lines = message_lines(lower(trace.queue(), target="arm64").program)
    assert lines == ["queue commandBuffer", "cmdbuf retain", "cmdbuf computeCommandEncoder",
                     "encoder waitForFence: fence", f"encoder executeCommandsInBuffer:withRange: icb 0 "
                     f"{len(trace.dispatches)}", "encoder updateFence: fence", "encoder endEncoding",
                     "cmdbuf encodeSignalEvent:value: event timeline", "cmdbuf commit"]


# ---- through the runtime's RecordingBridge: loops unrolled, values evaluated, objects by name

import mtlir.runtime as runtime  # noqa: E402  (plain: an import regression must fail, not skip)


def _record(program, **values):  # type: ignore[no-untyped-def]
    bridge = runtime.RecordingBridge(target=program.target)
    with runtime.Session(program, bridge) as s:
        return s.record_submit(**values)


def test_recorded_symbolic_kv_is_the_same_on_both_targets() -> None:
    trace = load_trace(TRACES / "symbolic_kv.apple7.json")
    records = [_record(lower(trace.queue(), target=t).program, start_pos=7, timeline=3) for t in ("arm64", "x86_64")]
    assert records[0] == records[1]
    assert json.loads(json.dumps(records[0])) == records[0]  # plain JSON, as `mtlir lower --json` prints it
    assert [(m["receiver"], m["selector"], m["args"]) for m in records[0]] == [
        ("icb[0]", "concurrentDispatchThreadgroups:threadsPerThreadgroup:", [[7, 1, 1], [16, 1, 1]]),
        ("icb[3]", "concurrentDispatchThreadgroups:threadsPerThreadgroup:", [[7, 1, 1], [1, 1, 1]]),
        ("queue", "commandBuffer", []),
        *[(m["receiver"], "retain", []) for m in records[0][3:4]],
        *[(m["receiver"], "computeCommandEncoder", []) for m in records[0][4:5]],
        (records[0][5]["receiver"], "waitForFence:", ["fence"]),
        *[(records[0][5]["receiver"], sel, args) for k in ("r_start_pos_16", "r_start_pos", "r_start_pos_v2",
                                                            "E_start_pos", "r_4_4_start_pos")
          for sel, args in (("setComputePipelineState:", [f"pipeline:{k}"]),
                            ("dispatchThreadgroups:threadsPerThreadgroup:", [[0, 0, 0], [0, 0, 0]]))],
        (records[0][5]["receiver"], "executeCommandsInBuffer:withRange:", ["icb", [0, 5]]),
        (records[0][5]["receiver"], "updateFence:", ["fence"]),
        (records[0][5]["receiver"], "endEncoding", []),
        (records[0][3]["receiver"], "encodeSignalEvent:value:", ["event", 3]),
        (records[0][3]["receiver"], "commit", []),
    ]


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_recorded_profiled_submit_unrolls_one_command_buffer_per_command(target: str) -> None:
    program = lower(small_queue(DeviceSpec("Apple9"), timestamps=True), target=target).program
    msgs = _record(program, n=100, timeline=1)
    sels = [m["selector"] for m in msgs]
    assert sels.count("commandBuffer") == sels.count("commit") == 3
    ranges = [m["args"][1] for m in msgs if m["selector"] == "executeCommandsInBuffer:withRange:"]
    assert ranges == [[0, 1], [1, 1], [2, 1]]
    assert [m["args"] for m in msgs if m["selector"] == "encodeSignalEvent:value:"] == [["event", 1]]
    assert sels.index("encodeSignalEvent:value:") > max(i for i, s in enumerate(sels) if s == "commandBuffer")


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_recorded_direct_path_binds_every_argument(target: str) -> None:
    program = lower(small_queue(DeviceSpec("Apple7", icb=False), symbolic=True), target=target).program
    msgs = [(m["selector"], m["args"]) for m in _record(program, n=100, timeline=9)]
    assert ("dispatchThreadgroups:threadsPerThreadgroup:", [[4, 1, 1], [32, 1, 1]]) in msgs  # (100 + 31) // 32
    assert ("setBuffer:offset:atIndex:", ["buffer:y", 256, 1]) in msgs
    assert [s for s, _ in msgs].count("setBytes:length:atIndex:") == 2
    assert not any(s in ("useResources:count:usage:", "executeCommandsInBuffer:withRange:") for s, _ in msgs)


def _records_of(lines: list[str], n: int, timeline: int) -> list[tuple[str, str, list]]:
    """The golden lines as RecordingBridge records: loops unrolled, ``*`` evaluated (the loop counter in an
    NSRange, small_queue's symbolic grid ``(n + 31) // 32`` in an MTLSize), numbers as ints, structs as lists."""
    from mtlir.metal import SELECTORS

    def value(tok: str, i: int | None) -> object:
        if tok == "*":
            return i
        if tok.startswith("{"):  # one value per loop iteration
            return value(tok[1:-1].split("|")[i or 0], i)
        if tok == "timeline":
            return timeline
        return int(tok) if tok.lstrip("-").isdigit() else tok

    def record(line: str, i: int | None) -> tuple[str, str, list]:
        recv, sel, *toks = line.split()
        it, args = iter(toks), []
        for dt in SELECTORS[sel].args:
            if dt is dtypes.NSRange:
                args.append([value(next(it), i), value(next(it), i)])
            elif dt is dtypes.MTLSize:
                tok = next(it)
                args.append([(n + 31) // 32, 1, 1] if tok == "*" else [int(v) for v in tok.strip("[]").split(",")])
            else:
                args.append(value(next(it), i))
        return recv, sel, args

    out, k = [], 0
    while k < len(lines):
        if lines[k].startswith("for "):
            end = lines.index("end", k)
            out += [record(ln, i) for i in range(int(lines[k].split()[1])) for ln in lines[k + 1:end]]
            k = end + 1
        else:
            out.append(record(lines[k], None))
            k += 1
    return out


@pytest.mark.parametrize("combo", COMBOS, ids=_id)
def test_every_combination_through_the_recording_bridge(combo: tuple) -> None:
    """What one submit really sends, as `mtlir lower --json` reports it: the golden, unrolled and evaluated."""
    family, residency, icb, symbolic, timestamps, target = combo
    device = DeviceSpec(family, residency_set=residency, icb=icb)
    program = lower(small_queue(device, symbolic=symbolic, timestamps=timestamps), target=target).program
    got = [(m["receiver"], m["selector"], m["args"]) for m in _record(program, n=100, timeline=5)]
    assert got == _records_of(expected(family, residency, icb, symbolic, timestamps), n=100, timeline=5)


def _example():  # type: ignore[no-untyped-def]
    import importlib.util
    path = TRACES.parents[1] / "examples" / "saxpy_reduce.py"
    spec = importlib.util.spec_from_file_location("saxpy_reduce", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_queue(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    ex = _example()
    program = lower(ex.build_queue(DeviceSpec("Apple7", residency_set=False)), target="arm64").program
    assert message_lines(program) == [
        "icb[0] concurrentDispatchThreadgroups:threadsPerThreadgroup: * [64,1,1]",
        "icb[1] concurrentDispatchThreadgroups:threadsPerThreadgroup: * [64,1,1]",
        *OPEN, "encoder useResources:count:usage: resources 5 3",  # y, x, params, out, the variables buffer
        "encoder setComputePipelineState: pipeline:saxpy",
        "encoder dispatchThreadgroups:threadsPerThreadgroup: [0,0,0] [0,0,0]",
        "encoder setComputePipelineState: pipeline:block_sum",
        "encoder dispatchThreadgroups:threadsPerThreadgroup: [0,0,0] [0,0,0]",
        "encoder executeCommandsInBuffer:withRange: icb 0 2", *CLOSE, *SIGNAL, *COMMIT]
    assert ex.main(["--family", "apple9", "--target", "x86_64"]) == 0
    out = capsys.readouterr().out
    assert "[encoder executeCommandsInBuffer:withRange: icb, 0, 2]" in out and "setComputePipelineState" not in out
    import shutil
    if shutil.which("dot"):
        assert ex.main(["--viz", str(tmp_path)]) == 0
        assert sorted(p.name for p in tmp_path.iterdir()) == ["00-input.svg", "01-encode.svg", "02-barriers.svg",
                                                               "03-abi.svg", "04-linearize.txt"]


@pytest.mark.parametrize("device, target", [
    (DeviceSpec("Apple7", residency_set=False), "arm64"), (DeviceSpec("Apple9"), "x86_64"),
    (DeviceSpec("Apple8", icb=False), "arm64")], ids=["apple7-icb-useresources", "apple9-icb-residency", "direct"])
def test_every_path_computes_the_same_on_the_simulated_device(device: DeviceSpec, target: str) -> None:
    """Beyond the message goldens: the lowered program really runs. A constant variable (link-time init of the
    variables buffer), a variable, timestamps (one command buffer per command), a rebound input buffer."""
    import numpy as np
    import mtlir.runtime.sim.device as sim
    from mtlir.frontend.nodes import buffer, buffer_variable, timeline_value, view
    from mtlir.frontend.queue import Queue
    from mtlir.ir.uop import UOp
    ex = _example()
    x2, y = buffer("x2", 4 * ex.MAX_N), buffer("y", 4 * ex.MAX_N)
    params, out = buffer("params", 256), buffer("out", 4 + 256)  # a first sum, then up to 64 (BLOCK_SUM's elements)
    n, inp = UOp.variable("n", 1, ex.MAX_N), buffer_variable("inp")
    q = Queue(device)
    q.timestamp(0).exec(ex.BLOCK_SUM, [out, x2], [64], grid=(1,), threadgroup=(64,)).timestamp(1)
    q.exec(ex.SAXPY, [y, inp, view(params, 0, 4)], [n], grid=((n + 63) // 64,), threadgroup=(64,))
    q.exec(ex.BLOCK_SUM, [view(out, 4, 256), y], [n], grid=((n + 63) // 64,), threadgroup=(64,)).timestamp(2)
    q.signal(q.timeline, timeline_value())
    program = lower(q.submit(), target=target).program
    rng = np.random.default_rng(3)
    x2s, ys = (rng.standard_normal(ex.MAX_N).astype(np.float32) for _ in range(2))
    init = {"buffer:x2": x2s.tobytes(), "buffer:y": ys.tobytes(),
            "buffer:params": np.float32(3).tobytes() + bytes(252)}
    with sim.SimDevice(target, family=device.family, residency_sets=device.residency_set, icb=device.icb) as dev, \
            runtime.Session(program, dev, initial=init, timeout_s=60) as s:
        want_y = ys.copy()
        for count, src in ((1000, "buffer:x2"), (130, "buffer:y")):  # the input rebound per submit: y = 3 * y + y
            data = x2s if src == "buffer:x2" else want_y.copy()
            s.submit(n=count, inp=s.linked.handles[src])
            (done,) = s.wait(timeout_s=60)
            want_y[:count] = 3 * data[:count] + want_y[:count]
            blocks = -(-count // 64)
            sums = [want_y[b * 64:min((b + 1) * 64, count)].sum() for b in range(blocks)]
            np.testing.assert_allclose(np.frombuffer(s.read("buffer:y"), np.float32), want_y, rtol=1e-5, atol=1e-5)
            got = np.frombuffer(s.read("buffer:out", 0, 4 * (1 + blocks)), np.float32)
            np.testing.assert_allclose(got, [x2s[:64].sum(), *sums], rtol=1e-4, atol=1e-4)
            assert len(done.cbs) == 3 and all(0 < a <= b for a, b in done.gpu_times)


def test_every_pass_of_the_default_pipeline_changes_every_real_queue() -> None:
    """The traces and the example, on every path: each pass of the default pipeline changes the graph, and encode
    leaves nothing for symbolic to fold (why the default pipeline runs it only on graphs built by other means).
    Each Program carries the timeline read lowered for its device and target."""
    ex = _example()
    queues = [(path.stem, load_trace(path)) for path in sorted(TRACES.glob("*.json"))]
    cases = [(name, t.queue(DeviceSpec(t.arch, residency_set=rs, icb=icb)))
             for name, t in queues for rs, icb in itertools.product((True, False), repeat=2)]
    cases += [(f"saxpy_reduce {family}", ex.build_queue(DeviceSpec(family, residency_set=rs, icb=icb)))
              for family in ("Apple7", "Apple9") for rs, icb in itertools.product((True, False), repeat=2)]
    assert len(cases) == 56
    for i, (name, queue) in enumerate(cases):
        target = ("arm64", "x86_64")[i % 2]
        lowered = lower(queue, target=target)
        passes = ["encode", "barriers", "abi", "linearize"] if queue.arg.icb else ["encode", "abi", "linearize"]
        assert [n for n, _ in lowered.stages] == ["input", *passes], name
        assert not any(lowered.unchanged(j) for j in range(len(lowered.stages))), name
        assert not simplifiable(lowered.stages[1][1]), name  # type: ignore[arg-type]
        program = lowered.program
        assert program.timeline_read is not None, name
        assert program.timeline_read.listing() == timeline_read_program(program.device, target).listing(), name

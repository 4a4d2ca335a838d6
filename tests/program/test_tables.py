"""The payloads of a stage as text (issue 15): the ICB table (pipeline, bindings with offsets, grid, threadgroup,
barrier, what a submit patches) and the messages of MSGS/CALLS nodes, for graphs and Programs."""
from __future__ import annotations

import pytest

from mtlir.ir.render import listing
from mtlir.metal import DeviceSpec
from mtlir.passes import lower
from mtlir.program.payloads import CommandList, IcbCommand, IcbSpec
from mtlir.program.tables import describe, icb_rows, icb_table
from lowering_cases import small_queue


def _spec() -> IcbSpec:
    cmds = CommandList((
        IcbCommand("pipeline:a", (("buffer:x", 0, 0), ("buffer:y", 256, 1), ("varbuf", 0, 2)), (0, 1, 1), (32, 1, 1),
                   barrier=True, symbolic=True, variables=(("n", 2),)),
        IcbCommand("pipeline:b", (("buffer:y", 0, 0),), (4, 2, 1), (8, 8, 1), barrier=False, rebound=(1,)),
    ))
    return IcbSpec(cmds, (), (), 3)


def test_icb_rows_name_every_column() -> None:
    rows = icb_rows(_spec())
    assert rows[0] == ("0", "pipeline:a", "buffer:x+0@0 buffer:y+256@1 varbuf+0@2", "[?, 1, 1]", "[32, 1, 1]", "yes",
                       "grid, n (varbuf @2)")
    assert rows[1] == ("1", "pipeline:b", "buffer:y+0@0", "[4, 2, 1]", "[8, 8, 1]", "no", "buffer @1 (rebound)")


def test_icb_table_is_aligned_under_its_header() -> None:
    lines = icb_table(_spec(), "icb").splitlines()
    assert lines[0] == "; ICB icb: 2 commands, max kernel buffer bind count 3"
    assert lines[1].split()[1:3] == ["#", "pipeline"]
    col = lines[1].index("grid")
    assert lines[2][col:].startswith("[?, 1, 1]") and lines[3][col:].startswith("[4, 2, 1]")


def test_describe_spells_out_what_the_listing_only_counts() -> None:
    lowered = lower(small_queue(DeviceSpec("Apple7")), target="arm64")
    encoded = lowered.stages[1][1]
    assert "MessageList(<" in listing(encoded)  # the compact listing counts them ...
    text = describe(encoded)                     # ... describe lists them
    assert "; messages of %" in text and "[%" in text and "setComputePipelineState: %" in text
    assert "; ICB icb: 3 commands" in text
    program_text = describe(lowered.program)
    assert program_text.startswith(lowered.program.listing()) and "; ICB icb: 3 commands" in program_text
    with pytest.raises(TypeError, match="neither a graph"):
        describe("x")  # type: ignore[arg-type]


def test_icb_records_are_json_ready() -> None:
    import json
    from mtlir.program.tables import icb_records
    recs = icb_records(_spec())
    assert json.loads(json.dumps(recs)) == recs
    assert recs[0]["grid"] == [None, 1, 1] and recs[0]["bindings"][1] == {"buffer": "buffer:y", "offset": 256,
                                                                          "index": 1}
    assert recs[1]["barrier"] is False and recs[1]["rebound"] == [1] and recs[1]["variables"] == []


def test_every_stage_prints_through_the_public_api() -> None:
    import mtlir
    from mtlir.program.payloads import CallList, MessageList
    lowered = lower(small_queue(DeviceSpec("Apple9"), symbolic=True), target="x86_64")
    assert mtlir.describe is describe
    for name, stage in lowered.stages[1:-1]:  # every message of every MSGS/CALLS node, one line each
        text = mtlir.describe(stage)
        count = sum(len(u.arg) for u in stage.toposort() if isinstance(u.arg, (MessageList, CallList)))
        assert count and sum(line.startswith(";   [") or line.startswith(";   objc_msgSend [")
                             for line in text.splitlines()) == count, name
    last = mtlir.describe(lowered.stages[-1][1])
    assert "; ICB icb: 3 commands" in last and "[encoder executeCommandsInBuffer:withRange: icb, 0, 3]" in last

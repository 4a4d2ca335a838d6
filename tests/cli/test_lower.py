"""``mtlir lower --setup`` and the ``"setup"`` array of ``--json`` (issue 15): the messages link sends once, in
order, recorded through the RecordingBridge; the per-submit listing stays as it was."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from mtlir.cli.lower import format_message, record_setup
from mtlir.cli.main import main

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
KV7 = str(TRACES / "symbolic_kv.apple7.json")


def _mtlir(*argv: str) -> tuple[int, str, str]:
    out, log = io.StringIO(), io.StringIO()
    return main(list(argv), out=out, log=log), out.getvalue(), log.getvalue()


def test_setup_lists_what_link_sends_once_in_order() -> None:
    code, out, log = _mtlir("lower", KV7, "--setup", "--target", "arm64")
    assert code == 0, log
    lines = out.splitlines()
    assert lines[0].startswith("; link: ") and "setup messages, sent once" in lines[0]
    body = lines[1:]
    assert int(lines[0].split()[2]) == len(body)
    assert body[0] == "[device newCommandQueueWithMaxCommandBufferCount: 1024]"
    # the ICB's commands, each built once: the command, its pipeline, its buffers at their offsets, its barrier
    i = body.index("[icb indirectComputeCommandAtIndex: 1]")
    assert body[i + 2] == "[icb[1] setComputePipelineState: pipeline:r_start_pos]"
    assert "[icb[1] setKernelBuffer:offset:atIndex: buffer:3, 256, 0]" in body[i:i + 8]
    assert "[icb[1] setBarrier]" in body and "[icb[0] setBarrier]" not in body  # barriers: none before command 0
    assert body[-1] == "[queue addResidencySet: residency_set]"
    assert not any("commandBuffer]" in line or line.startswith("[cmdbuf") for line in body)  # nothing of a submit


def test_json_carries_the_setup_next_to_the_messages_of_one_submit() -> None:
    code, out, log = _mtlir("lower", KV7, "--json", "--target", "x86_64")
    assert code == 0, log
    doc = json.loads(out)
    assert doc["setup_count"] == len(doc["setup"]) > 40
    sels = [m["selector"] for m in doc["setup"]]
    for sel in ("newComputePipelineStateWithDescriptor:options:reflection:error:", "indirectComputeCommandAtIndex:",
                "setKernelBuffer:offset:atIndex:", "setBarrier", "newResidencySetWithDescriptor:error:"):
        assert sel in sels
    assert "commandBuffer" not in sels and doc["messages"][-1]["selector"] == "commit"
    _, listing, _ = _mtlir("lower", KV7, "--setup", "--target", "x86_64")
    assert listing.splitlines()[1:] == [format_message(m) for m in doc["setup"]]


def test_the_per_submit_listing_is_unchanged_by_setup() -> None:
    _, plain, _ = _mtlir("lower", KV7, "--target", "arm64")
    assert plain.startswith("; Apple7, residency set, ICB, arm64:") and "setup messages" not in plain


@pytest.mark.parametrize("target", ["arm64", "x86_64"])
def test_record_setup_is_the_same_on_both_targets(target: str) -> None:
    from mtlir import DeviceSpec, load_trace, lower
    t = load_trace(KV7)
    setup = record_setup(lower(t.queue(DeviceSpec("Apple7")), target=target).program, target)
    arm = record_setup(lower(t.queue(DeviceSpec("Apple7")), target="arm64").program, "arm64")
    strip = [(m["receiver"], m["selector"]) for m in setup]
    assert strip == [(m["receiver"], m["selector"]) for m in arm]


def test_json_carries_the_icb_commands() -> None:
    code, out, log = _mtlir("lower", KV7, "--json", "--target", "arm64")
    assert code == 0, log
    (icb,) = json.loads(out)["icbs"]
    assert icb["name"] == "icb" and len(icb["commands"]) == 5
    first, second = icb["commands"][:2]
    assert first["grid"] == [None, 1, 1] and first["threadgroup"] == [16, 1, 1]  # the grid is set per submit
    assert first["variables"] == [{"name": "start_pos", "index": 3}] and first["barrier"] is False
    assert second["barrier"] is True and second["bindings"][0] == {"buffer": "buffer:3", "offset": 256, "index": 0}


def test_the_program_picture_of_viz_shows_the_setup_and_the_icb(tmp_path: Path) -> None:
    import shutil
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    code, _, log = _mtlir("lower", KV7, "--target", "arm64", "--viz", str(tmp_path))
    assert code == 0, log
    svg = (tmp_path / "04-linearize.svg").read_text()
    assert "setup messages, sent once" in svg and "indirectComputeCommandAtIndex: 1" in svg
    assert "ICB icb: 5 commands" in svg and "buffer:3+256@0" in svg

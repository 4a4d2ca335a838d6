"""Pictures: DOT text Graphviz accepts for every special character, stable ids, networkx export in structure."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from conftest import graphs, text_strategy

from mtlir import GraphvizNotFoundError, Ops, UOp, dtypes, to_dot, to_networkx, write_picture
from mtlir.metal import Kernel, KernelParam, Obj
from mtlir.viz import OP_COLORS

HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="Graphviz's dot is not installed (apt-get install graphviz)")

NASTY = ["node", "EDGE", "Graph", "strict", "subgraph", "DiGraph", "NODE", '"', "'", "\\", "a\\", "\\\\", "\\n", "\\l",
         "<", ">", "<b>bold</b>", "{", "|", "}", "{a|b}", "&amp;", "&", "]", "[", ";", "=", "->", "--", "#", "//",
         "/* c */", "a\nb", "\t", "\x00", "\x1b[0m", "☃", "setKernelBuffer:offset:atIndex:", "a:b:c", ":", "n0:n",
         "newComputePipelineStateWithDescriptor:options:reflection:error:", "x" * 300]


def nasty_graph() -> UOp:
    x = UOp.variable("x", 0, 10)
    nodes = [UOp(Ops.MSG, dtypes.void, (x,), s, tag=s) for s in NASTY]
    kernel = Kernel('k"<>', "k", 'kernel void k(constant float& node) { "}" }\n', (KernelParam("node", 0),))
    nodes.append(UOp(Ops.OBJECT, dtypes.id, (), Obj("pipeline", "pipeline:k", (kernel,))))
    return UOp.sink(*nodes, x + x)


def run_dot(source: str, fmt: str = "svg") -> bytes:
    proc = subprocess.run(["dot", f"-T{fmt}"], input=source.encode(), capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr.decode()
    return proc.stdout


def test_dot_source_structure() -> None:
    g = nasty_graph()
    dot = to_dot(g, name="node")
    src = dot.source
    order = g.toposort()
    ids = re.findall(r"^\s*(n\d+) \[", src, re.M)
    assert ids == [f"n{i}" for i in range(len(order))]  # stable ids by toposort position, no colons, no keywords
    assert src.count(" -> ") == sum(len(u.src) for u in order)
    assert to_dot(g, name="node").source == src  # deterministic
    # every arg is inside an HTML-like label, escaped
    assert "&lt;b&gt;bold&lt;/b&gt;" in src and "&quot;" in src and "<b>bold" not in src


@needs_dot
@pytest.mark.parametrize("name", ["node", "graph", "strict", 'a "quoted" \\ name', "<html>", "{|}", "a:b", ""])
def test_graphviz_accepts_every_special_character(name: str) -> None:
    g = nasty_graph()
    svg = run_dot(to_dot(g, name=name).source).decode()
    assert svg.count('class="node"') == len(g.toposort())
    assert svg.count('class="edge"') == sum(len(u.src) for u in g.toposort())
    # the selector shows whole (broken after its colons), the markup shows as text
    assert "newComputePipelineStateWithDescriptor:" in svg and "options:reflection:error:" in svg
    assert "&lt;b&gt;bold&lt;/b&gt;" in svg


@needs_dot
@settings(max_examples=25, deadline=None)
@given(graphs(max_nodes=6), text_strategy)
def test_graphviz_accepts_random_graphs(g: UOp, name: str) -> None:
    svg = run_dot(to_dot(g, name=name).source).decode()
    assert svg.count('class="node"') == len(g.toposort())


def test_colors_highlight_and_long_graphs() -> None:
    x = UOp.variable("x", 0, 10)
    c = x
    for _ in range(50):
        c = c + 1
    src = to_dot(c, highlight=[c.src[0]]).source
    assert src.count("penwidth=3") == 1 and f'fillcolor="{OP_COLORS[Ops.ADD]}"' in src
    short = to_dot(c, max_nodes=10).source
    assert len(re.findall(r"^\s*n\d+ \[", short, re.M)) == 10 and f"{len(c.toposort()) - 10} more nodes" in short
    assert OP_COLORS[Ops.MSG] != OP_COLORS[Ops.ADD] != OP_COLORS[Ops.EXEC] != OP_COLORS[Ops.SINK]
    assert all(op in OP_COLORS for op in (Ops.KERNEL, Ops.EXEC, Ops.WAIT, Ops.SIGNAL, Ops.TIMESTAMP, Ops.SUBMIT,
                                          Ops.MSG, Ops.CALL, Ops.RANGE, Ops.END, Ops.LOAD, Ops.CONST))


@needs_dot
@pytest.mark.parametrize("fmt, magic", [("svg", b"<?xml"), ("png", b"\x89PNG")])
def test_write_picture(tmp_path: Path, fmt: str, magic: bytes) -> None:
    out = write_picture(to_dot(nasty_graph()), tmp_path / f"g.{fmt}")
    assert out.read_bytes().startswith(magic)
    out2 = write_picture(to_dot(nasty_graph()), tmp_path / "noext", format=fmt)
    assert out2.read_bytes().startswith(magic)


def test_write_picture_without_dot_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(GraphvizNotFoundError, match="apt-get install graphviz.*brew install graphviz"):
        write_picture(to_dot(UOp.variable("x", 0, 1)), tmp_path / "g.svg")


def test_write_picture_refuses_other_formats(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'pdf' is not svg or png"):
        write_picture(to_dot(UOp.variable("x", 0, 1)), tmp_path / "g.pdf")


def test_bad_graph_arguments() -> None:
    with pytest.raises(TypeError, match="str is neither a UOp nor a Program"):
        to_dot("x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a UOp"):
        to_networkx(None)  # type: ignore[arg-type]


# ---- networkx

def test_networkx_keeps_duplicate_sources_and_argument_indices() -> None:
    x = UOp.variable("x", 0, 10)
    g = UOp.sink(x + x, x)
    nxg = to_networkx(g)
    assert isinstance(nxg, nx.MultiDiGraph)
    assert nxg.number_of_nodes() == 3 and nxg.number_of_edges() == 4
    assert sorted(d["index"] for _, _, d in nxg.in_edges(1, data=True)) == [0, 1]  # x + x: two edges from x
    assert nxg.nodes[1]["op"] is Ops.ADD and nxg.nodes[0]["arg"] == ("x", 0, 10) and nxg.nodes[2]["uop"] is g
    assert list(nx.topological_sort(nxg))[-1] == 2


@settings(max_examples=60, deadline=None)
@given(graphs())
def test_networkx_export_equals_the_graph_in_structure(g: UOp) -> None:
    order = g.toposort()
    nxg = to_networkx(g)
    assert nxg.number_of_nodes() == len(order)
    assert nxg.number_of_edges() == sum(len(u.src) for u in order)
    ids = {u: i for i, u in enumerate(order)}
    for i, u in enumerate(order):
        data = nxg.nodes[i]
        assert (data["op"], data["dtype"], data["uop"]) == (u.op, u.dtype, u)
        edges = sorted((d["index"], s) for s, _, d in nxg.in_edges(i, data=True))
        assert edges == [(k, ids[s]) for k, s in enumerate(u.src)]
    assert nx.is_directed_acyclic_graph(nxg)


# ---- every stage of a lowering, the Program included (issue 15)

def _lowered(trace: str = "symbolic_kv.apple7.json"):  # type: ignore[no-untyped-def]
    from mtlir import DeviceSpec, load_trace, lower
    root = Path(__file__).resolve().parents[1]
    t = load_trace(root / "examples" / "traces" / trace)
    return lower(t.queue(DeviceSpec(t.arch)), target="arm64")


def test_every_stage_of_a_lowering_draws_the_program_included() -> None:
    lowered = _lowered()
    program = lowered.stages[-1][1]
    dot = to_dot(program, name="linearize", setup=["[device newFence]", "[icb[0] setBarrier]"])
    src = dot.source
    for pc in range(len(program.instrs)):
        assert f'"i{pc}"' in src or f"i{pc} " in src
    assert "executeCommandsInBuffer:withRange:" in src
    # the ICB's table: every command with its pipeline, a binding with its offset, what a submit patches
    assert "ICB icb: 5 commands" in src and "pipeline:r_start_pos_16" in src and "buffer:3+256@0" in src
    assert "start_pos (varbuf @3)" in src and "[?, 1, 1]" in src
    assert "2 setup messages, sent once" in src and "[icb[0] setBarrier]" in src
    for name, stage in lowered.stages:
        run_dot(to_dot(stage, name=name).source) if HAS_DOT else to_dot(stage, name=name)


def test_the_icb_placeholder_box_lists_its_commands() -> None:
    encoded = _lowered().stages[1][1]
    src = to_dot(encoded).source
    assert "5 commands:" in src
    assert "#0 pipeline:r_start_pos_16 grid [?, 1, 1] tg [16, 1, 1] barrier" in src
    assert "buffer:3+0@0 buffer:2+0@1<BR/>   buffer:1+0@2 varbuf+0@3" in src  # wrapped, never cut
    assert "per submit: grid, start_pos (varbuf @3)" in src


@needs_dot
def test_to_svg_is_an_inline_svg_element() -> None:
    from mtlir.viz import to_svg
    text = to_svg(to_dot(UOp.variable("x", 0, 1)))
    assert text.startswith("<svg") and text.rstrip().endswith("</svg>") and "<?xml" not in text


def test_several_queues_get_one_lane_each_with_their_event_edges() -> None:
    """Issue 17: a graph of several queues draws each queue's ops, and after encode its messages, in a cluster of
    its own; a dashed edge goes from each signal of an event to each wait for it on another queue. One queue is
    drawn without lanes."""
    from lowering_cases import SCALE

    from mtlir.frontend.nodes import buffer, timeline_value
    from mtlir.frontend.queue import Queue, queues
    from mtlir.metal import DeviceSpec
    from mtlir.passes import lower
    x, y = buffer("x", 64), buffer("y", 64)
    v = timeline_value()
    copy, compute = Queue(DeviceSpec("Apple9"), name="copy"), Queue(DeviceSpec("Apple9"))
    copy.copy(x, y).signal(copy.timeline, v)
    compute.wait(copy.timeline, v).exec(SCALE, [y, x]).signal(compute.timeline, v)
    lowered = lower(queues(copy, compute))
    for name, stage in lowered.stages[:3]:
        source = to_dot(stage, name=name).source
        assert source.count("subgraph cluster_lane") == 2, name
        assert "queue copy" in source and "the default queue" in source
        edges = [line for line in source.splitlines() if 'style=dashed' in line and "event:copy" in line]
        assert len(edges) == 1, (name, edges)
    single = Queue(DeviceSpec("Apple9"))
    single.exec(SCALE, [x, y]).signal(single.timeline, v)
    assert "cluster_lane" not in to_dot(lower(single.submit()).stages[1][1]).source


# ---- large graphs: the default picture stays small enough for dot to lay out in seconds (session 6, finding 4)

def test_a_node_of_many_uses_of_few_sources_draws_one_edge_per_source() -> None:
    """A SUBMIT of 10,000 uses of a few EXECs (a repeated trace, hash-consed) was 10,000 parallel edges into one
    node: dot took more than a minute on a 31-node picture. Past 32 sources one edge per distinct source, its
    label the first positions and the count."""
    from mtlir.viz import _MAX_EDGES
    a, b = UOp.variable("a", 0, 1), UOp.variable("b", 0, 1)
    big = UOp.sink(*([a, b] * 5000))
    src = to_dot(big).source
    assert src.count(" -> ") == 2
    assert "0,2,4,… (5000 uses)" in src and "1,3,5,… (5000 uses)" in src
    small = UOp.sink(*([a, b] * (_MAX_EDGES // 2)))  # at the limit: one edge per position, as before
    assert to_dot(small).source.count(" -> ") == _MAX_EDGES


def test_the_default_picture_draws_at_most_max_nodes_and_says_how_many_more() -> None:
    from mtlir.viz import MAX_NODES
    c = UOp.variable("x", 0, 10)
    for _ in range(MAX_NODES + 200):
        c = c + 1
    total = len(c.toposort())
    src = to_dot(c).source
    assert len(re.findall(r"^\s*n\d+ \[", src, re.M)) == MAX_NODES
    assert f"{total - MAX_NODES} more nodes, not drawn (max_nodes {MAX_NODES})" in src


def test_a_long_program_and_a_large_icb_are_cut_with_a_count() -> None:
    """The Program's picture drew every instruction and every ICB command (4,029 instructions of a 10k-command
    trace): past ``max_nodes`` one box says how many instructions more, past ``max_nodes // 10`` one row says how
    many commands more."""
    program = _lowered().stages[-1][1]
    n = len(program.instrs)
    src = to_dot(program, max_nodes=3, setup=[f"[m{i}]" for i in range(5)]).source
    assert len(re.findall(r"^\s*i\d+ \[", src, re.M)) == 3 and f"… {n - 3} more instructions" in src
    assert "… 4 more commands" in src and "… 4 more messages" in src and "[m0]" in src and "[m1]" not in src


def test_a_dot_past_its_timeout_is_a_timeout_error_of_exit_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess as sp
    from mtlir.cli.report import exit_code
    from mtlir.errors import UnsupportedError
    from mtlir.viz import GraphvizError, GraphvizTimeoutError

    def slow(cmd: list[str], **kw: object) -> object:
        raise sp.TimeoutExpired(cmd, 0.5)
    monkeypatch.setattr("mtlir.viz.subprocess.run", slow)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/dot")
    with pytest.raises(GraphvizTimeoutError, match="took longer than 0.5 s for .*g.svg.*max_nodes") as info:
        write_picture(to_dot(UOp.variable("x", 0, 1)), tmp_path / "g.svg", timeout=0.5)
    assert isinstance(info.value, GraphvizError) and isinstance(info.value, UnsupportedError)
    assert exit_code(info.value) == 4
    assert exit_code(GraphvizError("dot failed")) == 2  # a broken install: the user's to fix

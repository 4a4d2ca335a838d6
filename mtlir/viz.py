"""Pictures of graphs: ``to_dot`` (a ``graphviz.Digraph``), ``write_picture`` (SVG/PNG through Graphviz's ``dot``)
and ``to_networkx`` (a ``networkx.MultiDiGraph`` for analysis).

Node ids are ``n<I>`` with ``I`` the node's toposort position: stable across runs, and never a DOT keyword nor a
name with a colon (which DOT would read as a port). Labels are HTML-like labels with every character escaped, so
args holding quotes, backslashes, ``< > { | }``, DOT keywords, newlines or the colons of Objective-C selectors
print as they are. The graphviz and networkx packages are imported by the functions that need them, not with this
module.
"""
from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mtlir.errors import InputError, UnsupportedError
from mtlir.ir.ops import GroupOp, Ops
from mtlir.metal import Obj
from mtlir.program.instructions import End
from mtlir.program.payloads import CallList, IcbSpec, MessageList
from mtlir.program.program import Program
from mtlir.program.tables import ICB_COLUMNS, icb_rows
from mtlir.ir.render import short_arg
from mtlir.ir.uop import UOp

if TYPE_CHECKING:
    import graphviz
    import networkx as nx

__all__ = ["to_dot", "to_networkx", "write_picture", "to_svg", "GraphvizNotFoundError", "GraphvizError",
           "GraphvizTimeoutError", "OP_COLORS", "MAX_NODES"]


class GraphvizNotFoundError(InputError, RuntimeError):
    """Graphviz's ``dot`` program is not installed, so a picture cannot be rendered."""


class GraphvizError(InputError, RuntimeError):
    """Graphviz's ``dot`` failed (a broken install: the message has what it wrote on stderr). The CLI exits with 2."""


class GraphvizTimeoutError(GraphvizError, UnsupportedError):
    """Graphviz's ``dot`` took longer than its timeout to lay out a picture: the graph is valid, but too large (or
    too dense) for ``dot`` to draw in time. An ``UnsupportedError`` (the CLI exits with 4: something valid that
    mtlir cannot do), not bad input; still a ``GraphvizError`` for code that catches every failure of ``dot``."""


# nodes drawn by default: dot's layout grows faster than linearly (measured on 2 cores: 500 nodes 0.6 s, 1000 2 s,
# 2000 7.7 s, 5000 more than 60 s), so a default picture lays out in a few seconds; the rest is one box
MAX_NODES = 1000
# a node with more sources than this draws one edge per distinct source (a SUBMIT of 10,000 uses of 5 EXECs is 5
# edges, each labelled with its first positions and its count), not one per use: dot's time grows with edges too
_MAX_EDGES = 32


# fill colors per op group: structure grey, data blue, arithmetic yellow, loops green, calls orange, queue red
_GROUP_COLORS: tuple[tuple[frozenset[Ops], str], ...] = (
    (frozenset({Ops.SINK, Ops.AFTER, Ops.NOOP}), "#e0e0e0"),
    (frozenset({Ops.CONST, Ops.DEFINE_VAR}), "#ffffff"),
    (frozenset({Ops.BUFFER, Ops.BUFFER_VIEW, Ops.OBJECT, Ops.INDEX, Ops.LOAD, Ops.STORE, Ops.BITCAST, Ops.CAST,
                Ops.STRUCT, Ops.GEP}), "#cfe2ff"),
    (GroupOp.ALU, "#fff3bf"),
    (frozenset({Ops.RANGE, Ops.END}), "#d3f9d8"),
    (frozenset({Ops.MSG, Ops.CALL, Ops.MSGS, Ops.CALLS}), "#ffd8a8"),
    (frozenset({Ops.KERNEL, Ops.EXEC, Ops.WAIT, Ops.SIGNAL, Ops.TIMESTAMP, Ops.COPY, Ops.FILL, Ops.SUBMIT}), "#ffc9c9"),
)
OP_COLORS: dict[Ops, str] = {op: color for ops, color in _GROUP_COLORS for op in ops}
_OTHER_COLOR = "#f3d9fa"  # ops added later that no group above names
_SAFE_ID = re.compile(r"[^A-Za-z0-9_]")


def _html(text: str) -> str:
    """``text`` escaped for an HTML-like DOT label: entities for ``& < > "``, control characters as escapes."""
    text = "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)
    return html.escape(text, quote=True)


_MAX_ROWS = 16  # messages of an MSGS/CALLS node shown in its label, one per row (their source positions after)
_SELECTOR = re.compile(r"[A-Za-z_]\w*:(?:[A-Za-z_]\w*:)*")


def _arg_rows(arg: object, width: int) -> list[str]:
    """The arg as label rows: an Objective-C selector longer than ``width`` is broken after its colons (never
    cut, it is what a reader looks for); the messages of an MSGS/CALLS node one per row, with the source positions
    of their arguments; a placeholder (``Obj``) by its name, as listings and --json name it;
    anything else is one row of ``short_arg``."""
    if isinstance(arg, (MessageList, CallList)):
        sels = [entry[0] if isinstance(arg, MessageList) else entry[1] for entry in arg]
        rows = [f"{sel} ({', '.join(map(str, entry[-1]))})" for sel, entry in zip(sels[:_MAX_ROWS], arg)]
        return rows + ([f"… {len(sels) - _MAX_ROWS} more"] if len(sels) > _MAX_ROWS else [])
    if isinstance(arg, Obj):
        name = arg.name if arg.name.split(":")[0].split("[")[0] == arg.kind else f"{arg.kind} {arg.name}"
        rows = [name if len(name) <= width else name[:width - 1] + "…"]
        if arg.kind == "icb" and arg.payload and isinstance(arg.payload[0], IcbSpec):
            rows.extend(_icb_label_rows(arg.payload[0], width))
        return rows
    if isinstance(arg, str) and len(arg) + 2 > width and _SELECTOR.fullmatch(arg):
        rows = [""]
        for piece in re.findall(r"[^:]*:", f"'{arg}"):
            if rows[-1] and len(rows[-1]) + len(piece) > width:
                rows.append("")
            rows[-1] += piece
        rows[-1] += "'"
        return rows
    return [short_arg(arg, width)]


def _icb_label_rows(spec: IcbSpec, width: int) -> list[str]:
    """The commands of an ICB placeholder as label rows (the columns of ``mtlir.program.tables.icb_rows``), at most
    ``_MAX_ROWS``: ``#0 pipeline:k grid [?, 1, 1] tg [16, 1, 1] barrier`` and the bindings under it."""
    rows = [f"{len(spec.commands)} commands:"]
    for row in icb_rows(spec)[:_MAX_ROWS // 2]:
        index, pipeline, bindings, grid, tg, barrier, patched = row
        rows.append(f"#{index} {pipeline} grid {grid} tg {tg}{' barrier' if barrier == 'yes' else ''}")
        line = "  "
        for binding in bindings.split():  # wrapped at width, never cut: the offsets are what a reader looks for
            if len(line) + len(binding) + 1 > width and line.strip():
                rows.append(line)
                line = "  "
            line += " " + binding
        rows.append(line)
        if patched != "-":
            rows.append(f"   per submit: {patched}")
    if len(spec.commands) > _MAX_ROWS // 2:
        rows.append(f"… {len(spec.commands) - _MAX_ROWS // 2} more commands")
    return rows


def _label(u: UOp, width: int) -> str:
    rows = [f"<B>{_html(u.op.name)}</B>", _html(u.dtype.name)]
    if u.arg is not None:
        rows.extend(_html(r) for r in _arg_rows(u.arg, width))
    if u.tag is not None:
        rows.append("tag=" + _html(short_arg(u.tag, width)))
    return "<" + "<BR/>".join(rows) + ">"


def to_dot(graph: UOp | Program, name: str = "mtlir", highlight: Iterable[UOp] = (), width: int = 40,
           max_nodes: int = MAX_NODES, setup: Sequence[str] = ()) -> graphviz.Digraph:
    """A ``graphviz.Digraph`` of ``graph``, any stage of a lowering (building it needs no ``dot`` program).

    A graph (UOp): one box per node labelled op, dtype, arg and tag (args cut to ``width`` characters), filled by
    op group; the box of an ICB placeholder lists its commands (pipeline, grid, threadgroup, barrier, bindings,
    what a submit patches); an edge from each source to its user, labelled with the argument position when the
    user has several sources (a node of more than 32 sources draws one edge per distinct source, labelled with its
    first positions and how many uses it stands for). Nodes in ``highlight`` get a thick red border. Above
    ``max_nodes`` nodes (default ``MAX_NODES``, 1000: ``dot`` lays that out in a few seconds, 5000 took more than
    a minute) only the ``max_nodes`` nearest the root (by toposort position) are drawn, and one box says how many
    were left out and stands for them. A graph of
    several queues draws one lane (a cluster) per queue and a dashed edge from each signal of an event to each wait
    for it on another queue (``_lanes``, ``_event_edges``).

    A ``Program``: its instructions as a chain of boxes (a loop's end points back to its start; past ``max_nodes``
    instructions one box says how many more there are), the table of each ICB it builds (its first ``max_nodes //
    10`` commands, then a row saying how many more), and ``setup`` (its first ``max_nodes // 10`` lines likewise)
    (lines of the messages link sends once, e.g. ``mtlir lower --setup``'s listing) as a box of its own. ``name`` is
    the picture's title (any text). Raises ``TypeError`` when ``graph`` is neither a UOp nor a Program."""
    import graphviz  # imported here: only drawing needs the graphviz package

    if isinstance(graph, Program):
        return _program_dot(graph, name, setup, max_nodes)
    if not isinstance(graph, UOp):
        raise TypeError(f"to_dot: {type(graph).__name__} is neither a UOp nor a Program")
    order = graph.toposort()
    ids = {u: f"n{i}" for i, u in enumerate(order)}
    marked = set(highlight)
    hidden = len(order) - max_nodes if len(order) > max_nodes else 0
    graph_id = "g_" + _SAFE_ID.sub("_", name)
    dot = graphviz.Digraph(name=graph_id, graph_attr={"label": f"<{_html(name)}>", "labelloc": "t",
                                                      "fontname": "Helvetica"},
                           node_attr={"shape": "box", "style": "rounded,filled", "fontname": "Helvetica",
                                      "fontsize": "10"},
                           edge_attr={"fontsize": "8", "arrowsize": "0.6"})
    if hidden:
        dot.node("more", f"<… {hidden} more nodes, not drawn (max_nodes {max_nodes})>", shape="note",
                 fillcolor="#ffffff")
    lanes = _lanes(order)
    clusters = {name: graphviz.Digraph(name=f"cluster_lane{i}", graph_attr={
        "label": f"<{_html(_lane_title(name))}>", "style": "rounded,dashed", "color": "#7f7f7f"})
        for i, name in enumerate(dict.fromkeys(lanes.values()))}
    for u in order[hidden:]:
        attrs = {"fillcolor": OP_COLORS.get(u.op, _OTHER_COLOR)}
        if u in marked:
            attrs.update(color="#d00000", penwidth="3")
        lane = lanes.get(u)
        (clusters[lane] if lane is not None else dot).node(ids[u], _label(u, width), **attrs)
        hidden_srcs = False
        for s, label in _edges(u):
            if hidden and int(ids[s][1:]) < hidden:
                hidden_srcs = True
                continue
            dot.edge(ids[s], ids[u], label=label)
        if hidden_srcs:
            dot.edge("more", ids[u], style="dashed")
    for cluster in clusters.values():
        dot.subgraph(cluster)
    shown = set(order[hidden:])
    for signal, wait, event in _event_edges(order, lanes):
        if signal in shown and wait in shown:
            dot.edge(ids[signal], ids[wait], label=f"<{_html(event)}>", style="dashed", color="#1f5fbf",
                     fontcolor="#1f5fbf", constraint="false")
    return dot


def _edges(u: UOp) -> list[tuple[UOp, str | None]]:
    """The edges into ``u`` as (source, label): one per argument position labelled with it (none for a single
    source); past ``_MAX_EDGES`` sources one per distinct source, labelled ``0,5,10,… (2000 uses)``."""
    if len(u.src) <= _MAX_EDGES:
        return [(s, str(i) if len(u.src) > 1 else None) for i, s in enumerate(u.src)]
    uses: dict[UOp, list[int]] = {}
    for i, s in enumerate(u.src):
        uses.setdefault(s, []).append(i)
    return [(s, ",".join(map(str, at)) if len(at) <= 3 else f"{at[0]},{at[1]},{at[2]},… ({len(at)} uses)")
            for s, at in uses.items()]


def _lane_title(name: str) -> str:
    """``queue`` -> ``the default queue``; ``queue:copy`` -> ``queue copy``."""
    return "the default queue" if name == "queue" else f"queue {name.split(':', 1)[1]}"


def _lanes(order: Sequence[UOp]) -> dict[UOp, str]:
    """The queue each node of a graph of several queues belongs to (``queue`` or ``queue:<name>``), for one lane
    per queue: a SUBMIT and its queue ops (by the SUBMIT's tag), a queue placeholder, and the messages, calls and
    AFTERs whose receiver chain (``src[0]``) leads to one. Empty when the graph has fewer than two queues, so a
    single queue is drawn as before."""
    lane: dict[UOp, str] = {}
    for u in order:  # sources before users
        if u.op is Ops.SUBMIT:
            name = "queue" if u.tag is None else f"queue:{u.tag}"
            lane[u] = name
            for s in u.src:
                lane.setdefault(s, name)
        elif u.op is Ops.OBJECT and isinstance(u.arg, Obj) and u.arg.kind == "queue":
            lane[u] = u.arg.name
        elif u.op in (Ops.MSG, Ops.MSGS, Ops.CALL, Ops.CALLS, Ops.AFTER) and u.src and u.src[0] in lane:
            lane[u] = lane[u.src[0]]
    return lane if len(set(lane.values())) > 1 else {}


def _event_edges(order: Sequence[UOp], lanes: dict[UOp, str]) -> list[tuple[UOp, UOp, str]]:
    """``(signal node, wait node, event name)`` for each event signaled in one lane and waited for in another: a
    SIGNAL and a WAIT of the queue graph, or the MSGS/CALLS holding ``encodeSignalEvent:value:`` and
    ``encodeWaitForEvent:value:`` after encode."""
    signals: dict[UOp, list[UOp]] = {}
    waits: dict[UOp, list[UOp]] = {}
    for u in order:
        if u not in lanes:
            continue
        if u.op in (Ops.SIGNAL, Ops.WAIT) and u.src:
            (signals if u.op is Ops.SIGNAL else waits).setdefault(u.src[0], []).append(u)
        elif isinstance(u.arg, (MessageList, CallList)):
            for entry in u.arg:
                selector, refs = (entry[0], entry[1]) if isinstance(u.arg, MessageList) else (entry[1], entry[3][2:])
                if selector in ("encodeSignalEvent:value:", "encodeWaitForEvent:value:") and refs:
                    table = signals if selector.startswith("encodeSignal") else waits
                    table.setdefault(u.src[refs[0]], []).append(u)
    return [(s, w, ev.arg.name if isinstance(ev.arg, Obj) else str(ev.arg)) for ev, ss in signals.items()
            for s in ss for w in waits.get(ev, []) if lanes[s] != lanes[w]]


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], color: str) -> str:
    """An HTML-like DOT label: a table with a title row, a header row and one row per entry, every cell escaped."""
    cells = [f'<TR><TD COLSPAN="{len(header)}" BGCOLOR="{color}"><B>{_html(title)}</B></TD></TR>',
             "<TR>" + "".join(f"<TD><B>{_html(h)}</B></TD>" for h in header) + "</TR>"]
    cells.extend("<TR>" + "".join(f'<TD ALIGN="LEFT">{_html(c)}</TD>' for c in row) + "</TR>" for row in rows)
    return '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="3">' + "".join(cells) + "</TABLE>>"


def _program_dot(program: Program, name: str, setup: Sequence[str], max_nodes: int = MAX_NODES) -> graphviz.Digraph:
    """A Program as a picture (``to_dot``): the instruction chain (its first ``max_nodes`` instructions), its ICB
    tables and the setup messages (their first ``max_nodes // 10`` rows each)."""
    import graphviz

    dot = graphviz.Digraph(name="g_" + _SAFE_ID.sub("_", name),
                           graph_attr={"label": f"<{_html(name)}>", "labelloc": "t", "fontname": "Helvetica",
                                       "rankdir": "TB"},
                           node_attr={"shape": "box", "style": "rounded,filled", "fontname": "Courier",
                                      "fontsize": "10", "fillcolor": "#ffd8a8"},
                           edge_attr={"arrowsize": "0.6"})
    shown = min(len(program.instrs), max(max_nodes, 1))
    for pc, ins in enumerate(program.instrs[:shown]):
        dot.node(f"i{pc}", f"<{pc}: {_html(program.format(pc))}>")
        if pc:
            dot.edge(f"i{pc - 1}", f"i{pc}")
        if type(ins) is End:
            dot.edge(f"i{pc}", f"i{ins.range_pc + 1}", style="dashed", constraint="false")
    if shown < len(program.instrs):
        dot.node("more", f"<… {len(program.instrs) - shown} more instructions>", shape="note", fillcolor="#ffffff")
        dot.edge(f"i{shown - 1}", "more", style="dashed")
    rows_max = max(max_nodes // 10, 1)
    seen: set[str] = set()
    for obj in program.objects.values():
        if obj.kind == "icb" and obj.payload and isinstance(obj.payload[0], IcbSpec) and obj.name not in seen:
            seen.add(obj.name)
            spec = obj.payload[0]
            title = (f"ICB {obj.name}: {len(spec.commands)} commands (built once by link; "
                     f"max kernel buffer bind count {spec.max_bind_count})")
            dot.node(f"icb{len(seen)}", _table(title, ICB_COLUMNS, _cut(icb_rows(spec), rows_max, "commands"),
                                               "#cfe2ff"), shape="plain", style="")
    if setup:
        rows = _cut([(str(i), line) for i, line in enumerate(setup)], rows_max, "messages")
        dot.node("setup", _table(f"link: {len(setup)} setup messages, sent once", ("#", "message"), rows, "#d3f9d8"),
                 shape="plain", style="")
    return dot


def _cut(rows: Sequence[Sequence[str]], at: int, what: str) -> list[Sequence[str]]:
    """The first ``at`` rows, then one row saying how many ``what`` more there are (its other cells empty)."""
    if len(rows) <= at:
        return list(rows)
    width = len(rows[0])
    return [*rows[:at], (f"… {len(rows) - at} more {what}",) + ("",) * (width - 1)]


def write_picture(dot: graphviz.Digraph, path: str | Path, format: str | None = None,
                  timeout: float = 60.0) -> Path:
    """Render ``dot`` to ``path`` with Graphviz's ``dot`` program and return the path.

    ``format`` is ``"svg"`` or ``"png"`` (default: from the path's suffix, else svg). ``timeout`` in seconds.
    Raises ``GraphvizNotFoundError`` saying what to install when ``dot`` is missing, ``ValueError`` for another
    format, ``GraphvizError`` with Graphviz's message when it fails, ``GraphvizTimeoutError`` when it takes longer
    than ``timeout`` (both ``RuntimeError``s)."""
    path = Path(path)
    fmt = (format or path.suffix.lstrip(".") or "svg").lower()
    if fmt not in ("svg", "png"):
        raise ValueError(f"write_picture: format {fmt!r} is not svg or png")
    _run_dot(dot, ["-T" + fmt, "-o", str(path)], timeout, "write_picture: dot", str(path))
    return path


def to_svg(dot: graphviz.Digraph, timeout: float = 60.0) -> str:
    """``dot`` rendered by Graphviz's ``dot`` program as the text of an ``<svg>`` element (no XML prolog nor
    DOCTYPE: ready to inline in an HTML page). ``timeout`` in seconds. Raises what ``write_picture`` raises."""
    text = _run_dot(dot, ["-Tsvg"], timeout, "to_svg: dot", "an SVG").decode("utf-8")
    return text[text.index("<svg"):]


def _run_dot(dot: graphviz.Digraph, flags: list[str], timeout: float, who: str, what: str) -> bytes:
    """Run Graphviz's ``dot`` with ``flags`` on ``dot``'s source; its stdout. Errors name ``who`` and ``what``."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizNotFoundError(f"{who.split(':')[0]}: Graphviz's 'dot' program is not installed (or not on "
                                    "PATH). Install it: Debian/Ubuntu: sudo apt-get install graphviz; "
                                    "macOS: brew install graphviz; then run again.")
    try:
        proc = subprocess.run([exe, *flags], input=dot.source.encode("utf-8"),
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise GraphvizTimeoutError(f"{who} took longer than {timeout} s for {what} (the picture is too large for "
                                   "dot: draw fewer nodes, to_dot's max_nodes)") from None
    if proc.returncode != 0:
        raise GraphvizError(f"{who}: Graphviz's dot failed (exit {proc.returncode}) for {what}: "
                            f"{proc.stderr.decode('utf-8', 'replace').strip()}")
    return bytes(proc.stdout)


def to_networkx(graph: UOp) -> nx.MultiDiGraph:
    """A ``networkx.MultiDiGraph`` of ``graph``: nodes keyed by toposort position (int) with attributes ``op``,
    ``dtype``, ``arg``, ``tag`` and ``uop``; one edge from each source to its user per argument position, keyed
    and attributed ``index`` (a node that uses the same source twice has two edges)."""
    import networkx as nx  # imported here: it takes longer to import than all of mtlir

    if not isinstance(graph, UOp):
        raise TypeError(f"to_networkx: {type(graph).__name__} is not a UOp")
    g = nx.MultiDiGraph()
    ids: dict[UOp, int] = {}
    for i, u in enumerate(graph.toposort()):
        ids[u] = i
        g.add_node(i, op=u.op, dtype=u.dtype, arg=u.arg, tag=u.tag, uop=u)
        for k, s in enumerate(u.src):
            g.add_edge(ids[s], i, key=k, index=k)
    return g

"""The payloads of a stage as text a reader can follow: the ICB's commands as a table and the messages of every
MSGS/CALLS node one per line, where the compact listing (``mtlir.ir.render.listing``) prints only their sizes
(``CommandList(<5 commands>)``, ``MessageList(<14 messages>)``).

``icb_table(spec)`` is the table of one ``IcbSpec``: per command its index in the ICB, the pipeline, the buffers bound
(placeholder + byte offset @ buffer index, METAL.md §1 ``setKernelBuffer:offset:atIndex:``), the grid (threadgroups)
and threadgroup (threads), whether ``setBarrier`` is set, and what a submit patches (symbolic sizes, variables in the
variables buffer, rebound inputs). ``describe(stage)`` is the text of a whole stage: the listing of a graph followed
by its message lists and ICB tables, or the Program's listing followed by its ICB tables; ``mtlir lower
--print-after-all`` prints it.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mtlir.ir.render import listing
from mtlir.ir.uop import UOp
from mtlir.metal import Obj
from mtlir.program.payloads import CallList, IcbCommand, IcbSpec, MessageList
from mtlir.program.program import Program

__all__ = ["ICB_COLUMNS", "icb_rows", "icb_table", "icb_records", "program_icbs", "message_lines",
           "describe"]

ICB_COLUMNS = ("#", "pipeline", "bindings (buffer+offset @index)", "grid", "threadgroup", "barrier",
               "patched per submit")


def _size(size: tuple[int, int, int], symbolic: bool) -> str:
    """``[w, h, d]``; an entry set per submit (0 in a symbolic command) as ``?``."""
    return "[" + ", ".join("?" if symbolic and v == 0 else str(v) for v in size) + "]"


def _patched(cmd: IcbCommand) -> str:
    """What a submit sends or writes for this command: the symbolic sizes, each variable (its slot in the
    variables buffer), each rebound buffer index; ``-`` for a command link fixed entirely."""
    parts: list[str] = []
    if cmd.symbolic:
        parts.extend(what for what, size in (("grid", cmd.grid), ("threadgroup", cmd.threadgroup)) if 0 in size)
    parts.extend(f"{name} (varbuf @{index})" for name, index in cmd.variables)
    parts.extend(f"buffer @{index} (rebound)" for index in cmd.rebound)
    return ", ".join(parts) or "-"


def icb_rows(spec: IcbSpec) -> list[tuple[str, ...]]:
    """One row per command of ``spec`` (``ICB_COLUMNS``), every cell text."""
    rows: list[tuple[str, ...]] = []
    for i, cmd in enumerate(spec.commands):
        bindings = " ".join(f"{name}+{offset}@{index}" for name, offset, index in cmd.bindings)
        rows.append((str(i), cmd.pipeline, bindings or "-", _size(cmd.grid, cmd.symbolic),
                     _size(cmd.threadgroup, cmd.symbolic), "yes" if cmd.barrier else "no", _patched(cmd)))
    return rows


def icb_records(spec: IcbSpec) -> list[dict[str, Any]]:
    """The commands of ``spec`` as JSON-ready objects (``mtlir lower --json``'s ``"icb"``): ``index``, ``pipeline``,
    ``bindings`` (``{"buffer", "offset", "index"}``, offsets in bytes), ``grid`` and ``threadgroup`` (null for an
    entry set per submit), ``barrier``, ``variables`` (``{"name", "index"}``: the variables-buffer slot bound at that
    buffer index) and ``rebound`` (buffer indices a submit binds)."""
    def size(v: tuple[int, int, int], symbolic: bool) -> list[int | None]:
        return [None if symbolic and x == 0 else x for x in v]
    return [{"index": i, "pipeline": c.pipeline,
             "bindings": [{"buffer": b, "offset": off, "index": idx} for b, off, idx in c.bindings],
             "grid": size(c.grid, c.symbolic), "threadgroup": size(c.threadgroup, c.symbolic), "barrier": c.barrier,
             "variables": [{"name": n, "index": idx} for n, idx in c.variables], "rebound": list(c.rebound)}
            for i, c in enumerate(spec.commands)]


def icb_table(spec: IcbSpec, name: str = "icb") -> str:
    """The commands of ``spec`` as an aligned text table, under a header line naming the ICB ``name``, its command
    count and ``setMaxKernelBufferBindCount:``."""
    rows = [ICB_COLUMNS, *icb_rows(spec)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(ICB_COLUMNS))]
    lines = [f"; ICB {name}: {len(spec.commands)} commands, max kernel buffer bind count {spec.max_bind_count}"]
    for r in rows:
        lines.append(";   " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def message_lines(node: UOp, ids: dict[UOp, int]) -> list[str]:
    """The messages of an MSGS or CALLS ``node`` one per line, ``[%6 waitForFence: %7]``, arguments named by their
    ``%`` number in ``ids`` (the listing's numbering); a CALLS entry names its C function and, for ``objc_msgSend``,
    its selector, with the arguments after the SEL as the ABI passes them."""
    arg = node.arg
    lines = []
    if isinstance(arg, MessageList):
        for sel, refs in arg:
            args = ", ".join(f"%{ids[node.src[r]]}" for r in refs)
            lines.append(f"[%{ids[node.src[0]]} {sel}{' ' + args if args else ''}]")
    elif isinstance(arg, CallList):
        for fn, sel, _proto, refs in arg:
            refs_text = [f"%{ids[node.src[r]]}" for r in refs]
            if fn == "objc_msgSend" and len(refs_text) >= 2:  # receiver, SEL, then the arguments as the ABI passes
                rest = ", ".join(refs_text[2:])
                lines.append(f"{fn} [{refs_text[0]} {sel}{' ' + rest if rest else ''}]")
            else:
                lines.append(f"{fn}({', '.join(refs_text)})")
    return lines


def program_icbs(program: Program) -> list[tuple[str, IcbSpec]]:
    """The ICB placeholders of ``program``: (name, ``IcbSpec``) each once, in register order."""
    return list(_icbs(iter(program.objects.values())))


def _icbs(objects: Iterator[Obj]) -> Iterator[tuple[str, IcbSpec]]:
    seen = set()
    for o in objects:
        if o.kind == "icb" and o.payload and isinstance(o.payload[0], IcbSpec) and o.name not in seen:
            seen.add(o.name)
            yield o.name, o.payload[0]


def describe(stage: UOp | Program, width: int = 80) -> str:
    """``stage`` as text with its payloads spelled out (module docstring): a graph's listing (args cut to
    ``width``), then ``; messages of %N`` with one line per message for every MSGS/CALLS node, then the table of
    every ICB placeholder; a Program's listing, then its ICB tables. Raises ``TypeError`` for anything else."""
    if isinstance(stage, Program):
        parts = [stage.listing()]
        parts.extend(icb_table(spec, name) for name, spec in _icbs(iter(stage.objects.values())))
        return "\n".join(parts)
    if not isinstance(stage, UOp):
        raise TypeError(f"describe: {type(stage).__name__} is neither a graph (UOp) nor a Program")
    order = stage.toposort()
    ids = {u: i for i, u in enumerate(order)}
    parts = [listing(stage, width=width).rstrip("\n")]
    for u in order:
        if isinstance(u.arg, (MessageList, CallList)):
            parts.append(f"; messages of %{ids[u]} ({u.op.name}, {len(u.arg)}):")
            parts.extend(";   " + line for line in message_lines(u, ids))
    objs = (u.arg for u in order if isinstance(u.arg, Obj))
    parts.extend(icb_table(spec, name) for name, spec in _icbs(objs))
    return "\n".join(parts)

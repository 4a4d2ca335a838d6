"""Verifiers: is the graph well formed for the stage a pass leaves it in?

Checks are written as matchers (``UPat`` -> a function returning the problem as text, or None when the node is
fine), looked up by op like a PatternMatcher, plus one postcondition per pass (``STAGE_CHECKS``): after
``encode`` no queue op is left, after ``abi`` no MSG and no struct a target cannot pass, after ``linearize`` a
Program every register of which is defined before it is read.
A failure raises ``VerifyError`` naming the pass and the node, with the node's neighbourhood reprinted and marked.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from mtlir.ir.dtypes import PtrDType, dtypes
from mtlir.errors import LoweringError
from mtlir.metal import C_FUNCTIONS, SELECTORS, DeviceSpec, Obj, Prototype
from mtlir.ir.ops import GroupOp, Ops
from mtlir.program.instructions import INSTRUCTIONS, Call, End, Range
from mtlir.program.payloads import CallList, MessageList
from mtlir.program.program import Program
from mtlir.ir.spec import value_problem
from mtlir.ir.upat import UPat
from mtlir.ir.uop import UOp

__all__ = ["VerifyError", "verify_graph", "verify_program", "verify_queue", "node_line", "graph_text", "stage_text",
           "SPEC", "QUEUE_SPEC", "Checks", "checked_once",
           "STAGE_CHECKS", "STAGE_OPS", "QUEUE_OPS"]

QUEUE_OPS = frozenset({Ops.SUBMIT, Ops.EXEC, Ops.WAIT, Ops.SIGNAL, Ops.TIMESTAMP, Ops.COPY, Ops.FILL, Ops.KERNEL,
                       Ops.BUFFER, Ops.BUFFER_VIEW})


class VerifyError(LoweringError):
    """A graph (or Program) that is not well formed after pass ``pass_name``; ``node`` is the bad node (None for a
    Program problem) and ``problem`` says what is wrong."""

    def __init__(self, pass_name: str, node: UOp | None, problem: str, context: str = "") -> None:
        where = f"\n  at {node_line(node)}" if node is not None else ""
        super().__init__(f"after pass {pass_name!r}: {problem}{where}{context}")
        self.pass_name = pass_name
        self.node = node
        self.problem = problem


# ---- printing without the core printer (it may not be there yet): one line per node


def _arg_text(u: UOp) -> str:
    a = u.arg
    if a is None:
        return ""
    if isinstance(a, Obj):
        return f" {a.name}"
    if isinstance(a, tuple) and a and isinstance(a[0], str) and u.op is Ops.CALL:
        return f" {a[0]}:{a[1]}"
    text = str(a)
    return f" {text if len(text) <= 60 else text[:57] + '...'}"


def node_line(u: UOp, ids: dict[UOp, int] | None = None) -> str:
    """One node as text: ``OP<dtype> arg (sources)``; sources as ``%n`` when ``ids`` numbers them."""
    srcs = ", ".join(f"%{ids[s]}" if ids is not None and s in ids else s.op.name for s in u.src[:12])
    if len(u.src) > 12:
        srcs += f", ... ({len(u.src)} sources)"
    tag = f" tag={u.tag!r}" if u.tag is not None else ""
    return f"{u.op.name}<{u.dtype.name}>{_arg_text(u)}{tag} ({srcs})"


def graph_text(root: UOp, mark: UOp | None = None, limit: int = 400) -> str:
    """The graph one node per line (``%n = ...``) in toposort order; ``mark`` is flagged; at most ``limit``
    lines (the last ones, where a bad node near the root is)."""
    order = root.toposort()
    ids = {u: i for i, u in enumerate(order)}
    lines = [f"%{ids[u]} = {node_line(u, ids)}{'   <-- here' if u is mark else ''}" for u in order]
    if len(lines) > limit:
        lines = [f"... ({len(lines) - limit} lines above)"] + lines[-limit:]
    return "\n".join(lines)


def stage_text(stage: UOp | Program) -> str:
    """A stage as text: the Program's listing, or the graph one node per line (``mtlir.ir.render.listing``, args cut
    short: a 100,000-command ICB prints as its size), ``graph_text`` when the core printer is not there."""
    if isinstance(stage, Program):
        return stage.listing()
    try:
        from mtlir.ir.render import listing
    except ImportError:
        return graph_text(stage)
    return listing(stage, width=80).rstrip("\n")


def _context(root: UOp, node: UOp) -> str:
    """The node with its sources two levels up, marked, for an error message."""
    nodes: list[UOp] = []
    frontier = [node]
    for _ in range(3):
        nxt: list[UOp] = []
        for u in frontier:
            if u not in nodes:
                nodes.append(u)
                nxt.extend(u.src)
        frontier = nxt
    order = [u for u in root.toposort() if u in set(nodes)] if len(nodes) < 64 else nodes[::-1]
    ids = {u: i for i, u in enumerate(order)}
    return "\n" + "\n".join(f"    %{ids[u]} = {node_line(u, ids)}{'   <-- here' if u is node else ''}"
                            for u in order[-24:])


# ---- the well-formedness rules (any stage)

def _check_msg(m: UOp) -> str | None:
    if not isinstance(m.arg, str) or not m.arg:
        return "a MSG's arg is its selector (a non-empty str)"
    if not m.src:
        return f"MSG {m.arg!r} has no receiver"
    if m.src[0].dtype is not dtypes.id:
        return f"the receiver of {m.arg!r} is a {m.src[0].dtype.name}, not an object (id)"
    sig = SELECTORS.get(m.arg)
    if sig is None:
        return _unknown_selector(m.arg)
    if len(m.src) - 1 != len(sig.args) or m.dtype is not sig.ret:
        return (f"MSG {m.arg!r} has {len(m.src) - 1} arguments and dtype {m.dtype.name}; the selector takes "
                f"{len(sig.args)} and returns {sig.ret.name}")
    return None


def _unknown_selector(selector: str) -> str:
    return f"selector {selector!r} is not in the selector table (mtlir.metal.SELECTORS): Metal has no such message"


def _function_problem(fn: str, selector: object, sel_node: UOp | None) -> str | None:
    """What is wrong with a call's function and selector: a function that is neither ``objc_msgSend`` nor a C
    function of ``C_FUNCTIONS``, an ``objc_msgSend`` of a selector missing from ``SELECTORS``, or whose SEL operand
    (``sel_node``, a CONST SEL naming what is sent: linearize puts it in ``Program.selectors``) names another
    selector."""
    if fn != "objc_msgSend":
        return None if fn in C_FUNCTIONS else (f"function {fn!r} is neither objc_msgSend nor a C function of "
                                               "mtlir.metal.C_FUNCTIONS")
    if not isinstance(selector, str) or selector not in SELECTORS:
        return _unknown_selector(str(selector))
    if sel_node is not None and sel_node.op is Ops.CONST and sel_node.arg != selector:
        return f"objc_msgSend of {selector!r}: its SEL operand is {sel_node.arg!r}, so it would send that instead"
    return None


def _check_call(c: UOp) -> str | None:
    a = c.arg
    if not (isinstance(a, tuple) and len(a) == 3 and isinstance(a[0], str) and isinstance(a[2], Prototype)):
        return "a CALL's arg is (function, selector or None, Prototype)"
    proto: Prototype = a[2]
    if len(c.src) != len(proto.args):
        return f"CALL of {a[1] or a[0]!r} has {len(c.src)} arguments, its prototype {proto} takes {len(proto.args)}"
    if c.dtype is not proto.ret:
        return f"CALL of {a[1] or a[0]!r} has dtype {c.dtype.name}, its prototype returns {proto.ret.name}"
    for i, (s, want) in enumerate(zip(c.src, proto.args)):
        if s.dtype is not want and not (isinstance(want, PtrDType) and isinstance(s.dtype, PtrDType)
                                        and want.base is dtypes.void):
            return f"argument {i} of {a[1] or a[0]!r} is a {s.dtype.name}, its prototype wants {want.name}"
    if a[0] == "objc_msgSend" and (len(c.src) < 2 or c.src[1].dtype is not dtypes.SEL):
        return f"objc_msgSend of {a[1]!r}: argument 1 must be the SEL"
    problem = _function_problem(a[0], a[1], c.src[1] if a[0] == "objc_msgSend" else None)
    return None if problem is None else f"CALL: {problem}"


def _check_msgs(m: UOp) -> str | None:
    if not isinstance(m.arg, MessageList):
        return "an MSGS's arg is a MessageList of (selector, operand indices)"
    if not m.src or m.src[0].dtype is not dtypes.id:
        return "an MSGS's first source is its receiver, an object (id)"
    n = len(m.src)
    for entry in dict.fromkeys(m.arg):  # each distinct message once
        selector, refs = entry
        if not isinstance(selector, str) or not selector:
            return f"a message of the MSGS: the selector must be a non-empty str, not {selector!r}"
        sig = SELECTORS.get(selector)
        if sig is None:
            return f"message {selector!r} of the MSGS: {_unknown_selector(selector)}"
        if sig.ret is not dtypes.void or len(refs) != len(sig.args):
            return f"message {selector!r} of the MSGS: a void message with {len(sig.args)} arguments"
        if not all(type(r) is int and 0 < r < n for r in refs):
            return f"message {selector!r} of the MSGS: argument indices must name sources 1..{n - 1}, got {refs}"
    return None


def _check_calls(c: UOp) -> str | None:
    if not isinstance(c.arg, CallList):
        return "a CALLS's arg is a CallList of (function, selector, Prototype, operand indices)"
    dts = [s.dtype for s in c.src]
    n = len(dts)
    seen: set[int] = set()  # abi shares the entry of a repeated call: check each entry object once
    for k, entry in enumerate(c.arg):
        if id(entry) in seen:
            continue
        seen.add(id(entry))
        fn, selector, proto, refs = entry
        name = repr(selector or fn)
        if not isinstance(proto, Prototype) or proto.ret is not dtypes.void or len(refs) != len(proto.args):
            return f"call {k} ({name}) of the CALLS: a void Prototype with one operand index per argument"
        for i, (r, want) in enumerate(zip(refs, proto.args)):
            if type(r) is not int or not 0 <= r < n:
                return f"call {k} ({name}) of the CALLS: argument {i} names no source ({r!r})"
            have = dts[r]
            if have is not want and not (isinstance(want, PtrDType) and isinstance(have, PtrDType)
                                         and want.base is dtypes.void):
                return f"argument {i} of call {k} ({name}) of the CALLS is a {have.name}, its prototype wants " \
                       f"{want.name}"
        if fn == "objc_msgSend" and (len(refs) < 2 or dts[refs[1]] is not dtypes.SEL):
            return f"call {k} ({name}) of the CALLS: objc_msgSend's argument 1 must be the SEL"
        problem = _function_problem(fn, selector, c.src[refs[1]] if fn == "objc_msgSend" else None)
        if problem is not None:
            return f"call {k} ({name}) of the CALLS: {problem}"
    return None


def _check_struct(s: UOp) -> str | None:
    fields = getattr(s.dtype, "fields", None)
    if fields is None:
        return f"a STRUCT of dtype {s.dtype.name}, which is not a struct"
    if len(s.src) != len(fields):
        return f"{s.dtype.name} has {len(fields)} fields, the STRUCT has {len(s.src)}"
    return None if all(f.dtype.is_int for f in s.src) else f"{s.dtype.name} fields are integers"


def _check_object(o: UOp) -> str | None:
    return None if isinstance(o.arg, Obj) else f"an OBJECT's arg is an Obj placeholder, not {type(o.arg).__name__}"


def _check_pointer(p: UOp) -> str | None:
    if p.src and isinstance(p.src[0].dtype, PtrDType):
        return None
    return f"{p.op.name} needs a pointer as its first source"


def _check_range(r: UOp) -> str | None:
    return None if len(r.src) == 1 and r.src[0].dtype.is_int else "a RANGE has one integer source (its bound)"


def _check_end(e: UOp) -> str | None:
    return None if e.src and e.src[0].op is Ops.RANGE else "an END's first source is the RANGE it closes"


def _check_after(a: UOp) -> str | None:
    return None if a.src and a.dtype is a.src[0].dtype else "an AFTER has its first source's dtype"


class Checks:
    """A table of checks ``(UPat, fn)`` looked up by op like a PatternMatcher; ``fn`` takes the captures and returns
    the problem as text, or None when the node is fine."""

    def __init__(self, rules: list[tuple[UPat, Callable[..., str | None]]]) -> None:
        self.rules = rules
        self.by_op: dict[Ops, list[tuple[UPat, Callable[..., str | None]]]] = {}
        for pat, fn in rules:
            keys = pat.op_keys()
            for op in (Ops if keys is None else keys):
                self.by_op.setdefault(op, []).append((pat, fn))
        # an op whose one check's pattern is only ops and a name (every rule of SPEC): the check called directly
        self.direct: dict[Ops, Callable[[UOp], str | None]] = {
            op: _by_name(pats[0][1], pats[0][0].name) for op, pats in self.by_op.items()
            if len(pats) == 1 and _only_op(pats[0][0])}

    def problem(self, u: UOp) -> str | None:
        """The first problem a check finds with ``u`` (None: fine)."""
        fn1 = self.direct.get(u.op)
        if fn1 is not None:
            return fn1(u)
        for pat, fn in self.by_op.get(u.op, ()):
            for captures in pat.match(u, {}):
                found = fn(**captures)
                if found is not None:
                    return found
        return None


def _only_op(pat: UPat) -> bool:
    """A pattern that matches every node of its ops, capturing it under a name (no dtype, source or arg test)."""
    return pat.name is not None and pat.only_ops()


def _by_name(fn: Callable[..., str | None], name: str | None) -> Callable[[UOp], str | None]:
    """``fn`` taking the node as the keyword ``name``, called with the node."""
    assert name is not None
    return lambda u: fn(**{name: u})


# each rule: pattern -> the problem as text, or None when the node is fine
SPEC = Checks([
    (UPat(Ops.MSG, name="m"), _check_msg),
    (UPat(Ops.CALL, name="c"), _check_call),
    (UPat(Ops.MSGS, name="m"), _check_msgs),
    (UPat(Ops.CALLS, name="c"), _check_calls),
    (UPat(GroupOp.ALU | {Ops.CONST, Ops.DEFINE_VAR, Ops.CAST}, name="u"), value_problem),  # mtlir/ir/spec.py
    (UPat(Ops.STRUCT, name="s"), _check_struct),
    (UPat(Ops.OBJECT, name="o"), _check_object),
    (UPat((Ops.INDEX, Ops.STORE), name="p"), _check_pointer),
    (UPat(Ops.RANGE, name="r"), _check_range),
    (UPat(Ops.END, name="e"), _check_end),
    (UPat(Ops.AFTER, name="a"), _check_after),
])


# ---- the queue graph (the input of encode; mtlir/frontend/queue.py's layout)


def _check_submit(s: UOp) -> str | None:
    if not isinstance(s.arg, DeviceSpec):
        return f"a SUBMIT's arg is the DeviceSpec, not {type(s.arg).__name__}"
    if s.tag is not None and not (isinstance(s.tag, str) and s.tag.isidentifier()):
        return f"a SUBMIT's tag is its queue's name (an identifier) or None, not {s.tag!r}"
    bad = next((u for u in s.src if u.op not in GroupOp.Queue), None)
    return None if bad is None else f"a SUBMIT's sources are queue ops, not {bad.op.name}"


def _check_blit(b: UOp) -> str | None:
    n = 5 if b.op is Ops.COPY else 3
    where = (0, 2) if n == 5 else (0,)  # the buffers; the other sources are byte counts
    buffers = [u for i, u in enumerate(b.src) if i in where]
    counts = [u for i, u in enumerate(b.src) if i not in where]
    if len(b.src) != n or any(not (u.op is Ops.BUFFER or (u.op is Ops.DEFINE_VAR and u.dtype is dtypes.id))
                              for u in buffers) or any(not u.dtype.is_int for u in counts):
        layout = "(src, src_offset, dst, dst_offset, size)" if n == 5 else "(buffer, offset, size)"
        return f"a {b.op.name}'s sources are {layout}: buffers (BUFFER or buffer variable) and integer byte counts"
    if b.op is Ops.FILL and not (type(b.arg) is int and 0 <= b.arg <= 255):
        return "a FILL's arg is the byte value (0..255)"
    return None


def _check_exec(e: UOp) -> str | None:
    from mtlir.frontend.nodes import QueueError
    from mtlir.frontend.checks import exec_parts
    try:
        exec_parts(e)
    except QueueError as err:
        return str(err)
    return None


def _check_event_op(e: UOp) -> str | None:
    if len(e.src) != 2 or e.src[0].op is not Ops.OBJECT or getattr(e.src[0].arg, "kind", "") != "event":
        return f"a {e.op.name}'s sources are (the event placeholder, a value)"
    return None if e.src[1].dtype.is_int else f"a {e.op.name}'s value is an integer, not {e.src[1].dtype.name}"


def _check_timestamp(t: UOp) -> str | None:
    return None if type(t.arg) is int and t.arg >= 0 and not t.src else "a TIMESTAMP's arg is its slot (an int >= 0)"


def _check_buffer(b: UOp) -> str | None:
    a = b.arg
    ok = isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str) and a[0] and type(a[1]) is int and a[1] >= 1
    return None if ok and b.dtype is dtypes.id else "a BUFFER (dtype id) has arg (name, nbytes >= 1)"


def _check_view(v: UOp) -> str | None:
    a, base = v.arg, v.src[0] if len(v.src) in (1, 2) else None
    if base is None or not (base.op is Ops.BUFFER or (base.op is Ops.DEFINE_VAR and base.dtype is dtypes.id)):
        return "a BUFFER_VIEW has one source: a BUFFER or a buffer variable"
    if len(v.src) == 2 and (base.op is not Ops.DEFINE_VAR or not v.src[1].dtype.is_int):
        return "a BUFFER_VIEW's second source (a variable offset) is an integer, on a buffer variable"
    if not (isinstance(a, tuple) and len(a) == 2 and type(a[0]) is int and type(a[1]) is int and a[0] >= 0
            and a[1] >= 1):
        return "a BUFFER_VIEW's arg is (offset >= 0, nbytes >= 1) in bytes"
    if base.op is Ops.BUFFER and isinstance(base.arg, tuple) and a[0] + a[1] > base.arg[1]:
        return f"the view [{a[0]}, {a[0] + a[1]}) runs past the end of its {base.arg[1]}-byte buffer"
    return None


# each rule: a queue-graph node -> the problem as text, or None when it is well formed
QUEUE_SPEC = Checks([
    (UPat(Ops.SUBMIT, name="s"), _check_submit),
    (UPat(Ops.EXEC, name="e"), _check_exec),
    (UPat((Ops.WAIT, Ops.SIGNAL), name="e"), _check_event_op),
    (UPat(Ops.TIMESTAMP, name="t"), _check_timestamp),
    (UPat((Ops.COPY, Ops.FILL), name="b"), _check_blit),
    (UPat(Ops.BUFFER, name="b"), _check_buffer),
    (UPat(Ops.BUFFER_VIEW, name="v"), _check_view),
])


def verify_queue(root: UOp) -> None:
    """Check a queue graph (a SUBMIT) against mtlir/frontend/queue.py's layout, every node once. ``encode`` makes
    the same checks as it reads a submit (so ``lower`` does not run this); use it on hand-built graphs. Raises
    ``VerifyError`` (pass name "input") naming the first bad node."""
    several = root.op is Ops.SINK and bool(root.src) and all(u.op is Ops.SUBMIT for u in root.src)
    if root.op is not Ops.SUBMIT and not several:
        raise VerifyError("input", root, f"a queue graph is a SUBMIT (or a SINK of SUBMITs: several queues), not "
                                         f"{root.op.name}")
    for u in root.toposort():
        problem = QUEUE_SPEC.problem(u) or SPEC.problem(u)
        if problem is not None:
            raise VerifyError("input", u, problem, _context(root, u))


# ---- postconditions of each pass


def _after_encode(u: UOp, root: UOp) -> str | None:
    if u.op in QUEUE_OPS:
        return f"{u.op.name} is a queue op, which encode lowers"
    if u is root and (u.op is not Ops.SINK or not isinstance(u.arg, DeviceSpec)):
        return "the root after encode is a SINK whose arg is the DeviceSpec"
    return None


def _after_abi(u: UOp, root: UOp) -> str | None:
    if u.op is Ops.MSG:
        return f"MSG {u.arg!r} is left after abi, which makes every MSG a CALL"
    if u.op is Ops.MSGS:
        return "an MSGS is left after abi, which makes every MSGS a CALLS"
    if u.op is Ops.CALL:
        for i, s in enumerate(u.src):
            if s.dtype is dtypes.NSRange:
                return f"argument {i} of {u.arg[1]!r} is an NSRange: it travels as two words"
    return _after_encode(u, root)


STAGE_CHECKS: dict[str, Callable[[UOp, UOp], str | None]] = {
    "encode": _after_encode, "abi": _after_abi,
}


def verify_graph(root: UOp, pass_name: str, extra: Callable[[UOp, UOp], str | None] | None = None,
                 extra_ops: frozenset[Ops] | None = None) -> None:
    """Check every node of ``root`` against ``SPEC``, the postcondition of ``pass_name`` (if it has one) and
    ``extra`` (a pass's own check, e.g. abi's per target; ``extra_ops``: the only ops it can object to, None: any),
    in one walk.

    Inside ``checked_once()`` (a pipeline run) only the nodes the pass made are walked: a node verified after an
    earlier pass was checked with its whole subgraph (nodes are immutable), and its entry keeps the set of ops in
    that subgraph (a bit mask). The postcondition still covers those old subgraphs: one holding an op the
    postcondition looks at (``STAGE_OPS``; a queue op after encode, an MSG or CALL after abi) is walked and checked
    node by node; the root is checked whatever it is.
    Raises ``VerifyError`` naming the pass and the first bad node (in toposort order)."""
    stage = STAGE_CHECKS.get(pass_name)
    watch = STAGE_OPS.get(pass_name, _ALL_OPS) if stage is not None else frozenset()
    if extra is not None:
        first = stage
        stage = extra if first is None else (lambda u, r: first(u, r) or extra(u, r))
        watch = watch | (extra_ops if extra_ops is not None else _ALL_OPS)
    if not _CHECKED:
        for u in root.toposort():
            problem = SPEC.problem(u) or (stage(u, root) if stage is not None else None)
            if problem is not None:
                raise VerifyError(pass_name, u, problem, _context(root, u))
        return
    done = _CHECKED[-1]
    spec, bit = SPEC.problem, _BIT
    fresh, boundary = _fresh(root, done)
    for u in fresh:
        problem = spec(u) or (stage(u, root) if stage is not None else None)
        if problem is not None:
            raise VerifyError(pass_name, u, problem, _context(root, u))
        mask = bit[u.op]
        for src in u.src:
            mask |= done[src]
        done[u] = mask
    if stage is None:
        return
    watched = 0
    for op in watch:
        watched |= bit[op]
    seen: set[UOp] = set()
    for b in boundary:  # old subgraphs under new nodes (or the old root): walked only where the postcondition looks
        if b is root or done[b] & watched:
            for u in (b.toposort() if done[b] & watched else (b,)):
                if u not in seen:
                    seen.add(u)
                    problem = stage(u, root)
                    if problem is not None:
                        raise VerifyError(pass_name, u, problem, _context(root, u))


def _fresh(root: UOp, done: dict[UOp, int]) -> tuple[list[UOp], list[UOp]]:
    """The nodes under ``root`` not in ``done``, each after its sources (as ``UOp.toposort``), and the nodes of
    ``done`` they (or the root) reach directly, in first-met order."""
    if root in done:
        return [], [root]
    order: list[UOp] = []
    boundary: dict[UOp, None] = {}
    placed: dict[UOp, bool] = {}  # False: sources being visited, True: in ``order``
    stack = [root]
    push, pop, get, append = stack.append, stack.pop, placed.get, order.append
    while stack:
        node = pop()
        state = get(node)
        if state is None:
            placed[node] = False
            push(node)
            for s in reversed(node.src):
                if s in done:
                    boundary[s] = None
                elif s not in placed:
                    push(s)
        elif state is False:
            placed[node] = True
            append(node)
    return order, list(boundary)


_BIT = {op: 1 << i for i, op in enumerate(Ops)}  # an op's bit in the masks of checked_once
_ALL_OPS = frozenset(Ops)
# the ops each postcondition can object to: an old subgraph holding none of them needs no look after that pass
STAGE_OPS: dict[str, frozenset[Ops]] = {
    "encode": QUEUE_OPS, "abi": QUEUE_OPS | {Ops.MSG, Ops.MSGS, Ops.CALL, Ops.CALLS},  # abi's includes encode's
}

_CHECKED: list[dict[UOp, int]] = []  # per open checked_once(): node -> the ops of its subgraph, as a bit mask


@contextlib.contextmanager
def checked_once() -> Iterator[None]:
    """Within this block ``verify_graph`` checks each distinct node against ``SPEC`` once, and walks only the nodes
    a pass made (PassPipeline.run uses it: the stages of one lowering share most of their nodes)."""
    _CHECKED.append({})
    try:
        yield
    finally:
        _CHECKED.pop()


# ---- the Program (after linearize)


def verify_program(program: Program, pass_name: str = "linearize") -> None:
    """Check a Program against its instruction set (``mtlir.program.instructions``): every instruction one of its
    records, registers in range and defined before they are read, RANGE/END matched and pointing at each other,
    CALL arguments as the prototype says, a selector register for every objc_msgSend. Raises ``VerifyError``.

    A CALL record that appears at several pcs (linearize shares the record of a repeated call) is checked once:
    what it reads was defined before its first pc, so also before the others.
    """
    defined = set(program.consts) | set(program.objects) | set(program.selectors)
    defined |= {r for r, _, _ in program.variables.values()}
    n = program.nregs
    stack: list[int] = []
    instrs = program.instrs
    known, passed = frozenset(INSTRUCTIONS), set()  # passed: ids of records checked at an earlier pc

    def fail(pc: int, problem: str) -> VerifyError:
        return VerifyError(pass_name, None, f"instruction {pc} ({program.format(pc)}): {problem}")

    for pc, ins in enumerate(instrs):
        if id(ins) in passed:
            continue
        if type(ins) not in known:
            raise VerifyError(pass_name, None, f"instruction {pc}: {type(ins).__name__} is not an instruction "
                              f"(mtlir.program.instructions): {ins!r}")
        for r in ins.reads():
            if not isinstance(r, int) or not 0 <= r < n:
                raise fail(pc, f"operand {r!r} is not a register")
            if r not in defined:
                raise fail(pc, f"reads r{r} before anything defines it")
        dst = ins.dst
        if dst >= 0:
            if dst >= n:
                raise fail(pc, f"writes r{dst}, beyond nregs = {n}")
            defined.add(dst)
        match ins:
            case Call(fn=fn, proto=proto, args=args):
                if len(args) != len(proto.args):
                    raise fail(pc, f"{len(args)} arguments for the prototype {proto}")
                if fn == "objc_msgSend" and args[1] not in program.selectors:
                    raise fail(pc, "objc_msgSend without a selector register as argument 1")
                if fn == "objc_msgSend" and program.selectors[args[1]] not in SELECTORS:
                    raise fail(pc, f"selector {program.selectors[args[1]]!r} is not in the selector table")
                passed.add(id(ins))
            case Range():
                stack.append(pc)
            case End(counter=counter, range_pc=range_pc):
                if not stack or range_pc != stack[-1]:
                    raise fail(pc, "END does not close the innermost open RANGE")
                head = instrs[stack.pop()]
                assert type(head) is Range  # the stack holds the pcs of RANGEs
                if head.end_pc != pc or head.dst != counter:
                    raise fail(range_pc, f"RANGE names END {head.end_pc} and counter r{head.dst}")
    if stack:
        raise fail(stack[-1], "RANGE without END")
    for name, r in program.results.items():
        if r not in defined:
            raise VerifyError(pass_name, None, f"result {name!r} is r{r}, which nothing defines")

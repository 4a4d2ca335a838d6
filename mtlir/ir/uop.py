"""UOp: the immutable, hash-consed node of the mtlir IR.

Building the same node twice returns the same object (``is``), so structural equality is identity and "did this
pass change anything" is ``new is old``. The intern table holds weak references only: a node nobody references is
freed and leaves the table (``mtlir.ir.interning``: ``argkey``, the table, ``gc_paused``). Args are keyed by type
and value: ``-0.0`` and ``0.0`` are different constants, every NaN is one constant, and ``1``, ``True`` and ``1.0``
never merge.

A UOp is a value of the graph, chosen per submit, so Python's conversions of one (``bool()`` for ``if`` and
``max()``, ``int()``, ``float()``, ``operator.index``) answer only for an expression with one value for every value of
its variables and raise ``TypeError`` naming the expression otherwise; ``==`` against a number raises too (``n == 0``
would always be False): the graph's own ``maximum``, ``minimum``, ``where``, ``eq`` and ``ne`` build the nodes.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterator
from numbers import Number
from typing import Any

from mtlir.ir.conversions import compare_message, conversion_message, describe, division
from mtlir.ir.dtypes import DType, PtrDType, dtypes, wrap
from mtlir.ir.interning import ATOMS, NONE_KEY, argkey, gc_paused, live_nodes, src_keys, src_table, table
from mtlir.ir.ops import GroupOp, Ops

# argkey, live_nodes and gc_paused live in mtlir.ir.interning; importers of mtlir.ir.uop keep finding them here
__all__ = ["UOp", "argkey", "live_nodes", "gc_paused"]

_weakref = weakref.ref


def _const_cast(dtype: DType, value: Any) -> Any:
    if dtype.kind == "bool":
        return bool(value)
    if dtype.kind == "float":
        return float(value)
    if dtype.is_word:
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"constant {value!r} is not an integer, cannot be a {dtype.name}")
            value = int(value)
        return wrap(dtype, int(value))  # as a C conversion: two's complement, pointers/ids/SELs 64-bit unsigned
    return value


def _check_fields(op: Any, dtype: Any, src: tuple[Any, ...]) -> int:
    """Validate a new node's fields; return its rank (1 + the largest rank of its sources, 0 for a leaf)."""
    if type(op) is not Ops:
        raise TypeError(f"UOp: op {op!r} is not an Ops member")
    if not isinstance(dtype, DType):
        raise TypeError(f"UOp({op!r}): dtype {dtype!r} is not a DType")
    rank = 0
    for i, s in enumerate(src):
        if type(s) is not UOp:
            raise TypeError(f"UOp({op!r}): source {i} is a {type(s).__name__} ({s!r:.80}), not a UOp")
        if s._rank >= rank:
            rank = s._rank + 1
    return rank


class _Slots:
    """The storage of a UOp. A new node is filled as a ``_Filling`` (plain slot stores, no guard) and then becomes
    a ``UOp`` (``__class__`` assignment between classes of one layout): four times cheaper than
    ``object.__setattr__`` per field, and node creation is the hot path of every pass."""

    __slots__ = ("op", "dtype", "src", "arg", "tag", "_key", "_rank", "__weakref__")
    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any
    tag: Any
    _key: tuple[Any, ...]
    _rank: int


class _Filling(_Slots):
    __slots__ = ()


class UOp(_Slots):
    """A node: ``op`` (Ops), ``dtype`` (DType), ``src`` (tuple of UOps), ``arg`` (hashable), ``tag`` (hashable).

    Construct with ``UOp(op, dtype, src, arg, tag)`` or the builders (``UOp.const``, ``UOp.variable``,
    ``x.index(i).load()``, arithmetic operators). Building the same node twice returns the same object. Raises
    ``TypeError`` when ``op`` is not an Ops, ``dtype`` not a DType, ``src`` holds a non-UOp or ``arg``/``tag`` is
    not hashable. ``_rank`` is the length of the longest path down to a leaf (0 for a leaf), so every node's
    sources have a smaller rank.
    """

    __slots__ = ()

    def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None,
                tag: Any = None) -> UOp:
        if type(src) is not tuple:
            if isinstance(src, UOp) or not hasattr(src, "__iter__"):
                raise TypeError(f"UOp({op!r}): src must be a tuple of UOps, got a {type(src).__name__}")
            src = tuple(src)
        tbl: dict[Any, weakref.ReferenceType[UOp]]
        probe: Any
        try:
            if arg is None:
                akey: Any = NONE_KEY
            elif type(arg) is int:
                akey = arg  # argkey's key of an int, without the call
            elif type(arg) is tuple and len(arg) == 2 and type(arg[0]) is int and type(arg[1]) is int:
                akey = arg  # a view's (offset, nbytes): argkey's key of a tuple of ints, without the call
            elif type(arg) in ATOMS:
                akey = (type(arg), arg)
            else:
                akey = argkey(arg)
            if akey is NONE_KEY and tag is None and src:  # keyed by src in its (op, dtype)'s table (interning)
                per = src_keys.get(op)
                key = per.get(dtype) if per is not None else None
                if key is None:
                    key = src_table(op, dtype)  # () for a bad op or dtype: the full key below, whose checks raise
                if key:
                    tbl, probe = key[2], src
            else:
                key = ()
            if not key:
                # untagged nodes (nearly all) key without the tag: 8 bytes less per node; key[3] is the arg's key
                key = (op, dtype, src, akey) if tag is None else (op, dtype, src, akey, argkey(tag))
                tbl, probe = table, key
            ref = tbl.get(probe)
        except TypeError as e:
            raise TypeError(f"UOp({op!r}, {dtype!r}): {e}") from None
        if ref is not None and (found := ref()) is not None:
            return found
        rank = 0
        for s in src:  # the common case inline; _check_fields says what is wrong
            if type(s) is not UOp:
                rank = _check_fields(op, dtype, src)
            elif s._rank >= rank:
                rank = s._rank + 1
        if type(op) is not Ops or (type(dtype) is not DType and not isinstance(dtype, DType)):
            _check_fields(op, dtype, src)
        new = object.__new__(_Filling)
        new.op, new.dtype, new.src, new.arg, new.tag, new._key, new._rank = op, dtype, src, arg, tag, key, rank
        new.__class__ = UOp  # type: ignore[assignment]
        node: UOp = new  # type: ignore[assignment]
        wr = _weakref(node)
        if (old := tbl.setdefault(probe, wr)) is not wr:  # another thread built it first, or a dead entry
            if (other := old()) is not None:
                return other
            tbl[probe] = wr
        return node

    @staticmethod
    def checked(op: Ops, dtype: DType, src: tuple[UOp, ...], arg: Any, akey: Any) -> UOp:
        """``UOp(op, dtype, src, arg)`` (untagged) for a caller that has checked its fields already: ``op`` an Ops,
        ``dtype`` a DType, ``src`` a tuple of UOps, and ``akey`` is ``argkey(arg)`` (an int, or a tuple of ints, is
        its own key; None's is ``NONE_KEY``). The front end builds a command's nodes with it: the type tests and
        the arg's keying of ``UOp.__new__`` (and the call through the type) are ~0.2 µs of a ~1 µs node. The same
        node as ``UOp(...)``: equal nodes stay one object whichever built them (tests/ir/test_interning.py)."""
        tbl: dict[Any, weakref.ReferenceType[UOp]]
        probe: Any
        key: tuple[Any, ...] | None
        if akey is NONE_KEY and src:  # keyed by src in its (op, dtype)'s table, as in __new__
            per = src_keys.get(op)
            key = per.get(dtype) if per is not None else None
            if key is None:
                key = src_table(op, dtype)
            tbl, probe = key[2], src
        else:
            tbl = table
            probe = key = (op, dtype, src, akey)
        ref = tbl.get(probe)
        if ref is not None and (found := ref()) is not None:
            return found
        rank = 0
        for s in src:
            if s._rank >= rank:
                rank = s._rank + 1
        new = object.__new__(_Filling)
        new.op, new.dtype, new.src, new.arg, new.tag, new._key, new._rank = op, dtype, src, arg, None, key, rank
        new.__class__ = UOp  # type: ignore[assignment]
        node: UOp = new  # type: ignore[assignment]
        wr = _weakref(node)
        if (old := tbl.setdefault(probe, wr)) is not wr:  # as in __new__: another thread's node, or a dead entry
            if (other := old()) is not None:
                return other
            tbl[probe] = wr
        return node

    def __del__(self) -> None:
        try:
            # one hash of the key (pop), not two (get, del): the entry is put back in the rare case it is another
            # node's (an equal node made after this one's last reference went, before this ran)
            key = self._key
            tbl = key[2]
            if type(tbl) is dict:  # keyed by src in its (op, dtype)'s table (mtlir.ir.interning)
                key = self.src
            else:
                tbl = table
            ref = tbl.pop(key, None)
            if ref is not None:
                got = ref()  # by identity (``in (None, self)`` called __eq__: ~0.4 µs per node freed)
                if got is not None and got is not self:
                    tbl.setdefault(key, ref)
        except (AttributeError, TypeError, KeyError, IndexError):  # interpreter shutdown, half-built node
            pass

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("UOp is immutable: use replace()")

    def __reduce__(self) -> tuple[Any, ...]:
        return (UOp, (self.op, self.dtype, self.src, self.arg, self.tag))

    def __copy__(self) -> UOp:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> UOp:
        return self

    # identity semantics: hash-consing makes structural equality identity
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        """Node identity (hash-consing makes it structural equality), so UOps work as dict and set keys.

        Raises ``TypeError`` against a Python number: ``n == 0`` would be ``False`` for every ``n``, even the
        constant 0; the comparison node is ``n.eq(0)``."""
        if type(other) is not UOp and isinstance(other, Number):
            raise TypeError(compare_message(self, "==", other, "eq"))
        return self is other

    def __ne__(self, other: object) -> bool:
        """Not the same node; raises ``TypeError`` against a Python number (the comparison node is ``n.ne(0)``)."""
        if type(other) is not UOp and isinstance(other, Number):
            raise TypeError(compare_message(self, "!=", other, "ne"))
        return self is not other

    # Python's implicit conversions (``if``, ``and``/``or``/``not``, max(), min(), sorted(), int(), range(), ...):
    # right for an expression with one value for every value of its variables, a TypeError naming it otherwise

    def __bool__(self) -> bool:
        """The truth value of an expression that has one value for every value of its variables: a constant, a
        comparison its variables' bounds decide (``n >= 1`` for ``n`` in ``[1, 8]``), an expression without
        variables. Raises ``TypeError`` naming the expression for any other node: a symbolic condition cannot take
        one branch of a Python ``if``, ``max()`` or ``min()`` for every value of its variables (use
        ``x.maximum(y)``, ``x.minimum(y)``, ``cond.where(a, b)``), and a node that is not a value has no truth
        value (test ``node is not None``)."""
        return bool(self._single_value("bool"))

    def __int__(self) -> int:
        """The value of an expression with one value for every value of its variables, as Python's ``int()``
        converts it. Raises ``TypeError`` naming the expression for a symbolic one or a node that is not a value."""
        return int(self._single_value("int"))

    def __index__(self) -> int:
        """The value of an integer expression with one value for every value of its variables (``range()``,
        indexing). Raises ``TypeError`` naming the expression for a symbolic one, a float, or a non-value."""
        if not self.dtype.is_word:
            raise TypeError(f"index() of {describe(self)}: a {self.dtype.name} is not an integer")
        return int(self._single_value("index"))

    def __float__(self) -> float:
        """The value of an expression with one value for every value of its variables, as a float. Raises
        ``TypeError`` naming the expression for a symbolic one or a node that is not a value."""
        return float(self._single_value("float"))

    def _single_value(self, what: str) -> Any:
        """The one value this expression takes for every value of its variables (``mtlir.ir.bounds.single_value``);
        raises ``TypeError`` naming the expression, the conversion ``what`` and what to write instead."""
        from mtlir.ir.bounds import single_value
        found, value = single_value(self)
        if not found:
            raise TypeError(conversion_message(self, what))
        return value

    def __repr__(self) -> str:
        from mtlir.ir.render import render
        if self._rank > 200:
            return f"<UOp {self.op.name} {self.dtype.name} rank={self._rank}: use mtlir.ir.render/listing to print>"
        text = render(self)
        return text if len(text) < 4000 else text[:4000] + " ..."

    def replace(self, **kwargs: Any) -> UOp:
        """A node like this one with the given fields (``op``, ``dtype``, ``src``, ``arg``, ``tag``) changed; this
        very node when nothing changes. Raises ``TypeError`` for another keyword."""
        if not _REPLACEABLE.issuperset(kwargs):
            raise TypeError(f"replace(): unknown field(s) {sorted(set(kwargs) - _REPLACEABLE)}")
        return UOp(kwargs.get("op", self.op), kwargs.get("dtype", self.dtype), kwargs.get("src", self.src),
                   kwargs.get("arg", self.arg), kwargs.get("tag", self.tag))

    # ---- traversal

    def toposort(self) -> list[UOp]:
        """Every node reachable from this one, each after all of its sources: depth-first post-order, sources
        left to right, so the order is the same in every run.

        Iterative: a 100,000-node chain and a 20,000-wide sink work at the default recursion limit."""
        order: list[UOp] = []
        placed: dict[UOp, bool] = {}  # False: sources being visited, True: in ``order``
        stack = [self]
        push, pop, get, append = stack.append, stack.pop, placed.get, order.append
        while stack:
            node = pop()
            state = get(node)
            if state is None:
                src = node.src
                if src:
                    placed[node] = False
                    push(node)
                    for s in reversed(src):
                        if s not in placed:
                            push(s)
                    continue
            elif state:
                continue
            placed[node] = True
            append(node)
        return order

    def walk(self) -> Iterator[UOp]:
        """Iterate over ``toposort()``."""
        return iter(self.toposort())

    # ---- builders

    @staticmethod
    def const(dtype: DType, value: Any) -> UOp:
        """A constant of ``dtype``; ``value`` is converted as C converts it: to the dtype's Python type (int, float,
        bool), integers wrapped to the dtype's width (``const(dtypes.uint32, -1).arg == 4294967295``,
        ``const(dtypes.int8, 300).arg == 44``; pointers, ids and SELs are 64-bit unsigned).

        Raises ``ValueError`` for a non-integral float given to an integer dtype."""
        return UOp(Ops.CONST, dtype, (), _const_cast(dtype, value))

    @staticmethod
    def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.int32) -> UOp:
        """A value bound at run time (DEFINE_VAR) of ``dtype`` with inclusive bounds ``[min_val, max_val]``.

        Raises ``TypeError`` for a name that is not a str or bounds that are not ints (``1.5`` is not silently cut
        to 1) and ``ValueError`` for an empty name, ``min_val > max_val``, or bounds outside the range of an
        integer ``dtype`` (``variable("m", 1, 2**40)`` is not an int32)."""
        if not isinstance(name, str):
            raise TypeError(f"variable {name!r}: the name is a str, got {type(name).__name__}")
        if not name:
            raise ValueError("variable: the name must be a non-empty string")
        for what, b in (("min", min_val), ("max", max_val)):
            if type(b) is not int:
                raise TypeError(f"variable {name!r}: {what} bound {b!r} is a {type(b).__name__}, not an int")
        if min_val > max_val:
            raise ValueError(f"variable {name!r}: min {min_val} > max {max_val}")
        if dtype.is_word and (min_val < dtypes.min(dtype) or max_val > dtypes.max(dtype)):
            raise ValueError(f"variable {name!r}: bounds [{min_val}, {max_val}] do not fit its dtype {dtype.name} "
                             f"[{dtypes.min(dtype)}, {dtypes.max(dtype)}]")
        return UOp(Ops.DEFINE_VAR, dtype, (), (name, min_val, max_val))

    @staticmethod
    def sink(*srcs: UOp, arg: Any = None) -> UOp:
        """A SINK keeping ``srcs`` (side effects, results) alive."""
        return UOp(Ops.SINK, dtypes.void, srcs, arg)

    def _ufix(self, x: UOp | int | float | bool, op: Ops | None = None) -> UOp:
        """``x`` as an operand next to ``self``: a UOp as it is, a Python number as a constant of ``self``'s dtype
        (an int of a pointer's: int64). Raises ``TypeError`` for anything else, or a float next to an integer."""
        if isinstance(x, UOp):
            return x
        what = f"{op.name} of {self.dtype.name}" if op is not None else f"an operand next to {self.dtype.name}"
        if not isinstance(x, (int, float)):
            raise TypeError(f"{what}: operand {x!r} is a {type(x).__name__}, not a UOp, int or float")
        dt = self.dtype if not isinstance(self.dtype, PtrDType) else dtypes.int64
        if isinstance(x, float) and not dt.is_float:
            raise TypeError(f"{what}: the float constant {x!r} does not mix with an integer expression (cast one side "
                            f"first, e.g. x.cast(dtypes.float32))")
        if dt.is_word and isinstance(x, int) and not isinstance(x, bool) and dt.kind != "bool" \
                and not dtypes.min(dt) <= x <= dtypes.max(dt):
            raise TypeError(f"{what}: the constant {x} does not fit {dt.name} [{dtypes.min(dt)}, {dtypes.max(dt)}] "
                            f"(cast first, e.g. x.cast(dtypes.int64))")
        return UOp.const(dt, x)

    def alu(self, op: Ops, *srcs: UOp | int | float) -> UOp:
        """An ALU node ``op(self, *srcs)``; Python numbers become constants of ``self``'s dtype; comparisons are
        bool; WHERE has its branches' dtype.

        Raises ``TypeError`` for an operand that is not a UOp or a number, and for operands whose dtypes do not
        mix: an integer with a float (a constant or a node; the shift amount of SHL/SHR is not checked), an int
        constant outside ``self``'s integer dtype, WHERE branches of two dtypes. Operators only build nodes; they
        never convert a value (the result has ``self``'s dtype)."""
        src = (self, *(self._ufix(s, op) for s in srcs))
        if op is Ops.WHERE:
            if src[1].dtype is not src[2].dtype:
                raise TypeError(f"WHERE: the branches are {src[1].dtype.name} and {src[2].dtype.name}; they must have "
                                "one dtype")
            dtype = src[1].dtype
        else:
            others = src[1:2] if op not in (Ops.SHL, Ops.SHR) else ()
            for s in others:
                if s.dtype.is_float != self.dtype.is_float:
                    raise TypeError(f"{op.name}: the operands are {self.dtype.name} and {s.dtype.name}; an integer and "
                                    f"a float do not mix: cast one side first (x.cast(dtypes.{self.dtype.name}))")
            dtype = dtypes.bool if op in GroupOp.Comparison else self.dtype
        return UOp(op, dtype, src)

    def __add__(self, x: UOp | int) -> UOp: return self.alu(Ops.ADD, x)
    def __radd__(self, x: UOp | int) -> UOp: return self._ufix(x).alu(Ops.ADD, self)
    def __sub__(self, x: UOp | int) -> UOp: return self.alu(Ops.SUB, x)
    def __rsub__(self, x: UOp | int) -> UOp: return self._ufix(x).alu(Ops.SUB, self)
    def __mul__(self, x: UOp | int) -> UOp: return self.alu(Ops.MUL, x)
    def __rmul__(self, x: UOp | int) -> UOp: return self._ufix(x).alu(Ops.MUL, self)
    def __floordiv__(self, x: UOp | int) -> UOp: return division(Ops.IDIV, self, self._ufix(x))
    def __rfloordiv__(self, x: UOp | int) -> UOp: return division(Ops.IDIV, self._ufix(x), self)
    def __mod__(self, x: UOp | int) -> UOp: return division(Ops.MOD, self, self._ufix(x))
    def __rmod__(self, x: UOp | int) -> UOp: return division(Ops.MOD, self._ufix(x), self)

    def __lshift__(self, x: UOp | int) -> UOp: return self.alu(Ops.SHL, x)
    def __rshift__(self, x: UOp | int) -> UOp: return self.alu(Ops.SHR, x)
    def __and__(self, x: UOp | int) -> UOp: return self.alu(Ops.AND, x)
    def __rand__(self, x: UOp | int) -> UOp: return self._ufix(x).alu(Ops.AND, self)
    def __or__(self, x: UOp | int) -> UOp: return self.alu(Ops.OR, x)
    def __ror__(self, x: UOp | int) -> UOp: return self._ufix(x).alu(Ops.OR, self)
    def __xor__(self, x: UOp | int) -> UOp: return self.alu(Ops.XOR, x)
    def __rxor__(self, x: UOp | int) -> UOp: return self._ufix(x).alu(Ops.XOR, self)
    def __neg__(self) -> UOp: return self.alu(Ops.NEG)
    def __lt__(self, x: UOp | int) -> UOp: return self.alu(Ops.CMPLT, x)
    def __le__(self, x: UOp | int) -> UOp: return self.alu(Ops.CMPLE, x)
    def __gt__(self, x: UOp | int) -> UOp: return self._ufix(x).alu(Ops.CMPLT, self)
    def __ge__(self, x: UOp | int) -> UOp: return self._ufix(x).alu(Ops.CMPLE, self)

    def eq(self, x: UOp | int) -> UOp:
        """``self == x`` as a CMPEQ node (``==`` itself is identity)."""
        return self.alu(Ops.CMPEQ, x)

    def ne(self, x: UOp | int) -> UOp:
        """``self != x`` as a CMPNE node."""
        return self.alu(Ops.CMPNE, x)

    def maximum(self, x: UOp | int) -> UOp:
        """The larger of ``self`` and ``x`` (MAX), decided per submit: ``(n // 128).maximum(1)`` keeps a size at
        least 1 where Python's ``max(n // 128, 1)`` cannot compare a run-time value (it raises ``TypeError``)."""
        return self.alu(Ops.MAX, x)

    def minimum(self, x: UOp | int) -> UOp:
        """The smaller of ``self`` and ``x`` (MIN), decided per submit (Python's ``min()`` over a run-time value
        raises ``TypeError``)."""
        return self.alu(Ops.MIN, x)

    def where(self, a: UOp | int, b: UOp | int) -> UOp:
        """``self ? a : b`` (WHERE), the graph's ``a if self else b``, decided per submit; ``a`` and ``b`` take their
        dtype from each other when one is an int."""
        a2 = a if isinstance(a, UOp) else (b._ufix(a, Ops.WHERE) if isinstance(b, UOp) else
                                           UOp.const(dtypes.int32, 0)._ufix(a, Ops.WHERE))
        b2 = b if isinstance(b, UOp) else a2._ufix(b, Ops.WHERE)
        return self.alu(Ops.WHERE, a2, b2)

    def cast(self, dtype: DType) -> UOp:
        """Convert the value to ``dtype`` (CAST); this node itself when the dtype already matches."""
        return self if self.dtype is dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> UOp:
        """Reinterpret the bits as ``dtype`` (BITCAST)."""
        return self if self.dtype is dtype else UOp(Ops.BITCAST, dtype, (self,))

    def index(self, i: UOp | int) -> UOp:
        """The address of element ``i`` of the pointer ``self`` (INDEX, dtype: the same pointer)."""
        idx = i if isinstance(i, UOp) else UOp.const(dtypes.int64, i)
        return UOp(Ops.INDEX, self.dtype, (self, idx))

    def load(self, *deps: UOp) -> UOp:
        """Read the element at this address (LOAD); ``deps`` order the read after those side effects."""
        base = self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype
        return UOp(Ops.LOAD, base, (self, *deps))

    def store(self, value: UOp | int | float) -> UOp:
        """Write ``value`` at this address (STORE, a side effect of dtype void)."""
        base = self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype
        v = value if isinstance(value, UOp) else UOp.const(base, value)
        return UOp(Ops.STORE, dtypes.void, (self, v))

    def after(self, *deps: UOp) -> UOp:
        """This value, ordered after the side effects ``deps`` (AFTER); this node when ``deps`` is empty."""
        return UOp(Ops.AFTER, self.dtype, (self, *deps)) if deps else self

    @staticmethod
    def range(end: UOp | int, rid: int = 0, dtype: DType = dtypes.int64) -> UOp:
        """A loop counter running ``0 .. end-1`` (RANGE); ``rid`` tells apart loops with the same bound."""
        e = end if isinstance(end, UOp) else UOp.const(dtype, end)
        return UOp(Ops.RANGE, dtype, (e,), rid)

    def end(self, *effects: UOp) -> UOp:
        """Close the loop ``self`` (a RANGE) after ``effects`` (END, a side effect)."""
        if self.op is not Ops.RANGE:
            raise TypeError(f"end() closes a RANGE, not {self.op!r}")
        return UOp(Ops.END, dtypes.void, (self, *effects))

    @staticmethod
    def struct(dtype: DType, *fields: UOp | int) -> UOp:
        """A struct value (``dtypes.MTLSize`` from 3 words, ``dtypes.NSRange`` from 2) built from its fields."""
        n = len(getattr(dtype, "fields", ()))
        if n == 0 or len(fields) != n:
            raise ValueError(f"{dtype!r} takes {n} fields, got {len(fields)}")
        src = tuple(f if isinstance(f, UOp) else UOp.const(dtypes.uint64, f) for f in fields)
        return UOp(Ops.STRUCT, dtype, src)

    def gep(self, i: int) -> UOp:
        """Field ``i`` of a struct value (GEP, a uint64)."""
        return UOp(Ops.GEP, dtypes.uint64, (self,), i)

    # ---- queries

    @property
    def is_const(self) -> bool:
        """True for a CONST node."""
        return self.op is Ops.CONST

    def const_value(self) -> Any:
        """The value of a CONST; raises ``ValueError`` for any other op."""
        if self.op is not Ops.CONST:
            raise ValueError(f"{self.op!r} is not a constant")
        return self.arg

    def variables(self) -> list[UOp]:
        """The DEFINE_VAR nodes this node depends on, in toposort order."""
        return [u for u in self.toposort() if u.op is Ops.DEFINE_VAR]

    @property
    def vmin(self) -> int:
        """The smallest value this integer expression can take over its variables' bounds (``mtlir.ir.bounds``).

        Raises ``mtlir.ir.bounds.BoundsError`` for a node that is not integer arithmetic."""
        from mtlir.ir.bounds import bounds
        return bounds(self)[0]

    @property
    def vmax(self) -> int:
        """The largest value this integer expression can take over its variables' bounds (``mtlir.ir.bounds``)."""
        from mtlir.ir.bounds import bounds
        return bounds(self)[1]

    def evaluate(self, values: dict[str, int] | None = None) -> Any:
        """The value of an ALU expression over constants and variables (``values`` by variable name).

        Integer division and modulo truncate toward zero, as in C. Raises ``KeyError`` for an unbound variable
        and ``ValueError`` for an op that is not arithmetic."""
        from mtlir.ir.evaluate import evaluate
        return evaluate(self, values or {})


_REPLACEABLE = frozenset({"op", "dtype", "src", "arg", "tag"})


"""Hash-consing's machinery: the key of a node's arg (``argkey``), the intern table of live nodes
(``live_nodes``) and the garbage collector paused while a large graph is built (``gc_paused``).

The intern table maps a node's key ``(op, dtype, src, argkey(arg))`` (``+ (argkey(tag),)`` when tagged) to a weak
reference to the node: building an equal node finds it there, and a node nobody references is freed at once and
removes its own entry (``UOp.__del__``). A node with sources and neither an arg nor a tag (an EXEC, a SIGNAL, most
ALU nodes) is keyed by its ``src`` tuple alone, in a table of its ``(op, dtype)`` (``src_table``): its key is the
tuple it holds anyway, where a key tuple of its own was 72 bytes per node; its ``_key`` is then the key shared by
every node of that ``(op, dtype)``: ``(op, dtype, that table, NONE_KEY)`` (``_key[3]`` is the arg's key for every
node). Args are keyed by type and value: ``-0.0`` and ``0.0`` are different
constants, every NaN is one constant, and ``1``, ``True`` and ``1.0`` never merge.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import struct
import weakref
from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any

from mtlir.ir.dtypes import DType
from mtlir.ir.ops import Ops

if TYPE_CHECKING:
    from mtlir.ir.uop import UOp

__all__ = ["argkey", "live_nodes", "gc_paused", "NONE_KEY", "ATOMS", "table", "src_keys", "src_table"]

# arg types keyed as (type, value): Python's == already tells their values apart and they hash deterministically
# (an int is keyed as itself: no other key is an int, so it needs no type beside it, and saves a tuple per node)
ATOMS = frozenset({str, bool, type(None), bytes, Ops})
NONE_KEY = (type(None), None)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # dataclass type -> its field names (dataclasses.fields is slow)


def argkey(arg: Any) -> Any:
    """A hashable key for ``arg`` that tells apart values Python's ``==`` merges.

    Floats are keyed by their bits (``-0.0`` is not ``0.0``; every NaN is one key), every value by its type
    (``1``, ``True`` and ``1.0`` differ), recursively inside tuples, NamedTuples, frozensets and frozen
    dataclasses. Any other hashable value (e.g. a tuple subclass holding a big payload, which opts out of the
    per-element keying for speed) is keyed by its type and Python's ``==``.
    An int is its own key (every other key is a tuple: ``True`` is ``(bool, True)``), and so is a tuple of ints
    (every other tuple key starts with a type): a slot, a constant, a view's ``(offset, nbytes)`` cost no key object.
    Raises ``TypeError`` for an arg that is not hashable (a list, a dict, a mutable dataclass)."""
    t = type(arg)
    if t is int:
        return arg
    if t in ATOMS:
        return (t, arg)
    if t in _OPAQUE:  # a type keyed by Python's == before (e.g. MessageList): skip the tests below
        return _opaque(t, arg)
    if t is float:
        return (float, "nan") if arg != arg else (float, struct.pack("<d", arg))
    if t is tuple or (isinstance(arg, tuple) and hasattr(t, "_fields")):  # tuples and NamedTuples
        if t is tuple and all([type(a) is int for a in arg]):  # (offset, nbytes) and the like: the tuple itself
            return arg  # (no other key is a tuple of ints: each starts with a type; saves a tuple per view node)
        return (t, tuple([argkey(a) for a in arg]))
    if isinstance(arg, (Enum, DType)):
        return (t, arg)
    if hasattr(t, "__dataclass_fields__") and not isinstance(arg, type):  # dataclasses.is_dataclass, inline
        if not t.__dataclass_params__.frozen:
            raise TypeError(f"a {t.__name__} is a mutable dataclass: only frozen dataclasses can be args")
        # the key is kept on the instance (outside its fields: eq, hash and repr do not see it), so a Prototype or
        # a placeholder used by thousands of nodes is keyed once
        cache = getattr(arg, "__dict__", None)
        if cache is not None and (key := cache.get("_mtlir_argkey")) is not None:
            return key
        names = _FIELD_NAMES.get(t)
        if names is None:
            names = _FIELD_NAMES[t] = tuple(f.name for f in dataclasses.fields(arg))
        key = (t, tuple([argkey(getattr(arg, n)) for n in names]))
        if cache is not None:
            cache["_mtlir_argkey"] = key
        return key
    if t is frozenset:
        return (frozenset, frozenset([argkey(a) for a in arg]))
    key = _opaque(t, arg)
    _OPAQUE.add(t)
    return key


def _opaque(t: type, arg: Any) -> Any:
    """The key of a value keyed by its type and Python's ``==``; raises ``TypeError`` when it is not hashable."""
    try:
        hash(arg)
    except TypeError:
        raise TypeError(f"a {t.__name__} is not hashable: args and tags must be immutable values") from None
    return (t, arg)


_OPAQUE: set[type] = set()  # types argkey keyed by value (its last case): the same for every instance of the type


# the intern table: node key -> weak reference; a node removes its own entry when it is freed (UOp.__del__)
table: dict[tuple[Any, ...], weakref.ReferenceType[UOp]] = {}

# nodes with sources and no arg or tag: op -> dtype -> the key they share, (op, dtype, their table, NONE_KEY), whose
# table maps a node's src tuple to a weak reference to it (module docstring)
src_keys: dict[Ops, dict[DType, tuple[Any, ...]]] = {}


def src_table(op: Ops, dtype: DType) -> tuple[Any, ...]:
    """The shared key ``(op, dtype, table, NONE_KEY)`` of the nodes of ``op`` and ``dtype`` with sources and no arg
    or tag (made at the first such node); ``()`` when ``op`` is not an Ops or ``dtype`` not a DType (the node's
    own checks then raise)."""
    if type(op) is not Ops or not isinstance(dtype, DType):
        return ()
    per = src_keys.setdefault(op, {})
    key = per.get(dtype)
    if key is None:
        key = per.setdefault(dtype, (op, dtype, {}, NONE_KEY))
    return key


def live_nodes() -> int:
    """How many UOps are alive (the size of the intern tables); freed nodes leave them at once."""
    return len(table) + sum(len(key[2]) for per in list(src_keys.values()) for key in list(per.values()))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector inside the block (reference counting still frees every node at once;
    the collector is re-enabled on the way out if it was on). Building or lowering a large graph allocates a few
    tracked objects per node, and every full collection rescans the whole heap: at 100,000 commands the collector
    was half of ``Queue.exec``'s cost (8 of 16 µs per command) and grew the lowering from 7 to 12 µs per command.
    UOps never form reference cycles (sources are older nodes), so nothing waits for the collector. Used by the
    pass pipeline and ``Trace.queue``; wrap a loop of ``Queue.exec`` calls in it the same way."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

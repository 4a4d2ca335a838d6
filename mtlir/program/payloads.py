"""Data that graph nodes carry as one value and the Program keeps: placeholder payloads and message lists.

Placeholder payloads (``Program.objects``, docs/internals.md "Placeholders") that are not plain values:
``IcbSpec`` (kind ``icb``: the command list link builds once, of ``IcbCommand``), ``Stamp`` (kind ``cbslots``:
which command buffer's GPU time goes into which timestamp slot) and ``TableEntries`` (kind ``table``). The args of
the MSGS and CALLS nodes: ``MessageList`` and ``CallList``. Each is keyed by hash-consing as one value, so a node
of 100,000 entries hashes once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from mtlir.metal import Obj

__all__ = ["IcbSpec", "IcbCommand", "IcbShape", "CommandList", "Stamp", "StampList", "MessageList", "CallList",
           "TableEntries"]


class IcbShape(NamedTuple):
    """What an ICB command shares with every command of its kind: all of ``IcbCommand`` but the bindings' byte
    offsets. ``names`` and ``indices``: per binding, the buffer's placeholder name and the buffer index; the other
    fields are ``IcbCommand``'s. Encode makes one per distinct kind, and the commands of a kind point to it."""

    pipeline: str
    names: tuple[str, ...]
    indices: tuple[int, ...]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    barrier: bool
    symbolic: bool
    variables: tuple[tuple[str, int], ...]
    rebound: tuple[int, ...]
    extents: tuple[int, ...]


def _icb_command(items: tuple[Any, ...]) -> IcbCommand:
    """An ``IcbCommand`` from its stored items ``(shape, *offsets)`` (unpickling)."""
    return tuple.__new__(IcbCommand, items)


class IcbCommand(tuple):  # type: ignore[type-arg]
    """One command of the ICB, as link builds it once (METAL.md §1): ``setComputePipelineState:`` with the
    pipeline placeholder named ``pipeline``; ``setKernelBuffer:offset:atIndex:`` per entry of ``bindings``
    ``(placeholder name, byte offset, buffer index)`` — the buffer parameters, then the variables buffer slot of
    each ``constant int&`` parameter; ``concurrentDispatchThreadgroups:threadsPerThreadgroup:`` with ``grid``
    (threadgroups) and ``threadgroup`` (threads), where an entry set per submit is 0 (``symbolic`` is then True:
    the Program sends this run's sizes); ``setBarrier`` when ``barrier``. ``variables`` names the variable of each
    variables-buffer binding ``(name, buffer index)``; ``rebound`` lists the buffer indices a submit binds
    (buffer variables), which link leaves unbound. ``extents``: per entry of ``bindings``, the bytes of the view (or
    buffer) bound there from its offset, 0 where unknown (empty: none known); the ``barriers`` pass decides on them.

    Built as ``IcbCommand(pipeline, bindings, grid, threadgroup, barrier=True, symbolic=False, variables=(),
    rebound=(), extents=())`` and read by those names (and ``_replace``, ``_asdict``, ``_fields``, like a
    NamedTuple). Stored as the tuple ``(shape, *offsets)``: an ``IcbShape`` (every field but the offsets, shared
    by the commands of one kind: encode makes each once) and the bindings' byte offsets, so a command of four
    bindings is an 80-byte tuple, not a 9-field record with a tuple of binding triples (~256 bytes per command at
    100,000). ``shape`` and ``offsets`` read them directly; ``of(shape, offsets)`` builds one at C speed. Two
    commands are equal when every field is; iterating one yields its stored items, not its fields."""

    __slots__ = ()
    _fields = ("pipeline", "bindings", "grid", "threadgroup", "barrier", "symbolic", "variables", "rebound",
               "extents")

    def __new__(cls, pipeline: str, bindings: tuple[tuple[str, int, int], ...] | list[tuple[str, int, int]],
                grid: tuple[int, int, int], threadgroup: tuple[int, int, int], barrier: bool = True,
                symbolic: bool = False, variables: tuple[tuple[str, int], ...] = (), rebound: tuple[int, ...] = (),
                extents: tuple[int, ...] = ()) -> IcbCommand:
        binds = tuple(bindings)
        shape = IcbShape(pipeline, tuple(b[0] for b in binds), tuple(b[2] for b in binds), grid, threadgroup,
                         barrier, symbolic, variables, rebound, extents)
        return tuple.__new__(cls, (shape, *(b[1] for b in binds)))

    @staticmethod
    def of(shape: IcbShape, offsets: tuple[int, ...] | list[int]) -> IcbCommand:
        """The command of kind ``shape`` with the bindings' byte ``offsets`` (one per ``shape.names``)."""
        return tuple.__new__(IcbCommand, (shape, *offsets))

    @property
    def shape(self) -> IcbShape:
        """Every field but the offsets, shared by the commands of one kind."""
        shape: IcbShape = self[0]
        return shape

    @property
    def offsets(self) -> tuple[int, ...]:
        """The byte offset of each binding, in ``bindings`` order."""
        return self[1:]

    @property
    def pipeline(self) -> str:
        """The pipeline placeholder's name."""
        return self[0].pipeline  # type: ignore[no-any-return]

    @property
    def bindings(self) -> tuple[tuple[str, int, int], ...]:
        """``(placeholder name, byte offset, buffer index)`` per binding (a new tuple at each read)."""
        shape = self[0]
        return tuple(zip(shape.names, self[1:], shape.indices))

    @property
    def grid(self) -> tuple[int, int, int]:
        """Threadgroups per grid, 0 where set per submit."""
        return self[0].grid  # type: ignore[no-any-return]

    @property
    def threadgroup(self) -> tuple[int, int, int]:
        """Threads per threadgroup, 0 where set per submit."""
        return self[0].threadgroup  # type: ignore[no-any-return]

    @property
    def barrier(self) -> bool:
        """``setBarrier`` on this command."""
        return self[0].barrier  # type: ignore[no-any-return]

    @property
    def symbolic(self) -> bool:
        """Sizes set by each submit."""
        return self[0].symbolic  # type: ignore[no-any-return]

    @property
    def variables(self) -> tuple[tuple[str, int], ...]:
        """``(variable name, buffer index)`` of each variables-buffer binding."""
        return self[0].variables  # type: ignore[no-any-return]

    @property
    def rebound(self) -> tuple[int, ...]:
        """The buffer indices each submit binds (buffer variables)."""
        return self[0].rebound  # type: ignore[no-any-return]

    @property
    def extents(self) -> tuple[int, ...]:
        """Bytes of the view or buffer at each binding from its offset, 0 where unknown."""
        return self[0].extents  # type: ignore[no-any-return]

    def _asdict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}

    def _replace(self, **changes: Any) -> IcbCommand:
        """This command with the given fields changed (``TypeError`` for a name that is not a field)."""
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise TypeError(f"IcbCommand._replace: unknown field(s) {sorted(unknown)}")
        return IcbCommand(**{**self._asdict(), **changes})

    def __reduce__(self) -> tuple[Any, ...]:
        return (_icb_command, (tuple(self),))

    def __repr__(self) -> str:
        return "IcbCommand(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields) + ")"


class CommandList(tuple):  # type: ignore[type-arg]
    """A tuple of ``IcbCommand`` keyed as one value by ``argkey`` (hash-consing does not descend into it: keying
    100,000 frozen dataclasses one by one costs ~34 µs per command). Its hash is computed once (tuples do not cache
    theirs: the ICB placeholder holding it is hashed about ten times per lowering) and from a sample, the length
    and the first, middle and last commands: equal lists hash alike, and two different lists that collide cost one
    ``==`` (C, stops at the first difference); hashing every command was ~0.1 µs per command, twice per lowering
    (encode's list and barriers'). Equal to a plain tuple of the same commands, as before, but not hashed like one:
    argkey keys it with its type, so the two never meet in one table."""

    def __hash__(self) -> int:
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            n = len(self)
            h = self.__dict__["_hash"] = hash((CommandList, n, self[0], self[n // 2], self[-1]) if n else
                                              (CommandList, 0))
        return h

    def __reduce__(self) -> tuple[Any, ...]:
        return (CommandList, (tuple(self),))  # not the cached hash: a string's hash differs between processes

    def __repr__(self) -> str:
        return f"CommandList(<{len(self)} commands>)"


class _Payload(tuple):  # type: ignore[type-arg]
    """A tuple keyed as one value by ``argkey`` whose hash is computed once (tuples do not cache theirs): a node
    holding thousands of entries is rebuilt by several passes, and each build hashes its key."""

    def __hash__(self) -> int:
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is type(self) and tuple.__eq__(self, other))

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (tuple(self),))


class MessageList(_Payload):
    """The arg of an MSGS node: void Objective-C messages to the node's receiver (``src[0]``), in order, as data.
    Each entry is ``(selector, refs)``: ``refs`` are the indices in ``src`` of the arguments, one per argument of
    the selector's Metal signature (``mtlir.metal.SELECTORS``), typed as for a MSG (structs as STRUCT values)."""

    def __repr__(self) -> str:
        return f"MessageList(<{len(self)} messages>)"


class CallList(_Payload):
    """The arg of a CALLS node (an MSGS after ``abi``): void foreign calls, in order, as data. Each entry is
    ``(function, selector, Prototype, refs)``; ``refs`` are the indices in ``src`` of every argument of the
    prototype (for ``objc_msgSend``: the receiver ``0``, the SEL, then the arguments as the target passes them)."""

    def __repr__(self) -> str:
        return f"CallList(<{len(self)} calls>)"


class TableEntries(_Payload):
    """The payload of a ``table`` placeholder (docs/internals.md): one entry per iteration of a profiled loop, an
    int or a placeholder (``Obj``); keyed as one value, so a table of 100,000 placeholders hashes once, by the
    placeholders' names (an Obj's own hash walks its payload: a pipeline's Kernel, ~3 µs an entry); equal tables
    have equal names, so the hash agrees with ``==``."""

    def __hash__(self) -> int:
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(tuple([e.name if type(e) is Obj else e for e in self]))
        return h

    def __repr__(self) -> str:
        return f"TableEntries(<{len(self)} entries>)"


@dataclass(frozen=True)
class IcbSpec:
    """The payload of the ICB placeholder: ``commands`` (a ``CommandList`` of ``IcbCommand``, in ICB order),
    ``pipelines`` and ``buffers`` (the placeholders the commands name, each once, in first-use order, so link
    finds every object it must make), ``max_bind_count`` (``setMaxKernelBufferBindCount:``: the largest buffer
    index bound + 1, at most 31)."""

    commands: CommandList
    pipelines: tuple[Obj, ...]
    buffers: tuple[Obj, ...]
    max_bind_count: int

    def __repr__(self) -> str:
        return f"IcbSpec({len(self.commands)} commands, {len(self.pipelines)} pipelines, {len(self.buffers)} buffers)"


class Stamp(NamedTuple):
    """A timestamp slot of a profiled submit: slot ``slot`` gets ``which`` (``"GPUStartTime"`` or
    ``"GPUEndTime"``, seconds) of the command buffer in ``cbslots[cb]``."""

    slot: int
    cb: int
    which: str


class StampList(tuple):  # type: ignore[type-arg]
    """The ``Stamp`` entries of a profiled submit's ``cbslots`` payload, keyed as one value by ``argkey`` (keying
    each Stamp's fields one by one cost ~3.5 µs per timestamp); equal to the plain tuple of the same Stamps."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"StampList({tuple(self)!r})" if len(self) <= 8 else f"StampList(<{len(self)} stamps>)"


def _register_arg_types() -> None:
    """Make the payload types printable by ``mtlir.ir.render`` (its hook takes frozen dataclasses; the tuple types
    register once it accepts them)."""
    try:
        from mtlir.ir.render import register_arg_type
    except ImportError:
        return
    for cls in (IcbSpec, IcbCommand, IcbShape, CommandList, Stamp, StampList, MessageList, CallList, TableEntries):
        try:
            register_arg_type(cls)
        except (TypeError, ValueError):
            pass


_register_arg_types()

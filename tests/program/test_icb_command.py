"""``IcbCommand``, the ICB's record per command, stored compactly as ``(IcbShape, *offsets)`` (issue 14's memory
figure): it still reads, compares, copies, pickles and prints as the record of nine fields it documents."""
from __future__ import annotations

import copy
import pickle
import sys

import pytest

from mtlir.ir.render import arg_text, namespace
from mtlir.metal import DeviceSpec
from mtlir.passes import lower
from mtlir.program.payloads import CommandList, IcbCommand, IcbShape
from mtlir.frontend.nodes import buffer, timeline_value, view
from mtlir.frontend.queue import Queue
from lowering_cases import N, SAXPY

BINDS = (("buffer:x", 0, 0), ("buffer:y", 256, 1), ("varbuf", 512, 2))


def _cmd(**changes: object) -> IcbCommand:
    fields: dict[str, object] = dict(pipeline="pipeline:a", bindings=BINDS, grid=(0, 1, 1), threadgroup=(32, 1, 1),
                                     barrier=True, symbolic=True, variables=(("n", 2),), rebound=(3,),
                                     extents=(64, 4096, 0))
    fields.update(changes)
    return IcbCommand(**fields)  # type: ignore[arg-type]


def test_fields_read_as_given() -> None:
    c = _cmd()
    assert (c.pipeline, c.bindings, c.grid, c.threadgroup, c.barrier, c.symbolic, c.variables, c.rebound,
            c.extents) == ("pipeline:a", BINDS, (0, 1, 1), (32, 1, 1), True, True, (("n", 2),), (3,), (64, 4096, 0))
    assert c.offsets == (0, 256, 512) and c.shape.names == ("buffer:x", "buffer:y", "varbuf")
    assert c.shape.indices == (0, 1, 2)
    plain = IcbCommand("p", (), (1, 1, 1), (1, 1, 1))  # the defaults
    assert (plain.barrier, plain.symbolic, plain.variables, plain.rebound, plain.extents, plain.bindings) == \
        (True, False, (), (), (), ())


def test_equal_when_every_field_is() -> None:
    assert _cmd() == _cmd() and hash(_cmd()) == hash(_cmd())
    for change in ({"barrier": False}, {"bindings": BINDS[:2]}, {"grid": (1, 1, 1)}, {"extents": ()},
                   {"bindings": (("buffer:x", 0, 0), ("buffer:y", 0, 1), ("varbuf", 512, 2))}):
        assert _cmd(**change) != _cmd(), change


def test_replace_asdict_pickle_copy() -> None:
    c = _cmd()
    r = c._replace(barrier=False, bindings=BINDS[:1])
    assert type(r) is IcbCommand and r.barrier is False and r.bindings == BINDS[:1] and r.pipeline == c.pipeline
    assert c._asdict()["bindings"] == BINDS and list(c._asdict()) == list(IcbCommand._fields)
    with pytest.raises(TypeError, match="unknown field"):
        c._replace(bogus=1)
    for other in (pickle.loads(pickle.dumps(c)), copy.deepcopy(c), copy.copy(c)):
        assert type(other) is IcbCommand and other == c
    assert "bindings=(('buffer:x', 0, 0)" in repr(c)


def test_text_form_round_trips() -> None:
    c = _cmd()
    text = arg_text(c)
    assert text.startswith("IcbCommand(pipeline='pipeline:a', bindings=")
    assert eval(text, namespace()) == c  # the text form's constructor call, by field names


def test_of_shares_the_shape() -> None:
    c = _cmd()
    d = IcbCommand.of(c.shape, (8, 16, 24))
    assert d.shape is c.shape and d.bindings == (("buffer:x", 8, 0), ("buffer:y", 16, 1), ("varbuf", 24, 2))
    assert isinstance(c.shape, IcbShape)
    assert sys.getsizeof(d) <= sys.getsizeof((None,) * 4)  # a plain tuple's size: no record of its own


def test_lowered_commands_of_one_kind_share_a_shape() -> None:
    """Eight commands of one kernel on views of one buffer at other offsets: one IcbShape for all (the barriers
    pass's twins too: with the views apart, a command after the first needs no barrier)."""
    x, y = buffer("x", 1 << 20), buffer("y", 1 << 20)
    q = Queue(DeviceSpec("Apple7"))
    for i in range(8):
        q.exec(SAXPY, [view(x, 4096 * i, 4096), y], [N], (4,), (32,))
    q.signal(q.timeline, timeline_value())
    lowered = lower(q.submit(), target="arm64")
    specs = [o.payload[0] for o in lowered.program.objects.values() if o.kind == "icb"]
    cmds = specs[0].commands
    assert isinstance(cmds, CommandList) and all(type(c) is IcbCommand for c in cmds) and len(cmds) == 8
    assert [c.offsets[0] for c in cmds] == [4096 * i for i in range(8)]
    assert len({id(c.shape) for c in cmds}) == len({c.shape for c in cmds})  # equal kinds are one object

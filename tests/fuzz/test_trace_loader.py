"""Bad input to the trace loader (issue 13, "Bad input, everywhere"): every field of real traces removed, mistyped,
negative, huge or out of range, and hypothesis's JSON values anywhere in a trace. The only error allowed is the
loader's own ``TraceError`` (an ``InputError``) naming the field, and the dispatch when the bad field is in one; a
trace that loads must build its queue graph (or refuse it with a ``TraceError``) and its initial data. Huge sizes
are refused before anything is allocated: ``tracemalloc`` watches every mutation to a huge value.
"""
from __future__ import annotations

import copy
import json
import re
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtlir.errors import InputError
from mtlir.frontend.trace import TraceError, load_trace, parse_trace

from no_hang import no_hang

TRACES = Path(__file__).parents[2] / "examples" / "traces"
SMALL = ("symbolic_kv.apple7.json", "conv.apple9.json")
# the campaign (make fuzz: a profile of more examples than the suite's) mutates every field of every trace
EVERY = tuple(sorted(p.name for p in TRACES.glob("*.json"))) if settings().max_examples > 300 else SMALL
HUGE = (2**31, 2**36 + 1, 2**60, 2**64)
# missing, mistyped (null, bool, string, float, list, object), negative, zero, huge, out of any range
BAD_VALUES: tuple[Any, ...] = (None, True, "x", -1, 0, 1.5, [], {}, -2**31 - 1, *HUGE)
ALLOC_LIMIT = 32 << 20  # bytes: what loading one of the small traces may allocate at its peak, far below any huge size


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into the JSON ``value``: dict keys and list indices, the containers themselves included."""
    if path:
        yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for j, v in enumerate(value):
            yield from _paths(v, (*path, j))


def _field(path: tuple[Any, ...]) -> str:
    """A path as the loader names fields: ``dispatches[2].args[0].offset``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _with(data: Any, path: tuple[Any, ...], value: Any, remove: bool = False) -> Any:
    """``data`` with the field at ``path`` set to ``value`` (or removed); only the containers on the path are
    copied (the loader never changes its input)."""
    out = copy.copy(data)
    parent = out
    for p in path[:-1]:
        parent[p] = copy.copy(parent[p])
        parent = parent[p]
    if remove:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


def load_checked(data: Any, mutated: tuple[Any, ...] = ()) -> None:
    """Load ``data``: success (then the queue graph and the initial data are built too) or a ``TraceError`` that
    names a field; when the mutated field is in dispatch i (``dispatches[i]...``), the error names that dispatch."""
    try:
        with no_hang(what="loading a trace"):
            trace = parse_trace(data, "fuzz.json")
            trace.queue()
        for placeholder, (offset, init) in trace.initial_data(full=False).items():
            assert offset + len(init) <= trace.buffers[placeholder.removeprefix("buffer:")].size
        trace.output.expected_array()
    except TraceError as e:
        assert isinstance(e, InputError)
        assert e.field and e.field in str(e), f"the error names no field: {e}"
        m = re.match(r"dispatches\[(\d+)\]", _field(mutated))
        if m and mutated[2:]:
            assert e.field.startswith(m.group(0)), \
                f"mutating {_field(mutated)} gave an error that does not name its dispatch: {e}"


@pytest.fixture(scope="module", params=EVERY)
def trace_json(request: Any) -> Any:
    return json.loads((TRACES / request.param).read_text())


def test_every_field_removed_or_replaced(trace_json: Any) -> None:
    """Each field removed, and replaced by each of ``BAD_VALUES``: only the loader's error, and for a huge value
    nothing allocated near its size."""
    checked = 0
    for path in _paths(trace_json):
        load_checked(_with(trace_json, path, None, remove=True), path)
        for value in BAD_VALUES:
            mutated = _with(trace_json, path, value)
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**31:
                tracemalloc.start()
                try:
                    load_checked(mutated, path)
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                assert peak < ALLOC_LIMIT, f"{_field(path)} = {value}: {peak} bytes allocated while loading"
            else:
                load_checked(mutated, path)
            checked += 1
    assert checked > 500


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                      max_size=4), max_leaves=12)


@settings(max_examples=max(150, settings().max_examples), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=json_values)
def test_any_json_value(data: Any) -> None:
    """Any JSON value as a whole trace."""
    load_checked(data)


@settings(max_examples=max(300, settings().max_examples), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(EVERY), pick=st.integers(0, 10**6), value=json_values, remove=st.booleans())
def test_any_json_value_anywhere(which: str, pick: int, value: Any, remove: bool) -> None:
    """A real trace with any JSON value at any of its fields (or the field removed)."""
    data = _TRACE_CACHE.setdefault(which, json.loads((TRACES / which).read_text()))
    paths = _PATH_CACHE.setdefault(which, list(_paths(data)))
    path = paths[pick % len(paths)]
    load_checked(_with(data, path, value, remove), path)


_TRACE_CACHE: dict[str, Any] = {}
_PATH_CACHE: dict[str, list[tuple[Any, ...]]] = {}


@settings(max_examples=max(100, settings().max_examples), deadline=None)
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_load_trace_any_bytes(raw: bytes, tmp_path_factory: Any) -> None:
    """Any file: not UTF-8, not JSON, not an object: a ``TraceError`` naming the file."""
    path = tmp_path_factory.mktemp("trace") / "t.json"
    path.write_bytes(raw)
    try:
        load_trace(path)
    except TraceError as e:
        assert str(path) in str(e)

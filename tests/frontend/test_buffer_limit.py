"""One buffer limit for the queue builder and the trace loader (issue 9): ``buffer("x", 2**40)`` was accepted by
the builder while the loader refused a size above 2**36."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MLP7 = ROOT / "examples" / "traces" / "mlp.apple7.json"


def _trace_with_buffer_size(tmp_path: Path, size: int) -> Path:
    doc = json.loads(MLP7.read_text())
    doc["buffers"]["3"]["size"] = size
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_queue_builder_and_the_trace_loader_share_one_buffer_limit(tmp_path: Path) -> None:
    from mtlir.frontend.nodes import MAX_BUFFER_BYTES, QueueError, buffer
    from mtlir.frontend.trace import TraceError, load_trace
    assert buffer("x", MAX_BUFFER_BYTES).arg == ("x", MAX_BUFFER_BYTES)
    with pytest.raises(QueueError, match=r"buffer 'x': 1099511627776 bytes is above 2\*\*36 \(64 GiB\)"):
        buffer("x", 2**40)
    with pytest.raises(TraceError, match=r"buffers\.3\.size.*above 2\*\*36 \(64 GiB\)"):
        load_trace(_trace_with_buffer_size(tmp_path, MAX_BUFFER_BYTES + 1))

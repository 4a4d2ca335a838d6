"""Differential fuzzing (issue 13): random valid queues lowered by the default pipeline for random targets and run on
the simulated Metal device must leave every buffer byte for byte as a plain pyopencl run of the same kernels in
the same order does (``reference_cl``), which must agree with the kernels' numpy meaning, and each submit must send
the messages of the documented formula (``message_formula``; docs/lowering.md, "Messages per submit").

The normal suite runs ``FUZZ_EXAMPLES`` examples; ``make fuzz`` runs the ``fuzz`` profile (many more) and saves a
failing queue as JSON into tests/fuzz/regressions/, which ``test_regressions`` replays (docs/fuzzing.md).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from message_formula import messages_per_submit
from queue_spec import QueueSpec, run_sim, schedule
from reference_cl import Reference, numpy_model
from strategies import queue_specs

REGRESSIONS = Path(__file__).parent / "regressions"
FUZZ_EXAMPLES = 200  # the normal suite's examples; a profile that asks for more (``fuzz``) gets its own number
CAMPAIGN = settings().max_examples > FUZZ_EXAMPLES  # the loaded profile is the campaign's (make fuzz)


@pytest.fixture(scope="module")
def runner() -> Any:
    """One KernelRunner for every example: each library kernel is translated and built once."""
    from mtlir.runtime.sim.kernels.runner import KernelRunner
    return KernelRunner()


@pytest.fixture(scope="module")
def reference(runner: Any) -> Reference:
    """The pyopencl reference on the same OpenCL device as the simulated device's kernels."""
    return Reference(runner.device)


def check(spec: QueueSpec, runner: Any, reference: Reference, order_seed: int | None = None) -> None:
    """Run ``spec`` on the simulated device and the reference; every difference fails, naming the submit, the
    buffer and the first element that differs."""
    want = reference.run(spec)
    model = numpy_model(spec)
    for k, (w, m) in enumerate(zip(want, model)):
        assert w == m, f"submit {k}: the pyopencl reference disagrees with the kernels' numpy meaning"
    if len(spec.queues()) > 1:  # the queues' waits leave no race: another order they allow gives the same bytes
        assert numpy_model(spec, schedule(spec)) == model, "the queues race: the order of their waits is not enough"
    got = run_sim(spec, runner, order_seed)
    expected = messages_per_submit(spec)
    bound = {name for op in spec.ops if op.out is not None
             for v in (op.out, *op.ins) for name in spec.instances(v.buffer)}
    for k, (snap, msgs) in enumerate(zip(got.buffers, got.messages)):
        assert bound <= set(snap), f"submit {k}: buffers {sorted(bound - set(snap))} were not read back"
        for name, data in snap.items():
            if data != want[k][name]:
                first = next(j for j in range(0, len(data), 4) if data[j:j + 4] != want[k][name][j:j + 4]) // 4
                raise AssertionError(f"submit {k}: buffer {name} differs from the reference from element {first}")
        assert len(msgs) == expected, f"submit {k}: {len(msgs)} messages, the formula says {expected}: {msgs}"


_SAVE_AS = REGRESSIONS / f"queue-{time.strftime('%Y%m%d-%H%M%S')}.json"


def _save(spec: QueueSpec, order_seed: int | None) -> None:
    """Keep a failing queue as a regression (only in the campaign: ``make fuzz`` loads the profile). One file per
    campaign, written at every failure: hypothesis runs the smallest failing example last, so that is what stays."""
    if not CAMPAIGN:
        return
    REGRESSIONS.mkdir(exist_ok=True)
    doc = json.loads(spec.to_json())
    doc["order_seed"] = order_seed
    _SAVE_AS.write_text(json.dumps(doc, indent=1) + "\n")


@settings(max_examples=max(FUZZ_EXAMPLES, settings().max_examples), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=queue_specs(), order_seed=st.none() | st.integers(0, 2**16))
def test_sim_equals_reference(spec: QueueSpec, order_seed: int | None, runner: Any, reference: Reference) -> None:
    try:
        check(spec, runner, reference, order_seed)
    except Exception:
        _save(spec, order_seed)
        raise


@pytest.mark.parametrize("path", sorted(REGRESSIONS.glob("*.json")), ids=lambda p: p.name)
def test_regressions(path: Path, runner: Any, reference: Reference) -> None:
    """Every queue a campaign found failing, replayed (with its adversarial order seed where it had one)."""
    doc = json.loads(path.read_text())
    seed = doc.pop("order_seed", None)
    check(QueueSpec.from_json(json.dumps(doc)), runner, reference, seed)

"""Differential fuzzing (issue 13): random valid queues lowered by the default pipeline for random targets and run on
the simulated Metal device must leave every buffer byte for byte as a plain pyopencl run of the same kernels in
the same order does (``reference_cl``), which must agree with the kernels' numpy meaning, and each submit must send
the messages of the documented formula (``message_formula``; docs/lowering.md, "Messages per submit").

The normal suite runs ``FUZZ_EXAMPLES`` examples; ``make fuzz`` runs the ``fuzz`` profile (many more) and saves a
failing queue as JSON into tests/fuzz/regressions/, which ``test_regressions`` replays (docs/fuzzing.md).
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from message_formula import messages_per_submit
from queue_spec import QueueSpec, run_sim
from reference_cl import Reference, numpy_model
from strategies import queue_specs

REGRESSIONS = Path(__file__).parent / "regressions"
FUZZ_EXAMPLES = 200  # the normal suite's examples; a profile that asks for more (``fuzz``) gets its own number
CAMPAIGN = settings.default.max_examples > FUZZ_EXAMPLES  # the loaded profile: the long campaign of make fuzz


def _has_order_seed() -> bool:
    from mtlir.runtime.sim.device import SimDevice
    return "order_seed" in inspect.signature(SimDevice).parameters


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
    got = run_sim(spec, runner, order_seed)
    expected = messages_per_submit(spec)
    for k, (snap, msgs) in enumerate(zip(got.buffers, got.messages)):
        for i, data in snap.items():
            if data != want[k][i]:
                first = next(j for j in range(0, len(data), 4) if data[j:j + 4] != want[k][i][j:j + 4]) // 4
                raise AssertionError(f"submit {k}: buffer b{i} differs from the reference from element {first}")
        assert len(msgs) == expected, f"submit {k}: {len(msgs)} messages, the formula says {expected}: {msgs}"


def _save(spec: QueueSpec, order_seed: int | None) -> None:
    """Keep a failing queue as a regression (only in the fuzz campaign: ``make fuzz`` sets the profile)."""
    if not CAMPAIGN:
        return
    REGRESSIONS.mkdir(exist_ok=True)
    text = spec.to_json()
    name = f"queue-{abs(hash(text)) % 10**8:08d}.json"
    (REGRESSIONS / name).write_text(text if order_seed is None else
                                    text[:-1] + f',\n "order_seed": {order_seed}\n}}')


@settings(max_examples=max(FUZZ_EXAMPLES, settings.default.max_examples), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.function_scoped_fixture])
@given(spec=queue_specs(), order_seed=st.none() | st.integers(0, 2**16))
def test_sim_equals_reference(spec: QueueSpec, order_seed: int | None, runner: Any, reference: Reference) -> None:
    seed = order_seed if _has_order_seed() else None
    try:
        check(spec, runner, reference, seed)
    except Exception:
        _save(spec, seed)
        raise


@pytest.mark.parametrize("path", sorted(REGRESSIONS.glob("*.json")), ids=lambda p: p.name)
def test_regressions(path: Path, runner: Any, reference: Reference) -> None:
    """Every queue a campaign found failing, replayed (with its adversarial order seed where it had one)."""
    import json
    seed = json.loads(path.read_text()).pop("order_seed", None)
    text = json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "order_seed"})
    check(QueueSpec.from_json(text), runner, reference, seed if _has_order_seed() else None)

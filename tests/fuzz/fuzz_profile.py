"""A pytest plugin that registers the hypothesis profile ``fuzz`` of the long campaign (``make fuzz``:
``pytest -p fuzz_profile --hypothesis-profile=fuzz tests/fuzz`` with tests/fuzz on PYTHONPATH; docs/fuzzing.md).
The profile must exist before hypothesis's own plugin loads it, so it is registered here and not in a test module."""
from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("fuzz", max_examples=3000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

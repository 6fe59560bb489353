"""Fast span export for the tracing tests: the batch processor exports every 50 ms instead of every 5 s."""

import pytest


@pytest.fixture(autouse=True)
def _fast_batches(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")

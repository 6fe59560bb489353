"""Settings for the whole suite.

Hypothesis: the suite runs on several xdist workers beside real Envoy and engine processes, so the wall time of one
example says nothing about the code under test. Its timing checks (the per-example deadline and the health check on
slow input generation) are off; every other health check, and every property, stays.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("pointsman", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pointsman")

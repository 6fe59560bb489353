"""The servers the hostile suite attacks: one real `epp serve` per transport and set of flags, shared by the tests
that use the same ones (started afresh after a test that fails on it), stopped at the end of the session."""

from __future__ import annotations

import pytest

from tests.h2grpc.hostile import SUITE_FLAGS, Target


@pytest.fixture(scope="session")
def targets():
    started: dict[tuple[str, tuple[str, ...]], Target] = {}

    def get(transport: str, flags: tuple[str, ...] = SUITE_FLAGS) -> Target:
        key = (transport, flags)
        if key not in started:
            started[key] = Target(transport, flags)
        return started[key].ready()

    yield get
    for target in started.values():
        target.stop()


@pytest.fixture
def target(transport, targets) -> Target:
    return targets(transport)

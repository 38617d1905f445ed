"""Fixtures of the HTTP tests of server actions and moves (tests/compute)."""

from __future__ import annotations

import falcon.testing
import pytest

from agents.service import ComputeAgent
from qsched.ledger import Stores
from tests.agents.test_agent import make_agent
from tests.compute.test_compute import RecordingBus, make_app


@pytest.fixture
def rbus() -> RecordingBus:
    """The bus of the HTTP tests: what the API published, read back. Not tests.api.test_api's
    ``bus``: here that name is the conftest's, which the agents of the other tests use."""
    return RecordingBus()


@pytest.fixture
def client(conf, stores: Stores, rbus: RecordingBus) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(make_app(conf, stores, rbus))


@pytest.fixture
def two(conf, stores: Stores, bus, agents: list[ComputeAgent]) -> dict[str, ComputeAgent]:
    """Two agents of one node each (cn0, cn1), room for 8 VCPU and 16 GiB each."""
    agents += [make_agent(conf, stores, bus, f"cn{i}", nodes=1, vcpus=8, ram_mb=16384)
               for i in range(2)]  # fmt: skip
    return {agent.host: agent for agent in agents}

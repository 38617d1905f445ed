"""Fixtures of the HTTP tests of server actions and moves (tests/compute)."""

from __future__ import annotations

import falcon.testing
import pytest

from qsched.ledger import Stores
from tests.compute.test_compute import RecordingBus, make_app


@pytest.fixture
def rbus() -> RecordingBus:
    """The bus of the HTTP tests: what the API published, read back. Not tests.api.test_api's
    ``bus``: here that name is the conftest's, which the agents of the other tests use."""
    return RecordingBus()


@pytest.fixture
def client(conf, stores: Stores, rbus: RecordingBus) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(make_app(conf, stores, rbus))

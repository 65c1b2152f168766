"""Fixtures of the storage tests: one moto server for the session, a bucket of each test's own."""
from __future__ import annotations

import pytest

from storage_helpers import CuttableLink, MotoServer, new_bucket


@pytest.fixture(scope="session")
def moto(tmp_path_factory) -> MotoServer:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def bucket(moto) -> str:
    return new_bucket(moto.url)


@pytest.fixture
def link(moto) -> CuttableLink:
    """A path to the store that a test may cut and restore."""
    link = CuttableLink(moto.port)
    yield link
    if link._listener is None:
        link.restore()
    link.cut()

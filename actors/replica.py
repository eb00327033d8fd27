"""The body of one actor replica process: logging, metrics, signals, then the real engine
(vLLM) and env servers (gRPC) handed to the actor loop (actors/actor.py). `run_replica` is
shared with the tests' fake replicas (tests/fakes.py), which build a scripted engine instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable

from actors.actor import Actor
from actors.chat import ChatTemplate
from actors.config import ActorConfig, EnvConfig
from actors.replicas import ReplicaSpec
from broker.config import BrokerConfig
from protos.channel import client_credentials
from protos.client import EnvClient, GrpcEnvConnector

log = logging.getLogger(__name__)


def actor_id_of(spec: ReplicaSpec) -> str:
    return f"{socket.gethostname()}-r{spec.index}-{os.getpid()}"


BuildActor = Callable[
    [ReplicaSpec, ActorConfig, BrokerConfig], Awaitable[tuple[Actor, Callable[[], None]]]
]


def run_replica(spec: ReplicaSpec, build: BuildActor) -> None:
    """Common process body: logging, metrics, SIGTERM/SIGINT -> graceful stop, then
    `await build(spec, config, broker)` -> (Actor, cleanup) and run it."""
    from common.config import load_section

    config = load_section(ActorConfig, spec.config_path, "actor", spec.overrides)
    broker = load_section(BrokerConfig, spec.config_path, "broker", spec.overrides)
    logging.basicConfig(
        level=config.log_level,
        format=f"%(asctime)s %(levelname)s actor[{spec.index}] %(name)s: %(message)s",
    )
    from common.metrics import serve_metrics

    built: list[Actor] = []  # the actor once its engine has started
    port = serve_metrics(
        config.metrics_port + spec.index if config.metrics_port else 0,
        config.metrics_host,
        ready=lambda: bool(built) and built[0].ready,
    )
    log.info("replica %d: /metrics, /healthz, /readyz on port %d", spec.index, port)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        actor, cleanup = await build(spec, config, broker)
        built.append(actor)
        try:
            await actor.run(stop)
        finally:
            cleanup()

    asyncio.run(main())


def replica_main(spec: ReplicaSpec) -> None:
    """Entry point of a real replica process: vLLM engine + gRPC env servers."""
    run_replica(spec, _build_real)


async def _build_real(spec: ReplicaSpec, config: ActorConfig, broker: BrokerConfig):
    from transformers import AutoTokenizer

    from actors.snapshots import SnapshotSource
    from actors.vllm_engine import VllmEngine, threads_bind_for_replica
    from common.config import load_section
    from common.storage_config import StorageConfig

    tokenizer = AutoTokenizer.from_pretrained(config.engine.model)
    bind = threads_bind_for_replica(
        config.engine.cpu_threads_bind, spec.index, sorted(os.sched_getaffinity(0))
    )
    engine = await VllmEngine.start(config.engine.model_copy(update={"cpu_threads_bind": bind}))
    # No retries inside the client: the episode retries (elsewhere, with replay) per
    # `actor.env.attempts`, one layer with one backoff.
    client = env_client(config.env)
    actor = Actor(
        config=config,
        broker=broker,
        engine=engine,
        env=GrpcEnvConnector(client),
        chat=ChatTemplate(tokenizer),
        actor_id=actor_id_of(spec),
        snapshots=SnapshotSource(
            load_section(StorageConfig, spec.config_path, "storage", spec.overrides)
        ),
    )
    return actor, engine.shutdown


def env_client(config: EnvConfig):
    """The gRPC env client `[actor.env]` describes: addresses, deadline, message size, TLS."""
    tls = config.tls
    credentials = (
        client_credentials(ca_file=tls.ca_file, cert_file=tls.cert_file, key_file=tls.key_file)
        if tls.ca_file
        else None
    )
    return EnvClient(
        config.addresses,
        timeout_s=config.timeout_s,
        max_retries=0,
        max_message_bytes=config.max_message_bytes,
        credentials=credentials,
        server_name=tls.server_name,
    )

"""The body of one actor replica process: logging, metrics, signals, then the real engine
(vLLM) and env servers (gRPC) handed to the actor loop (actors/actor.py). `run_replica` is
shared with the tests' fake replicas (tests/fakes.py), which build a scripted engine instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from actors import env_health
from actors.actor import Actor
from actors.chat import ChatTemplate
from actors.config import ActorConfig, EnvConfig
from actors.replicas import ReplicaSpec, replica_metrics_port
from actors.snapshots import SnapshotSource
from actors.types import ActorEngine
from broker.config import BrokerConfig
from broker.connection import BrokerUnreachable, wait_for_broker
from broker.security import BrokerRefused
from common.supervision import EXIT_CONFIG, EXIT_UNREACHABLE
from protos.channel import client_credentials
from protos.client import EnvClient, GrpcEnvConnector
from weights.actor_side.subscription import AdapterMismatch, WeightDtypeMismatch

log = logging.getLogger(__name__)
T = TypeVar("T")


def actor_id_of(spec: ReplicaSpec) -> str:
    return f"{socket.gethostname()}-r{spec.index}-{os.getpid()}"


BuildActor = Callable[
    [ReplicaSpec, ActorConfig, BrokerConfig], Awaitable[tuple[Actor, Callable[[], None]]]
]


def run_replica(spec: ReplicaSpec, build: BuildActor, *, check_env: bool = False) -> None:
    """Common process body: logging, metrics, SIGTERM/SIGINT -> stop, then start (below) and
    run the actor until stopped.

        metrics port ─► env servers asked (check_env) ─► broker waited for ─► build (engine)
          ─► actor.run(stop)

    The broker is waited for before the engine starts, so a broker that is down is said at
    once (not after the engine's start-up), and a SIGTERM meanwhile ends the process in
    well under a second. What cannot heal ends it with one line on stderr and an exit code
    the supervisor does not restart (common/supervision.py): EXIT_CONFIG for a taken metrics
    port, a config the engine refuses (ValueError), credentials the broker refuses, or an
    engine whose dtype or LoRA rank the learner's weights do not fit;
    EXIT_UNREACHABLE for a broker that did not answer within broker.connect_timeout_s."""
    from common.config import load_section

    config = load_section(ActorConfig, spec.config_path, "actor", spec.overrides)
    broker = load_section(BrokerConfig, spec.config_path, "broker", spec.overrides)
    logging.basicConfig(
        level=config.log_level,
        format=f"%(asctime)s %(levelname)s actor[{spec.index}] %(name)s: %(message)s",
    )
    try:
        asyncio.run(_serve(spec, build, config, broker, check_env=check_env))
    except CannotStart as e:
        print(f"actor[{spec.index}]: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)


class CannotStart(Exception):
    """The replica cannot start, for a reason a restart does not fix."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


async def _serve(
    spec: ReplicaSpec,
    build: BuildActor,
    config: ActorConfig,
    broker: BrokerConfig,
    *,
    check_env: bool,
) -> None:
    from common.metrics import PortInUse, serve_metrics

    built: list[Actor] = []  # the actor once its engine has started
    port, setting = replica_metrics_port(config.metrics_port, spec.index)
    try:
        port = serve_metrics(
            port,
            config.metrics_host,
            ready=lambda: bool(built) and built[0].ready,
            setting=setting,
        )
    except PortInUse as e:
        raise CannotStart(EXIT_CONFIG, str(e)) from None
    log.info("replica %d: /metrics, /healthz, /readyz on port %d", spec.index, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    env_watch = None
    try:
        if check_env:
            env_watch = await _unless_stopped(
                env_health.check_then_watch(env_client(config.env)), stop
            )
        if stop.is_set():
            return
        name = f"actor[{spec.index}]"
        await _unless_stopped(
            wait_for_broker(broker.url, timeout_s=broker.connect_timeout_s, name=name), stop
        )
        if stop.is_set():
            return  # SIGTERM while the broker was away
        # The engine's start blocks the event loop (vLLM starts synchronously) for seconds
        # to minutes: a signal meanwhile ends the process at once. Nothing is taken or
        # connected yet; the supervisor kills what the engine left in our process group.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _exit_at_once)
        try:
            actor, cleanup = await build(spec, config, broker)
        except ValueError as e:  # the engine or the loop refuses the config
            raise CannotStart(EXIT_CONFIG, f"cannot start as configured: {e}") from e
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
        built.append(actor)
        try:
            await actor.run(stop)
        finally:
            cleanup()
    except BrokerUnreachable as e:
        raise CannotStart(EXIT_UNREACHABLE, str(e)) from None
    except BrokerRefused as e:
        raise CannotStart(EXIT_CONFIG, str(e)) from None
    except (WeightDtypeMismatch, AdapterMismatch) as e:
        # The learner refused this engine's dtype or LoRA rank: every restart would meet
        # the same refusal (and generate a little with weights nobody updates meanwhile).
        raise CannotStart(EXIT_CONFIG, f"the learner refuses this engine: {e}") from None
    finally:
        if env_watch is not None:
            env_watch.cancel()


def _exit_at_once(signum: int, frame) -> None:
    log.warning("signal %d while the engine starts: exiting now", signum)
    logging.shutdown()  # flush
    os._exit(0)


async def _unless_stopped(awaitable: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`await awaitable`, unless `stop` is set first: then it is cancelled and None returned."""
    task = asyncio.ensure_future(awaitable)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()


def replica_main(spec: ReplicaSpec) -> None:
    """Entry point of a real replica process: vLLM engine + gRPC env servers."""
    run_replica(spec, _build_real, check_env=True)


async def _build_real(spec: ReplicaSpec, config: ActorConfig, broker: BrokerConfig):
    from transformers import AutoTokenizer

    from actors.engine_processes import threads_bind_for_replica
    from actors.vllm_engine import VllmEngine
    from common.config import load_section
    from common.storage_config import StorageConfig

    tokenizer = AutoTokenizer.from_pretrained(config.engine.model)
    bind = threads_bind_for_replica(
        config.engine.cpu_threads_bind, spec.index, sorted(os.sched_getaffinity(0))
    )
    engine = await VllmEngine.start(config.engine.model_copy(update={"cpu_threads_bind": bind}))
    storage = load_section(StorageConfig, spec.config_path, "storage", spec.overrides)
    actor = grpc_actor(
        config,
        broker,
        engine,
        tokenizer,
        actor_id=actor_id_of(spec),
        snapshots=SnapshotSource(storage),
    )
    return actor, engine.shutdown


def grpc_actor(
    config: ActorConfig,
    broker: BrokerConfig,
    engine: ActorEngine,
    tokenizer,
    *,
    actor_id: str,
    client: EnvClient | None = None,
    snapshots: SnapshotSource | None = None,
) -> Actor:
    """An actor playing its episodes against gRPC env servers: through `client`, by default
    the one `[actor.env]` describes (`env_client`), with `tokenizer`'s chat template."""
    return Actor(
        config=config,
        broker=broker,
        engine=engine,
        env=GrpcEnvConnector(client or env_client(config.env)),
        chat=ChatTemplate(tokenizer),
        actor_id=actor_id,
        snapshots=snapshots,
    )


def env_client(config: EnvConfig):
    """The gRPC env client `[actor.env]` describes: addresses, deadline, message size, TLS.
    No retries inside the client: the episode retries (elsewhere, with replay) per
    `actor.env.attempts`, one layer with one backoff."""
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
        tool_format=config.tool_format or "",
    )

"""The env server process: a grpc.aio server with the env service, health checking,
reflection, explicit message-size limits, TLS or mutual TLS when `[envserver.tls]` says so,
an idle-session sweeper, Prometheus metrics and a graceful shutdown.

    start: providers.start() (e.g. MCP servers) -> bind -> health SERVING -> sweeper
    SIGTERM/SIGINT -> health NOT_SERVING, new Resets refused (drain_s)
                   -> server.stop(shutdown_grace_s): in-flight steps finish
                   -> sessions closed -> providers.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from envservers.config import EnvServerConfig
from envservers.registry import build_providers
from envservers.service import EnvService
from envservers.types import EnvProvider
from protos import env_pb2, env_pb2_grpc
from protos.channel import server_credentials, server_options

log = logging.getLogger(__name__)
SERVICE_NAME = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name


class EnvServer:
    """One server; `async with EnvServer(config) as s:` serves on `s.port` until exit."""

    def __init__(self, config: EnvServerConfig, providers: dict[str, EnvProvider] | None = None):
        self.config = config
        self.providers = providers if providers is not None else build_providers(config)
        self.service = EnvService(self.providers, config)
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.metrics_port: int | None = None
        self._sweeper: asyncio.Task | None = None
        self._stopped = asyncio.Event()

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        tls = self.config.tls  # read the certificates first: a bad path starts nothing
        credentials = None
        if tls.cert_file:
            credentials = server_credentials(
                cert_file=tls.cert_file, key_file=tls.key_file, client_ca_file=tls.client_ca_file
            )
        started: list[EnvProvider] = []
        try:
            for provider in self.providers.values():
                await provider.start()
                started.append(provider)
        except BaseException:
            for provider in started:
                await provider.stop()
            raise
        server = grpc.aio.server(options=server_options(self.config.max_message_bytes))
        env_pb2_grpc.add_EnvServiceServicer_to_server(self.service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        address = f"{self.config.host}:{self.config.port}"
        if credentials is not None:
            self.port = server.add_secure_port(address, credentials)
        else:
            self.port = server.add_insecure_port(address)
        if self.port == 0:
            raise ValueError(
                f"cannot bind {address}: set envserver.port to a free port (0 picks one)"
            )
        await server.start()
        self.server = server
        serving = health_pb2.HealthCheckResponse.SERVING
        await self.health.set("", serving)
        await self.health.set(SERVICE_NAME, serving)
        self._sweeper = asyncio.create_task(self.service.run_sweeper())
        if self.config.metrics_port is not None:
            from common.metrics import serve_metrics

            self.metrics_port = serve_metrics(
                self.config.metrics_port, self.config.host, setting="envserver.metrics_port"
            )
        log.info("env server on %s hosting %s", self.address, sorted(self.providers))

    async def stop(self, drain_s: float | None = None, grace_s: float | None = None) -> None:
        """Graceful shutdown; safe to call twice."""
        if self.server is None or self._stopped.is_set():
            return
        drain = self.config.drain_s if drain_s is None else drain_s
        grace = self.config.shutdown_grace_s if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()
        self.service.draining = True
        await asyncio.sleep(drain)
        await self.server.stop(grace)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.service.close_all()
        for provider in self.providers.values():
            await provider.stop()
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def __aenter__(self) -> EnvServer:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop(drain_s=0, grace_s=1)


async def serve(config: EnvServerConfig, providers: dict[str, EnvProvider] | None = None) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    server = EnvServer(config, providers)
    await server.start()
    print(
        f"envserver ready on {server.address} hosting {','.join(sorted(server.providers))}"
        f" metrics_port={server.metrics_port}",
        flush=True,
    )
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task] = []

    def on_signal(signum: int) -> None:
        log.info("signal %d: shutting down", signum)
        if not stopping:
            stopping.append(asyncio.create_task(server.stop()))

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    await server.wait_stopped()

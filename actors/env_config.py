"""`[actor.env]`: the env servers an actor plays its episodes against, and how it talks to
them (gRPC addresses, deadlines, retries, TLS, its model's tool-call format). Part of the
`[actor]` section (actors/config.py)."""

from __future__ import annotations

import pydantic

from common.config import CertKeyFiles, StrictModel
from protos.types import tool_format_problem


class EnvTlsConfig(CertKeyFiles):
    """`[actor.env.tls]`: TLS to the env servers. Off while `ca_file` is empty; file paths
    only (keys never sit in a config file). `cert_file` + `key_file`: a client certificate
    for env servers that require one (mutual TLS)."""

    ca_file: str = ""
    """PEM bundle of the CA that signed the env servers' certificates; setting it turns TLS
    on (the server's chain and name are verified)."""
    server_name: str = ""
    """Name to check the servers' certificates against when it differs from the address's
    host (e.g. addresses by IP, certificates by DNS name)."""

    @pydantic.model_validator(mode="after")
    def _client_cert_needs_ca(self) -> EnvTlsConfig:
        if self.cert_file and not self.ca_file:
            raise ValueError("cert_file: mutual TLS needs ca_file (TLS is off without it)")
        return self


class EnvConfig(StrictModel):
    """The env servers this actor plays episodes against (gRPC)."""

    addresses: list[str] = ["127.0.0.1:50051"]
    """host:port of every env server; new sessions go round robin, a failed open moves on.
    All servers are expected to host the same environments."""
    timeout_s: float = pydantic.Field(default=60.0, gt=0)
    """Deadline of each Reset/Step/Close call."""
    attempts: int = pydantic.Field(default=6, ge=1)
    """Tries to open a session (each on the next address) or to step (re-opening the session
    elsewhere and replaying the episode) before the episode ends with `error:env_*`. With
    the default backoff they span ~15 s: long enough for a restarted env server to come back
    on its address."""
    backoff_s: float = pydantic.Field(default=0.5, ge=0)
    """Wait before the second try; doubles each try."""
    max_backoff_s: float = pydantic.Field(default=8.0, ge=0)
    """Longest wait between tries."""
    max_message_bytes: int = pydantic.Field(default=8 * 1024 * 1024, ge=64 * 1024)
    """gRPC max send/receive message size; must equal the servers' envserver.max_message_bytes
    (a launcher checks it when one file holds both)."""
    tls: EnvTlsConfig = EnvTlsConfig()
    """TLS to the env servers (off by default)."""
    tool_format: str | None = None
    """How this actor's model writes tool calls, asked of the env servers for its sessions
    (protos/types.py TOOL_FORMATS); None: each server's own `envserver.tool_format`."""

    @pydantic.field_validator("tool_format")
    @classmethod
    def _known_format(cls, name: str | None) -> str | None:
        if name is not None and (problem := tool_format_problem(name)):
            raise ValueError(problem)
        return name

    @pydantic.field_validator("addresses")
    @classmethod
    def _some_address(cls, addresses: list[str]) -> list[str]:
        if not addresses:
            raise ValueError("give at least one env server address (host:port)")
        for address in addresses:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"env server address {address!r} must look like host:port")
        return addresses

    def delay_s(self, attempt: int) -> float:
        """Wait before try `attempt + 1` (attempt 0 is the first retry)."""
        return min(self.backoff_s * 2**attempt, self.max_backoff_s)

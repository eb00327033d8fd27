"""The `[broker]` config section every role reads: where the bus is, which run it is, and
how its connections are encrypted (`[broker.tls]`). Credentials are never part of it: they
come from the environment or from files (broker/security.py)."""

from __future__ import annotations

import urllib.parse

import pydantic

from broker.names import BusNames
from common.config import CertKeyFiles, StrictModel


class BrokerTlsConfig(CertKeyFiles):
    """`[broker.tls]`: TLS between every process and nats-server. Off while `ca_file` is
    empty; file paths only (keys never sit in a config file). `cert_file` + `key_file`: the
    client certificate presented to the server, for mutual TLS."""

    ca_file: str = ""
    """PEM bundle of the CA that signed the server's certificate. Setting it turns TLS on in
    every client: the server's chain and name are verified, and a server that does not start
    TLS gets no credentials. The embedded server also checks client certificates against it."""
    server_name: str = ""
    """Name to check the server's certificate against when it differs from the URL's host."""
    server_cert_file: str = ""
    """The embedded server's certificate (PEM; `make run`, `python -m broker serve`). Empty:
    it speaks plain NATS."""
    server_key_file: str = ""
    """The embedded server's private key (PEM file)."""
    verify_clients: bool = False
    """The embedded server refuses clients without a certificate signed by ca_file."""

    @pydantic.model_validator(mode="after")
    def _pairs(self) -> BrokerTlsConfig:
        if bool(self.server_cert_file) != bool(self.server_key_file):
            raise ValueError("server_cert_file and server_key_file: give both or neither")
        if self.cert_file and not self.ca_file:
            raise ValueError("cert_file: mutual TLS needs ca_file (TLS is off without it)")
        if self.server_cert_file and not self.ca_file:
            raise ValueError("server_cert_file: clients need ca_file to verify the server")
        if self.verify_clients and not self.server_cert_file:
            raise ValueError("verify_clients: the embedded server needs server_cert_file")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.ca_file)


class BrokerConfig(StrictModel):
    """The `[broker]` section."""

    url: str = "nats://127.0.0.1:4222"
    """NATS server URL (nats:// or tls://). `make run` starts an embedded server and sets
    this. No credentials in it: they would be logged; use NATS_USER/NATS_PASSWORD or
    NATS_TOKEN (or their _FILE variants)."""
    namespace: str = "tether"
    """Prefix of every stream, subject and bucket of this run; runs sharing a server differ here."""
    prompt_ack_wait_s: float = 10.0
    """A prompt task not heart-beaten for this long (its replica died) is redelivered to
    another replica: the seconds a dead actor's work waits. Replicas heart-beat every
    `actor.heartbeat_s`, well inside it."""
    trajectory_ack_wait_s: float = 600.0
    """A trajectory the learner has not acknowledged for this long is redelivered."""
    max_trajectory_bytes: int = 4 * 1024**3
    """Disk bound of the trajectory stream; publishers wait when it is full. It must hold what
    the learner keeps unacked until its next checkpoint, about (checkpoint.interval +
    max_staleness + 1) x prompts_per_step x group_size trajectories of 13 bytes a token: 4 GiB
    is 50 steps of 512 trajectories of 12K tokens. nats-server reserves it in its file store
    while the namespace exists, so a store of S holds S / max_trajectory_bytes live
    namespaces; those of done runs are reclaimed when room is needed (docs/broker.md)."""
    episode_ttl_s: float = pydantic.Field(86_400.0, gt=0)
    """How long the checkpoint of an episode in flight (its tokens up to its last turn,
    kept so that another replica continues it if its own dies: broker/episodes.py) outlives
    its last update. A group's checkpoints are deleted when its task is acknowledged; this
    bounds the rest (a task terminated, a run never resumed). A day: a whole run stopped
    overnight and resumed in the morning continues its episodes."""
    stream_replicas: int = pydantic.Field(1, ge=1, le=5)
    """Copies of every stream and bucket kept by a clustered nats-server (JetStream RAFT):
    3 survives the loss of one server. Must not exceed the cluster's size."""

    connect_timeout_s: float = pydantic.Field(300.0, gt=0)
    """How long a process waits for the broker at start-up before it exits non-zero (it says
    "waiting for NATS at URL" at once, then every 30 s, retrying with backoff up to 5 s).
    Five minutes: long enough for every start order a launcher or a cluster produces (pods
    start in any order; a nats-server restoring a large JetStream store, or being
    rescheduled, takes tens of seconds to a few minutes) and for a person to start
    `python -m broker serve` after reading the line; short enough that a wrong URL ends the
    process, whose own supervisor (Kubernetes, `make run`, Ray) then reports or restarts it.
    Once connected, a process reconnects for ever: this bounds only the first connection."""

    tls: BrokerTlsConfig = BrokerTlsConfig()
    """TLS to nats-server (off by default)."""

    @pydantic.field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, url: str) -> str:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("nats", "tls"):
            raise ValueError(f"expected a nats:// or tls:// URL, got {url.split('@')[-1]!r}")
        if "@" in parts.netloc:
            raise ValueError(
                "credentials do not belong in the URL (it is logged and written to run "
                "directories): set NATS_USER and NATS_PASSWORD, or NATS_TOKEN, instead"
            )
        return url

    @pydantic.field_validator("namespace")
    @classmethod
    def _valid_namespace(cls, namespace: str) -> str:
        BusNames(namespace)  # raises ValueError naming the rule
        return namespace

    @property
    def names(self) -> BusNames:
        return BusNames(self.namespace)

    def stream_limits(self):
        from broker.streams import StreamLimits

        return StreamLimits(
            max_trajectory_bytes=self.max_trajectory_bytes,
            prompt_ack_wait_s=self.prompt_ack_wait_s,
            trajectory_ack_wait_s=self.trajectory_ack_wait_s,
            replicas=self.stream_replicas,
            episode_ttl_s=self.episode_ttl_s,
        )

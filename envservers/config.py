"""The `[envserver]` config section. Imports nothing heavy: `envserver --help` and a bad
config must answer fast."""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from common.config import CertKeyFiles, StrictModel
from common.tool_formats import parser_for
from protos.types import DEFAULT_TOOL_FORMAT

MiB = 1024 * 1024


class SandboxConfig(StrictModel):
    """Limits of the `python` environment's sandbox (see docs/envservers.md)."""

    timeout_s: float = pydantic.Field(10.0, gt=0)
    """Wall-clock limit of one run; the whole process tree is killed after it."""
    cpu_s: int = pydantic.Field(5, ge=1)
    """RLIMIT_CPU: CPU seconds before the kernel kills the run."""
    memory_mb: int = pydantic.Field(512, ge=32)
    """RLIMIT_AS: address-space limit of every process of the run."""
    file_size_mb: int = pydantic.Field(16, ge=1)
    """RLIMIT_FSIZE: largest file the run may write."""
    max_processes: int = pydantic.Field(16, ge=1)
    """RLIMIT_NPROC for the run's own uid: stops fork bombs."""
    max_open_files: int = pydantic.Field(64, ge=8)
    """RLIMIT_NOFILE."""
    max_output_bytes: int = pydantic.Field(16384, ge=256)
    """stdout+stderr kept and shown to the model; the rest is cut."""
    scratch_root: str = ""
    """Where per-session scratch dirs live; empty = <tmp>/tether-sandbox."""
    isolation: Literal["namespaces", "rlimits"] = "namespaces"
    """`namespaces` (needs root): new mount, pid and network namespaces, a read-only root
    that holds only the interpreter and the scratch dir, an unprivileged uid. `rlimits`: only
    resource limits and a Python audit hook (weak: for machines without root)."""
    uid_base: int = pydantic.Field(200_000, ge=1000)
    """First uid given to sandboxed runs (namespaces mode); concurrent runs get different
    uids so that RLIMIT_NPROC counts each run alone."""
    uid_pool: int = pydantic.Field(1000, ge=1)
    """How many uids from uid_base to cycle through."""
    ro_paths: list[str] = []
    """Extra host paths made visible read-only inside the sandbox (e.g. a site-packages)."""


class SqlConfig(StrictModel):
    """The `sql` environment."""

    query_timeout_s: float = pydantic.Field(2.0, gt=0)
    """A query running longer is interrupted (and reported to the model)."""
    max_rows: int = pydantic.Field(50, ge=1)
    """Rows shown to the model per query result (a query's rows past this are never
    fetched, so a runaway result cannot fill the server's memory)."""
    max_value_bytes: int = pydantic.Field(4 * MiB, ge=1024)
    """Longest string or blob a query may make or read (SQLite's SQLITE_LIMIT_LENGTH): a
    model query such as `hex(randomblob(300000000))` fails at once instead of taking
    gigabytes and a minute of CPU."""


class CalculatorConfig(StrictModel):
    """The `calculator` environment: an optional heavy-tailed latency before every tool
    call (envservers/latency.py), for benchmarks of asynchrony; off by default."""

    latency_median_s: float = pydantic.Field(0.0, ge=0)
    """Median wait of a tool call, seconds; 0 turns the latency off."""
    latency_p99_s: float = pydantic.Field(0.0, ge=0)
    """99th percentile of the wait (log-normal through median and p99); >= the median."""
    latency_seed: int | None = None
    """Seed of the latency draws (one stream per env server); None: unseeded."""
    load_step_factor: float = pydantic.Field(1.0, gt=0)
    """A load step: every latency times this factor for `load_step_for_s` seconds, from
    `load_step_after_s` past the server's first tool call; 1 (the default): none."""
    load_step_after_s: float = pydantic.Field(0.0, ge=0)
    """When the load step begins, seconds past the first tool call."""
    load_step_for_s: float = pydantic.Field(0.0, ge=0)
    """How long the load step lasts."""

    @pydantic.model_validator(mode="after")
    def _check(self) -> CalculatorConfig:
        if self.latency_median_s > 0 and self.latency_p99_s < self.latency_median_s:
            raise ValueError(
                f"latency_p99_s ({self.latency_p99_s}) must be >= latency_median_s "
                f"({self.latency_median_s})"
            )
        if self.load_step_factor != 1.0 and self.latency_median_s <= 0:
            raise ValueError(
                "load_step_factor multiplies the tool latency, but latency_median_s is 0 "
                "(no latency): set both"
            )
        return self


class McpServerConfig(StrictModel):
    """One MCP server started over stdio."""

    command: str
    """Executable; `python` means the interpreter running the env server."""
    args: list[str] = []
    """Its arguments."""
    env: dict[str, str] = {}
    """Extra environment variables."""
    cwd: str | None = None
    """Working directory (default: inherited)."""


class McpConfig(StrictModel):
    """The `mcp` environment: a bridge to MCP servers; their tools become our tools."""

    servers: dict[str, McpServerConfig] = {}
    """MCP servers by name; all are started when the env server starts."""
    tool_timeout_s: float = pydantic.Field(30.0, gt=0)
    """Longest wait for one MCP tool call."""
    startup_timeout_s: float = pydantic.Field(30.0, gt=0)
    """Longest wait for an MCP server to start and list its tools."""


class OpenEnvConfig(StrictModel):
    """One OpenEnv environment server proxied as `openenv:<name>`."""

    base_url: str
    """http:// or ws:// address of the OpenEnv server."""
    mode: Literal["text", "tools"] = "text"
    """`text`: the assistant text is sent as action field `action_field`, the observation
    comes back as a user message. `tools`: the env is an MCP env; tool calls in the text
    become call_tool actions and their results tool messages."""
    action_field: str = "message"
    """The action field that carries the assistant text in text mode."""
    observation_field: str | None = None
    """Observation field shown to the model in text mode (None = the whole observation as
    JSON)."""
    message_timeout_s: float = pydantic.Field(60.0, gt=0)
    """Longest wait for one OpenEnv reply."""


class EnvServerTlsConfig(CertKeyFiles):
    """`[envserver.tls]`: the gRPC port speaks TLS only, optionally mutual TLS. Off while
    `cert_file` (the server's certificate; with key_file) is empty; file paths only (keys
    never sit in a config file)."""

    client_ca_file: str = ""
    """PEM bundle of the CA that signs client certificates. Setting it requires every
    client to present one (mutual TLS): a client without it cannot even connect."""

    @pydantic.model_validator(mode="after")
    def _client_ca_needs_cert(self) -> EnvServerTlsConfig:
        if self.client_ca_file and not self.cert_file:
            raise ValueError("client_ca_file: mutual TLS needs the server's cert_file too")
        return self


class EnvServerConfig(StrictModel):
    """`[envserver]`: one gRPC env server process."""

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = pydantic.Field(50051, ge=0, le=65535)
    """gRPC port; 0 picks a free one (printed on start-up)."""
    envs: list[str] = ["calculator"]
    """Environments hosted: built-in names (calculator, noop, sql, python, mcp),
    `skyrl_gym:NAME` (a skyrl-gym registered env, served as NAME; `skyrl_gym:*` = all of
    them), `openenv:NAME` (configured under [envserver.openenv.NAME]),
    `reasoning_gym:TASK` (a reasoning-gym task), the user's own by import path
    (`my_pkg.envs:make`, `reward:my_pkg.rewards:score`) or installed entry point name, and
    `NAME=...` to serve any of them under NAME (envservers/registry.py, docs/envservers.md)."""
    max_sessions: int = pydantic.Field(4096, ge=1)
    """Open sessions allowed at once; more is RESOURCE_EXHAUSTED."""
    session_idle_ttl_s: float = pydantic.Field(600.0, gt=0)
    """A session untouched this long is closed."""
    max_message_bytes: int = pydantic.Field(8 * MiB, ge=64 * 1024)
    """gRPC max send/receive message size (the client must use the same)."""
    max_action_chars: int = pydantic.Field(1_000_000, ge=1)
    """Longest assistant message accepted by Step."""
    step_timeout_s: float = pydantic.Field(300.0, gt=0)
    """Server-side cap on one step when the client sets no shorter deadline."""
    max_tool_calls_per_step: int = pydantic.Field(8, ge=1)
    """Tool calls run per assistant message; more are error observations."""
    tool_format: str = DEFAULT_TOOL_FORMAT
    """How the model writes tool calls: `hermes` (Qwen2.5/Qwen3, our tiny model), `qwen3_coder`,
    `llama3_json`, `mistral` (common/tool_formats.py, docs/envservers.md)."""
    max_observation_chars: int = pydantic.Field(16_384, ge=256)
    """Longest observation message (a tool's result) Step returns; a longer one keeps its
    head and tail around a marker saying how many characters were cut."""
    drain_s: float = pydantic.Field(1.0, ge=0)
    """On SIGTERM: health goes NOT_SERVING and new sessions are refused for this long
    before the server stops accepting RPCs."""
    shutdown_grace_s: float = pydantic.Field(30.0, ge=0)
    """Then in-flight RPCs get this long to finish."""
    tls: EnvServerTlsConfig = EnvServerTlsConfig()
    """TLS on the gRPC port (off by default)."""
    metrics_port: int | None = pydantic.Field(9400, ge=0, le=65535)
    """Prometheus /metrics port; 0 picks a free one; null disables."""
    log_level: str = "INFO"
    """Python logging level."""
    python: SandboxConfig = SandboxConfig()
    """The `python` environment's sandbox."""
    calculator: CalculatorConfig = CalculatorConfig()
    """The `calculator` environment (tool latency)."""
    sql: SqlConfig = SqlConfig()
    """The `sql` environment."""
    mcp: McpConfig = McpConfig()
    """The `mcp` environment."""
    openenv: dict[str, OpenEnvConfig] = {}
    """OpenEnv servers by name, hosted as `openenv:NAME`."""
    skyrl_gym: dict[str, dict[str, Any]] = {}
    """env_config passed to skyrl_gym.make per skyrl-gym env name."""
    plugins: dict[str, dict[str, Any]] = {}
    """Settings of plug-in environments, rewards and reasoning-gym tasks, one free-form
    table per name as served (`[envserver.plugins.my_task]`); the plug-in checks them."""

    @pydantic.model_validator(mode="after")
    def _check_envs(self) -> EnvServerConfig:
        if not self.envs:
            raise ValueError("envs: host at least one environment")
        for entry in self.envs:
            name = entry.partition("=")[2] or entry  # what NAME=... serves
            prefix, sep, rest = name.partition(":")
            if sep and not rest:
                raise ValueError(f"envs: {entry!r} names nothing after the colon")
            if prefix == "openenv" and sep and rest not in self.openenv:
                raise ValueError(f"envs: {entry!r} needs a [envserver.openenv.{rest}] section")
        if "mcp" in self.envs and not self.mcp.servers:
            raise ValueError("envs: 'mcp' needs at least one [envserver.mcp.servers.NAME]")
        parser_for(self.tool_format)  # an unknown format: the error lists the supported ones
        return self

    @property
    def tool_rules(self) -> dict[str, Any]:
        """How every tool environment reads an assistant message (ToolEnv's arguments)."""
        return {
            "max_tool_calls_per_step": self.max_tool_calls_per_step,
            "tool_format": self.tool_format,
        }

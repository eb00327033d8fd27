"""The env service over gRPC, with the Environment interface's shape (async):

    client = EnvClient(["127.0.0.1:50051", "127.0.0.1:50052"], timeout_s=30)
    session = await client.open("calculator", task)   # task = SkyRL dataset row
    session.observation                               # Observation(messages, tools, metadata)
    result = await session.step(assistant_text)       # StepResult(observations, reward,
                                                      #            done, metadata)
    await session.close()
    await client.close()

A workflow session (`observation.kind == "workflow"`) is run, not stepped:
`outcome = await session.run_workflow(base_url, api_key)` (WorkflowOutcome: reward,
metadata, error).

- Every call has a deadline (`timeout_s`, per call overridable).
- TLS with `credentials` (protos/channel.py `client_credentials`: the server verified
  against a CA, optionally a client certificate for mutual TLS); plain otherwise.
- UNAVAILABLE is retried with exponential backoff (`max_retries`). Retries are safe: Reset
  carries a client-chosen session id and Step a sequence number, so the server answers a
  repeated request from its record instead of acting twice.
- Several addresses: new sessions go round robin (a retried open moves to the next one);
  a session's steps always go to the server that holds it.
- Other failures raise `grpc.aio.AioRpcError` (code() and details() say what went wrong).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import env_pb2, env_pb2_grpc
from protos.channel import DEFAULT_MAX_MESSAGE_BYTES, channel_options
from protos.types import Observation, StepResult, WorkflowOutcome

T = TypeVar("T")


def _messages(messages) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        message = {"role": m.role, "content": m.content}
        if m.name:
            message["name"] = m.name
        out.append(message)
    return out


class EnvSession:
    """One open episode on one server."""

    def __init__(self, client: EnvClient, address: str, env_class: str, reset):
        self.client = client
        self.address = address
        self.env_class = env_class
        self.session_id: str = reset.session_id
        self.observation = Observation(
            messages=_messages(reset.messages),
            tools=[json.loads(t.json) for t in reset.tools],
            metadata=json.loads(reset.metadata_json or "{}"),
            kind=reset.kind,
        )
        self.num_steps = 0
        self.done = False
        self.closed = False

    async def step(self, action_text: str, *, timeout_s: float | None = None) -> StepResult:
        stub = self.client._stub(self.address)
        request = env_pb2.StepRequest(
            session_id=self.session_id, action=action_text, seq=self.num_steps + 1
        )
        response = await self.client._with_retries(
            lambda _attempt: stub.Step(request, timeout=timeout_s or self.client.timeout_s)
        )
        self.num_steps += 1
        self.done = response.done
        return StepResult(
            observations=_messages(response.observations),
            reward=response.reward,
            done=response.done,
            metadata=json.loads(response.metadata_json or "{}"),
        )

    async def run_workflow(
        self, base_url: str, api_key: str, *, timeout_s: float | None = None
    ) -> WorkflowOutcome:
        """Run a workflow session's agent against `base_url` (once: a retry gets the same
        answer). The deadline is the workflow's time limit, from its reset, plus
        `timeout_s` (the client's) for the call itself."""
        stub = self.client._stub(self.address)
        request = env_pb2.RunWorkflowRequest(
            session_id=self.session_id, base_url=base_url, api_key=api_key
        )
        deadline = float(self.observation.metadata.get("time_limit_s", 0.0))
        deadline += timeout_s or self.client.timeout_s
        response = await self.client._with_retries(
            lambda _attempt: stub.RunWorkflow(request, timeout=deadline)
        )
        self.done = True
        return WorkflowOutcome(
            reward=response.reward,
            metadata=json.loads(response.metadata_json or "{}"),
            error=response.error,
        )

    async def close(self, *, timeout_s: float | None = None) -> None:
        """Close on the server; idempotent here (a second close does nothing)."""
        if self.closed:
            return
        self.closed = True
        stub = self.client._stub(self.address)
        request = env_pb2.CloseRequest(session_id=self.session_id)
        try:
            await self.client._with_retries(
                lambda _attempt: stub.Close(request, timeout=timeout_s or self.client.timeout_s)
            )
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:  # already gone (expired): nothing to do
                raise


class EnvClient:
    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.1,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str = "",
        tool_format: str = "",
    ):
        self.addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        if not self.addresses:
            raise ValueError("addresses: give at least one host:port")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_message_bytes = max_message_bytes
        self.credentials = credentials
        self.server_name = server_name
        self.tool_format = tool_format  # asked of every session; "": the server's own
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, env_pb2_grpc.EnvServiceStub] = {}
        self._next = itertools.cycle(self.addresses)

    def _stub(self, address: str) -> env_pb2_grpc.EnvServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            options = channel_options(self.max_message_bytes)
            if self.credentials is None:
                channel = grpc.aio.insecure_channel(address, options=options)
            else:
                if self.server_name:
                    options.append(("grpc.ssl_target_name_override", self.server_name))
                channel = grpc.aio.secure_channel(address, self.credentials, options=options)
            self._channels[address] = channel
            stub = self._stubs[address] = env_pb2_grpc.EnvServiceStub(channel)
        return stub

    async def _with_retries(self, call: Callable[[int], Awaitable[T]]) -> T:
        for attempt in range(self.max_retries + 1):
            try:
                return await call(attempt)
            except grpc.aio.AioRpcError as e:
                # Network boundary: only UNAVAILABLE (server unreachable or restarting) is
                # worth retrying; everything else is an answer.
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == self.max_retries:
                    raise
            await asyncio.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    async def open(
        self, env_class: str, task: dict[str, Any], *, timeout_s: float | None = None
    ) -> EnvSession:
        """Reset a new session of `env_class` from a dataset row."""
        request = env_pb2.ResetRequest(
            env_class=env_class,
            task_json=json.dumps(task),
            session_id=uuid.uuid4().hex,
            tool_format=self.tool_format,
        )
        addresses: list[str] = []

        def attempt(_attempt: int):
            addresses.append(next(self._next))
            return self._stub(addresses[-1]).Reset(request, timeout=timeout_s or self.timeout_s)

        response = await self._with_retries(attempt)
        return EnvSession(self, addresses[-1], env_class, response)

    async def list_envs(self, address: str | None = None) -> dict[str, str]:
        """{env name: description} hosted by one server (the first address by default)."""
        stub = self._stub(address or self.addresses[0])
        response = await self._with_retries(
            lambda _attempt: stub.ListEnvs(env_pb2.ListEnvsRequest(), timeout=self.timeout_s)
        )
        return {e.name: e.description for e in response.envs}

    async def health(self, address: str, *, timeout_s: float = 2.0) -> str | None:
        """None when the server at `address` says SERVING (gRPC health checking), else why
        not: `UNAVAILABLE: <details>` for one that does not answer, `NOT_SERVING` draining."""
        self._stub(address)  # opens the channel
        stub = health_pb2_grpc.HealthStub(self._channels[address])
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        # Network boundary: the failure is the answer (the caller decides to ask again).
        except grpc.aio.AioRpcError as e:
            return f"{e.code().name}: {e.details()}"
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            return None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


# ---- the rollout's view: errors that say what to do next -------------------------------------


class EnvUnavailable(Exception):
    """An env server is down, timed out, or lost the session: retry elsewhere."""


class TaskRejected(ValueError):
    """The prompt task can never succeed (malformed, prompt too long, unknown env):
    terminate it, do not redeliver."""


class GrpcEnvConnector:
    """An `EnvClient` as the rollout's env connector (actors/types.py): gRPC failures
    become EnvUnavailable (retry elsewhere) or TaskRejected (the task itself is bad)."""

    # At open, these mean the task cannot be run anywhere (all servers host the same envs).
    _TASK_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)

    def __init__(self, client: EnvClient) -> None:
        self.client = client

    async def open(self, env_class: str, task: dict) -> _GrpcSession:
        try:
            return _GrpcSession(await self.client.open(env_class, task))
        except grpc.aio.AioRpcError as e:
            if e.code() in self._TASK_ERRORS:
                raise TaskRejected(f"env server refused the task: {e.details()}") from e
            raise EnvUnavailable(f"open {env_class}: {e.code().name}: {e.details()}") from e


class _GrpcSession:
    def __init__(self, session: EnvSession) -> None:
        self.session = session
        self.observation = session.observation

    async def step(self, action_text: str) -> StepResult:
        try:
            return await self.session.step(action_text)
        except grpc.aio.AioRpcError as e:
            # Whatever went wrong (server gone, session expired, deadline, env crash), the
            # episode can only continue on a re-opened session elsewhere.
            raise EnvUnavailable(f"step: {e.code().name}: {e.details()}") from e

    async def run_workflow(self, base_url: str, api_key: str) -> WorkflowOutcome:
        try:
            return await self.session.run_workflow(base_url, api_key)
        except grpc.aio.AioRpcError as e:
            raise EnvUnavailable(f"run workflow: {e.code().name}: {e.details()}") from e

    async def close(self) -> None:
        try:
            await self.session.close()
        except grpc.aio.AioRpcError as e:
            raise EnvUnavailable(f"close: {e.code().name}: {e.details()}") from e

"""The gRPC servicer: sessions in a table, requests checked, env calls timed, every failure
mapped to a status code. It holds no environment logic — that is in the Environment.

    Reset(env_class, task_json) -> provider.make() -> env.reset(task)   -> session table
    Step(session_id, action)    -> session lock -> env.step(action)     -> cached for retries
    Close(session_id)           -> env.close(), removed
    RunWorkflow(session_id, endpoint) -> session lock -> the agent's code, once (a retry
                                   gets the first run's answer)
    sweeper (every ttl/4)       -> closes sessions idle longer than the TTL

Status codes: unknown env or session NOT_FOUND; bad field INVALID_ARGUMENT naming it;
too large / too many RESOURCE_EXHAUSTED; step after done or out of sequence
FAILED_PRECONDITION; anything raised inside one env INTERNAL (only that call fails);
draining for shutdown UNAVAILABLE (for new sessions).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from typing import Any, NoReturn

import grpc

from common.tool_formats import parser_for
from envservers import metrics
from envservers.config import EnvServerConfig
from envservers.responses import cap_observations, reset_response, step_response, workflow_response
from envservers.sessions import Reset, Session, close_env
from envservers.tool_env import ToolEnv
from envservers.types import EnvProvider
from envservers.workflows import WorkflowEnv
from protos import env_pb2, env_pb2_grpc
from protos.types import tool_format_problem

log = logging.getLogger(__name__)
Code = grpc.StatusCode


class EnvService(env_pb2_grpc.EnvServiceServicer):
    def __init__(self, providers: dict[str, EnvProvider], config: EnvServerConfig):
        self.providers = providers
        self.config = config
        self.sessions: dict[str, Session] = {}
        self._resetting: dict[str, tuple[str, asyncio.Future]] = {}
        """Resets in flight: session id -> (env class, future of its ResetResponse or None)."""
        self.draining = False

    async def _fail(self, context: Any, method: str, code: Code, message: str) -> NoReturn:
        metrics.ERRORS.labels(method, code.name).inc()
        await context.abort(code, message)
        raise AssertionError("unreachable: abort raises")

    async def ListEnvs(self, request, context):
        return env_pb2.ListEnvsResponse(
            envs=[
                env_pb2.EnvInfo(name=name, description=p.description)
                for name, p in sorted(self.providers.items())
            ]
        )

    async def Reset(self, request, context):
        provider = await self._provider(request, context)
        session_id = request.session_id or uuid.uuid4().hex
        known = await self._known_session(session_id, request.env_class, context)
        if known is not None:  # a retried Reset: same answer, no second episode
            return known
        if len(self.sessions) + len(self._resetting) >= self.config.max_sessions:
            await self._fail(
                context,
                "Reset",
                Code.RESOURCE_EXHAUSTED,
                f"too many open sessions ({self.config.max_sessions}); close some",
            )
        task = await self._task(request, context)
        if request.tool_format and (problem := tool_format_problem(request.tool_format)):
            await self._fail(context, "Reset", Code.INVALID_ARGUMENT, f"tool_format: {problem}")
        # Reserve the id (and a slot) before the first await: a concurrent Reset of the same
        # id waits for this one's answer, and a burst cannot pass max_sessions.
        pending: asyncio.Future = asyncio.get_running_loop().create_future()
        self._resetting[session_id] = (request.env_class, pending)
        try:
            reset = await self._reset_env(provider, request, task, context)
            response = reset_response(session_id, reset.observation)
            self.sessions[session_id] = Session(
                session_id, request.env_class, reset.env, response, time.monotonic()
            )
            metrics.ACTIVE_SESSIONS.labels(request.env_class).inc()
            pending.set_result(response)
            return response
        finally:
            del self._resetting[session_id]
            if not pending.done():
                pending.set_result(None)  # this Reset failed: so do the ones waiting on it

    async def _provider(self, request, context) -> EnvProvider:
        if self.draining:
            await self._fail(context, "Reset", Code.UNAVAILABLE, "server is shutting down")
        if not request.env_class:
            await self._fail(context, "Reset", Code.INVALID_ARGUMENT, "env_class: required")
        provider = self.providers.get(request.env_class)
        if provider is None:
            hosted = sorted(self.providers)
            await self._fail(
                context,
                "Reset",
                Code.NOT_FOUND,
                f"env_class: unknown environment {request.env_class!r}; hosted here: {hosted}",
            )
        return provider

    async def _known_session(
        self, session_id: str, env_class: str, context
    ) -> env_pb2.ResetResponse | None:
        """The answer already given (or being computed) for this session id, if any."""
        existing = self.sessions.get(session_id)
        in_flight = self._resetting.get(session_id)
        if existing is None and in_flight is None:
            return None
        known_class = existing.env_class if existing is not None else in_flight[0]
        if known_class != env_class:
            await self._fail(context, "Reset", Code.INVALID_ARGUMENT, "session_id: already in use")
        if existing is not None:
            return existing.reset_response
        response = await asyncio.shield(in_flight[1])
        if response is None:
            await self._fail(
                context, "Reset", Code.ABORTED, "session_id: a concurrent Reset of it failed"
            )
        return response

    async def _task(self, request, context) -> dict[str, Any]:
        try:
            task = json.loads(request.task_json or "{}")
        except json.JSONDecodeError as e:
            await self._fail(
                context, "Reset", Code.INVALID_ARGUMENT, f"task_json: not valid JSON: {e}"
            )
        if not isinstance(task, dict):
            await self._fail(
                context, "Reset", Code.INVALID_ARGUMENT, "task_json: must be a JSON object"
            )
        return task

    async def _reset_env(
        self, provider: EnvProvider, request, task: dict[str, Any], context
    ) -> Reset:
        """A fresh env reset from `task` (a tool environment reading calls in the request's
        `tool_format` when it names one); on any failure it is closed and the call fails."""
        fail, env_class = self._fail, request.env_class
        try:
            env = provider.make()
        except Exception as e:  # the provider's code: this call fails, the server keeps serving
            log.exception("making a %s session failed", env_class)
            await fail(context, "Reset", Code.INTERNAL,
                       f"making a {env_class} session failed: {type(e).__name__}: {e}")  # fmt: skip
        if request.tool_format and isinstance(env, ToolEnv):
            env.parse_tool_calls = parser_for(request.tool_format)
        try:
            async with asyncio.timeout(self._time_left(context)):
                return Reset(env, await env.reset(task))
        except ValueError as e:  # the row itself is unusable: the caller's fault
            await close_env(env)
            await fail(context, "Reset", Code.INVALID_ARGUMENT, f"task_json: {e}")
        except TimeoutError:
            await close_env(env)
            await fail(context, "Reset", Code.DEADLINE_EXCEEDED, "reset took too long")
        except asyncio.CancelledError:  # the client went away: nobody will close this env
            await close_env(env)
            raise
        except Exception as e:  # env failure: this call fails, the server keeps serving
            log.exception("reset of %s failed", env_class)
            await close_env(env)
            await fail(
                context,
                "Reset",
                Code.INTERNAL,
                f"reset of {env_class} failed: {type(e).__name__}: {e}",
            )

    def _time_left(self, context: Any) -> float:
        remaining = context.time_remaining()
        cap = self.config.step_timeout_s
        return cap if remaining is None else min(cap, max(remaining, 0.0))

    async def Step(self, request, context):
        fail = self._fail
        start = time.perf_counter()
        if not request.session_id:
            await fail(context, "Step", Code.INVALID_ARGUMENT, "session_id: required")
        session = self.sessions.get(request.session_id)
        if session is None:
            await fail(
                context,
                "Step",
                Code.NOT_FOUND,
                f"session_id: no open session {request.session_id!r} (closed or expired?)",
            )
        if len(request.action) > self.config.max_action_chars:
            await fail(
                context,
                "Step",
                Code.RESOURCE_EXHAUSTED,
                f"action: {len(request.action)} characters, limit {self.config.max_action_chars}",
            )
        if isinstance(session.env, WorkflowEnv):
            await fail(context, "Step", Code.FAILED_PRECONDITION,
                       f"{session.env_class} is a workflow: run it with RunWorkflow")  # fmt: skip
        async with session.lock:
            if session.closed:  # closed while this step waited for the lock
                await fail(context, "Step", Code.NOT_FOUND, "session_id: session was closed")
            session.last_used = time.monotonic()
            if request.seq and request.seq == session.last_seq and session.last_response:
                return session.last_response  # a retried step: replay, do not step twice
            if request.seq and request.seq != session.last_seq + 1:
                await fail(
                    context,
                    "Step",
                    Code.FAILED_PRECONDITION,
                    f"seq: expected {session.last_seq + 1}, got {request.seq}",
                )
            if session.done:
                await fail(context, "Step", Code.FAILED_PRECONDITION, "episode is done; Reset")
            try:
                async with asyncio.timeout(self._time_left(context)):
                    result = await session.env.step(request.action)
                response = step_response(result)
            except TimeoutError:
                await fail(context, "Step", Code.DEADLINE_EXCEEDED, "step took too long")
            except Exception as e:  # one env's failure fails only this call
                log.exception("step of %s session %s failed", session.env_class, session.id)
                await fail(
                    context,
                    "Step",
                    Code.INTERNAL,
                    f"step of {session.env_class} failed: {type(e).__name__}: {e}",
                )
            self._check_output(session.env_class, response)
            session.last_seq += 1
            session.last_response = response
            session.done = response.done
            session.last_used = time.monotonic()
        metrics.STEPS.labels(session.env_class).inc()
        metrics.STEP_SECONDS.labels(session.env_class).observe(time.perf_counter() - start)
        return response

    def _check_output(self, env_class: str, response: env_pb2.StepResponse) -> None:
        """Cut huge observations; count (and log) a reward that is not a finite number. It
        is passed on as it is: the actor ends such an episode as an error, never trains on
        it (actors/episode.py), and the count here says which environment is at fault."""
        num_cut = cap_observations(response, self.config.max_observation_chars)
        if num_cut:
            metrics.TRUNCATED_OBSERVATIONS.labels(env_class).inc(num_cut)
        if not math.isfinite(response.reward):
            metrics.NONFINITE_REWARDS.labels(env_class).inc()
            log.warning(
                "environment %s returned a non-finite reward %s", env_class, response.reward
            )

    async def RunWorkflow(self, request, context):
        """Run a workflow session's agent once. What the agent's code does wrong is the
        response's `error`; only a bad request or an unknown session fails the call."""
        fail = self._fail
        start = time.perf_counter()
        session = self.sessions.get(request.session_id)
        if session is None:
            await fail(context, "RunWorkflow", Code.NOT_FOUND,
                       f"session_id: no open session {request.session_id!r}")  # fmt: skip
        if not isinstance(session.env, WorkflowEnv):
            await fail(context, "RunWorkflow", Code.FAILED_PRECONDITION,
                       f"{session.env_class} is stepped (Step), not a workflow")  # fmt: skip
        for field_name in ("base_url", "api_key"):
            if not getattr(request, field_name):
                await fail(context, "RunWorkflow", Code.INVALID_ARGUMENT, f"{field_name}: required")
        async with session.lock:
            if session.closed:
                await fail(context, "RunWorkflow", Code.NOT_FOUND, "session_id: session was closed")
            if session.workflow_response is not None:
                return session.workflow_response  # a retried run: the answer it had
            session.last_used = time.monotonic()
            outcome = await session.env.run(request.base_url, request.api_key)
            if outcome.error:
                log.warning("workflow %s session %s: %s", session.env_class, session.id,
                            outcome.error)  # fmt: skip
            session.workflow_response = workflow_response(outcome)
            session.done = True
            session.last_used = time.monotonic()
        metrics.STEPS.labels(session.env_class).inc()
        metrics.STEP_SECONDS.labels(session.env_class).observe(time.perf_counter() - start)
        return session.workflow_response

    async def Close(self, request, context):
        if not request.session_id:
            await self._fail(context, "Close", Code.INVALID_ARGUMENT, "session_id: required")
        if not await self.close_session(request.session_id):
            await self._fail(
                context,
                "Close",
                Code.NOT_FOUND,
                f"session_id: no open session {request.session_id!r}",
            )
        return env_pb2.CloseResponse()

    async def close_session(self, session_id: str) -> bool:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        metrics.ACTIVE_SESSIONS.labels(session.env_class).dec()
        async with session.lock:  # let a step in flight finish before its env goes away
            session.closed = True
            await close_env(session.env)
        return True

    async def sweep_idle(self) -> int:
        """Close sessions idle longer than the TTL (not ones with a step in flight)."""
        horizon = time.monotonic() - self.config.session_idle_ttl_s
        stale = [
            s.id for s in self.sessions.values() if s.last_used < horizon and not s.lock.locked()
        ]
        for session_id in stale:
            await self.close_session(session_id)
        return len(stale)

    async def run_sweeper(self) -> None:
        period = max(0.05, self.config.session_idle_ttl_s / 4)
        while True:
            await asyncio.sleep(period)
            closed = await self.sweep_idle()
            if closed:
                log.info("closed %d idle sessions", closed)

    async def close_all(self) -> None:
        for session_id in list(self.sessions):
            await self.close_session(session_id)

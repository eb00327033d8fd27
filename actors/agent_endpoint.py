"""An OpenAI-compatible chat-completions endpoint in front of a replica's own engine, for
agents that hold their loop as `openai` calls: each episode gets a base URL and an API key
naming it, and every call is served token in / token out (actors/agent_calls.py).

    endpoint = AgentEndpoint(engine, chat, limits, model_name=...)
    base_url = await endpoint.serving()               # aiohttp, in the actor's event loop
    key, calls = endpoint.open_episode(sampling, seed) # an agent uses base_url + key
    ...                                                # its calls land in `calls.segments`
    calls = endpoint.close_episode(key)                # the key is refused from now on

    GET  /v1/models             the one model served
    POST /v1/chat/completions   messages (+ tools) in, one assistant message out

It is no open model server: a key that names no open episode gets 401, on every route. What
an agent asks about sampling (temperature, top_p, n > 1, logprobs) is not its to choose in
RL: the episode samples as the rollout is configured, and `max_tokens` can only shorten a
turn. `stream: true` is refused (400), as is a call the episode cannot serve (malformed
messages, a context longer than the rollout allows): an error the agent sees, never a
crashed replica. Tool calls in the answer are read with the model family's parser
(`family_tool_calls(tool_format)`, the formats the env servers read) and returned as
ordinary `tool_calls`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from actors.agent_calls import AgentCalls, CallRefused
from actors.chat import ChatTemplate
from actors.config import AgentEndpointConfig, RolloutConfig, SamplingConfig
from actors.types import Engine, Turn
from common.tool_formats import parser_for
from common.tool_parsing import ToolCall

log = logging.getLogger(__name__)

ToolCallParser = Callable[[str], list[dict[str, Any]]]


def family_tool_calls(tool_format: str) -> ToolCallParser:
    """The tool calls of an answer in the model family's format (common/tool_formats.py),
    as OpenAI function calls. A malformed call is left in the text: the agent sees what the
    model wrote, as an env would show it an error."""
    parse = parser_for(tool_format)

    def calls(text: str) -> list[dict[str, Any]]:
        return [
            {"name": call.name, "arguments": json.dumps(call.arguments)}
            for call in parse(text)
            if isinstance(call, ToolCall)
        ]

    return calls


@dataclass
class _Episode:
    calls: AgentCalls
    sampling: SamplingConfig
    seed: int | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class AgentEndpoint:
    def __init__(
        self,
        engine: Engine,
        chat: ChatTemplate,
        limits: RolloutConfig,
        *,
        model_name: str,
        parse_tool_calls: ToolCallParser | None = None,
        address: AgentEndpointConfig | None = None,
    ) -> None:
        self.engine, self.chat, self.limits = engine, chat, limits
        self.model_name = model_name
        self.address = address or AgentEndpointConfig()
        self.parse_tool_calls = parse_tool_calls
        self.episodes: dict[str, _Episode] = {}
        self.runner: web.AppRunner | None = None
        self.port = 0
        self._starting = asyncio.Lock()

    # ---- episodes ---------------------------------------------------------------------------

    def open_episode(
        self, sampling: SamplingConfig, seed: int | None = None
    ) -> tuple[str, AgentCalls]:
        """A new episode's API key and the record its calls fill."""
        key = "tether-ep-" + secrets.token_urlsafe(24)
        calls = AgentCalls(self.chat, max_input_length=self.limits.max_input_length)
        self.episodes[key] = _Episode(calls, sampling, seed)
        return key, calls

    def close_episode(self, key: str) -> AgentCalls:
        """End the episode: its key is refused from now on. Returns what its calls made."""
        return self.episodes.pop(key).calls

    # ---- HTTP -----------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application(middlewares=[self._authorised])
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port).start()
        self.port = self.runner.addresses[0][1]  # the port picked, for 0

    async def serving(self) -> str:
        """Start on first use (most runs have no workflow: no port for them) on the
        configured address; the base URL agents are given."""
        async with self._starting:
            first = self.runner is None
            if first:
                await self.start(self.address.host, self.address.port)
        url = self.base_url(self.address.advertise_host or self.address.host)
        if first:
            log.info("agent endpoint serving on %s (for agent workflows)", url)
        return url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def base_url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/v1"

    @web.middleware
    async def _authorised(self, request: web.Request, handler):
        if self._episode(request) is None:
            return _error(401, "authentication_error",
                          "this key names no open episode of this replica")  # fmt: skip
        return await handler(request)

    def _episode(self, request: web.Request) -> _Episode | None:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return None
        return self.episodes.get(header.removeprefix("Bearer ").strip())

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "tether"}
        return web.json_response({"object": "list", "data": [model]})

    async def _chat_completions(self, request: web.Request) -> web.Response:
        episode = self._episode(request)
        if episode is None:  # ended since the middleware looked
            return _error(401, "authentication_error", "this episode has ended")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "invalid_request_error", "the body is not JSON")
        if problem := _unsupported(body):
            return _error(400, "invalid_request_error", problem)
        async with episode.lock:  # one call of an episode at a time (actors/agent_calls.py)
            try:
                plan = episode.calls.plan(body.get("messages"), body.get("tools"))
            except CallRefused as e:
                return _error(400, "invalid_request_error", str(e))
            turn = self._turn(episode, body, len(plan.prompt_ids))
            if turn is None:
                room = f"max_sequence_length {self.limits.max_sequence_length}"
                return _error(400, "invalid_request_error", f"context too long: {room} is full")
            started = time.perf_counter()
            generation = await self.engine.generate(plan.prompt_ids, turn)
            episode.calls.generate_s += time.perf_counter() - started
            text = self.chat.assistant_text(generation.token_ids)
            tool_calls = self._tool_calls(text) if plan.tools else []
            message = episode.calls.record(plan, generation, tool_calls, text)
        finish = "tool_calls" if tool_calls else generation.finish_reason
        return web.json_response({
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": len(plan.prompt_ids),
                "completion_tokens": len(generation.token_ids),
                "total_tokens": len(plan.prompt_ids) + len(generation.token_ids),
            },
        })  # fmt: skip

    def _turn(self, episode: _Episode, body: dict[str, Any], context: int) -> Turn | None:
        """The rollout's sampling; as many tokens as the turn and the sequence allow, or
        fewer when the agent asks. None when the sequence has no room left."""
        limit = min(self.limits.max_generate_length, self.limits.max_sequence_length - context)
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(asked, int) and asked > 0:
            limit = min(limit, asked)
        if limit <= 0:
            return None
        return Turn(episode.sampling, limit, (self.chat.eos_token_id,), episode.seed)

    def _tool_calls(self, text: str) -> list[dict[str, Any]]:
        if self.parse_tool_calls is None:
            return []
        return [
            {"id": f"call_{secrets.token_hex(8)}", "type": "function", "function": call}
            for call in self.parse_tool_calls(text)
        ]


def _unsupported(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if body.get("stream"):
        return "stream: streaming is not served; call without it"
    if body.get("n", 1) != 1:
        return "n: one choice per call (a group's samples are separate episodes)"
    if not isinstance(body.get("messages"), list):
        return "messages: a list of chat messages is required"
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "tools: must be a list of function tools"
    return None


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)

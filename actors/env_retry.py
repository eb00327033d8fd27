"""Env servers fail: this is how an episode survives it. Opens are retried with backoff
(the connector moves to another address each time); a failed step re-opens the session
elsewhere and replays the episode's earlier actions, which must reproduce the recorded
observations, before stepping again. After `attempts` tries the episode ends with an
`error:env_open` / `error:env_step` / `error:env_replay` stop reason (`EnvFailed`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from actors.config import EnvConfig
from actors.types import EnvConnector, EnvSession, EpisodeResult
from protos.client import EnvUnavailable
from protos.types import StepResult

log = logging.getLogger(__name__)


class EnvFailed(Exception):
    def __init__(self, stop_reason: str, detail: str) -> None:
        super().__init__(detail)
        self.stop_reason = stop_reason


async def open_session(
    env: EnvConnector,
    env_class: str,
    row: dict,
    retry: EnvConfig,
    result: EpisodeResult,
    opened: list[EnvSession],
) -> EnvSession:
    """Open a session, retrying with backoff (the connector moves to another address)."""
    last_error: Exception | None = None
    for attempt in range(retry.attempts):
        if attempt:
            result.num_env_retries += 1
            await asyncio.sleep(retry.delay_s(attempt - 1))
        start = time.perf_counter()
        try:
            session = await env.open(env_class, row)
            opened.append(session)
            return session
        except EnvUnavailable as e:  # retryable by contract
            last_error = e
        finally:
            result.timing["env_s"] += time.perf_counter() - start
    raise EnvFailed("error:env_open", f"{retry.attempts} attempts failed, last: {last_error}")


async def step_session(
    env: EnvConnector,
    session: EnvSession,
    env_class: str,
    row: dict,
    actions: list[str],
    observations: list[list[dict]],
    retry: EnvConfig,
    result: EpisodeResult,
    opened: list[EnvSession],
) -> tuple[StepResult, EnvSession]:
    """Step with the newest action. If the server fails, open a session elsewhere, replay the
    earlier actions (they must reproduce the recorded observations), and step again."""
    last_error: Exception | None = None
    for attempt in range(retry.attempts):
        if attempt:
            result.num_env_retries += 1
            await asyncio.sleep(retry.delay_s(attempt - 1))
            await close_session(session)
            try:
                session = await open_session(env, env_class, row, retry, result, opened)
            except EnvFailed as e:
                raise EnvFailed("error:env_step", f"re-opening after {last_error}: {e}") from e
            start = time.perf_counter()
            try:
                await replay(session, actions[:-1], observations)
            except EnvUnavailable as e:
                last_error = e
                continue
            finally:
                result.timing["env_s"] += time.perf_counter() - start
        start = time.perf_counter()
        try:
            step = await session.step(actions[-1])
        except EnvUnavailable as e:
            last_error = e
            continue
        finally:
            result.timing["env_s"] += time.perf_counter() - start
        result.env_step_latencies_s.append(time.perf_counter() - start)
        return step, session
    raise EnvFailed("error:env_step", f"{retry.attempts} attempts failed, last: {last_error}")


async def replay(session: EnvSession, actions: list[str], observations: list[list[dict]]) -> None:
    """Step a fresh session through `actions`; EnvFailed(`error:env_replay`) unless each
    gives back its recorded observations (EnvUnavailable when the server fails meanwhile)."""
    for action, expected in zip(actions, observations, strict=True):
        step = await session.step(action)
        if step.done or list(step.observations) != expected:
            raise EnvFailed(
                "error:env_replay", "a re-opened env session did not replay the episode"
            )


async def close_session(session: EnvSession) -> None:
    try:
        await session.close()
    except EnvUnavailable as e:  # the server is gone; its session went with it
        log.info("closing env session failed: %s", e)

"""Are the env servers up? Asked when a replica starts, before its engine: a wrong
`actor.env.addresses` entry, or a server not started yet, is a line within seconds naming
the address, not `env_open: 6 attempts failed` half a minute into the first group.

Not fatal: env servers may start after the actors (a cluster starts pods in any order, and
a server restarts), and episodes already retry elsewhere (actors/env_retry.py). So the
replica goes on, asks again with backoff (common/waiting.py), says so every ~30 s while any
server stays silent, and once when they all answer.

    task = await check_then_watch(client)    # one line now naming the silent servers; the
                                             # task asks them again (and closes client)
"""

from __future__ import annotations

import asyncio
import logging
import time

from common.waiting import Waiting
from protos.client import EnvClient

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 2.0
"""Deadline of one health check (a silent host costs this much, a refusal nothing)."""
HINT = "is `envserver --config C` running there? (actor.env.addresses)"


async def silent_servers(client: EnvClient, timeout_s: float = CHECK_TIMEOUT_S) -> dict[str, str]:
    """{address: what is wrong} of the env servers that do not say SERVING now."""
    answers = await asyncio.gather(
        *(client.health(a, timeout_s=timeout_s) for a in client.addresses)
    )
    return {address: why for address, why in zip(client.addresses, answers, strict=True) if why}


async def check_then_watch(client: EnvClient) -> asyncio.Task:
    """Ask every server now and name the silent ones in one line; then a task that asks
    them again until all answer. The task owns `client` and closes it when it ends."""
    silent = await silent_servers(client)
    if silent:
        log.warning(
            "env server not answering at %s: %s; episodes wait and retry", _list(silent), HINT
        )
    return asyncio.create_task(_ask_until_answered(client, silent))


async def _ask_until_answered(client: EnvClient, silent: dict[str, str]) -> None:
    try:
        waiting = Waiting(started_at=time.monotonic(), first_s=1.0, max_s=10.0)
        step = waiting.failed(time.monotonic())  # the first check, already said
        while silent:
            await asyncio.sleep(step.delay_s)
            answers = await asyncio.gather(
                *(client.health(a, timeout_s=CHECK_TIMEOUT_S) for a in silent)
            )
            silent = {address: why for address, why in zip(silent, answers, strict=True) if why}
            step = waiting.failed(time.monotonic())
            if not silent:
                log.info("env servers answer now (after %.0fs)", step.waited_s)
            elif step.say:
                log.warning(
                    "env server still not answering at %s after %.0fs: %s",
                    _list(silent),
                    step.waited_s,
                    HINT,
                )
    finally:
        await client.close()


def _list(silent: dict[str, str]) -> str:
    return ", ".join(f"{address} ({why})" for address, why in silent.items())

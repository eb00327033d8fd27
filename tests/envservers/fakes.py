"""Small test-only environments (kept in the repo, no mock framework)."""

from __future__ import annotations

import asyncio

from envservers.types import Environment, EnvProvider
from protos.types import Observation, StepResult


class FaultyEnv(Environment):
    """Raises inside step when the action says "boom"; echoes otherwise."""

    async def reset(self, task):
        if (task.get("extra_info") or {}).get("reject"):
            raise ValueError("extra_info.reject: this row is refused")
        return Observation(messages=list(task.get("prompt", [])))

    async def step(self, action_text):
        if action_text == "boom":
            raise RuntimeError("the env blew up")
        return StepResult([{"role": "user", "content": action_text}], 0.5, False, {"ok": True})


class FaultyProvider(EnvProvider):
    description = "test env that raises on 'boom'"

    def make(self):
        return FaultyEnv()


class SlowEnv(Environment):
    """Each step sleeps for the number of seconds in the action, then echoes it."""

    async def reset(self, task):
        return Observation(messages=[])

    async def step(self, action_text):
        await asyncio.sleep(float(action_text))
        return StepResult([{"role": "user", "content": action_text}], 1.0, False, {})


class SlowProvider(EnvProvider):
    description = "test env whose steps sleep"

    def make(self):
        return SlowEnv()

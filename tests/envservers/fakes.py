"""Small test-only environments (kept in the repo, no mock framework)."""

from __future__ import annotations

import asyncio
import math

from envservers.types import Environment, EnvProvider
from protos.types import Observation, StepResult


class FaultyEnv(Environment):
    """Raises inside step when the action says "boom"; rewards "inf-reward" with infinity;
    echoes otherwise."""

    async def reset(self, task):
        if (task.get("extra_info") or {}).get("reject"):
            raise ValueError("extra_info.reject: this row is refused")
        return Observation(messages=list(task.get("prompt", [])))

    async def step(self, action_text):
        if action_text == "boom":
            raise RuntimeError("the env blew up")
        reward = math.inf if action_text == "inf-reward" else 0.5
        return StepResult([{"role": "user", "content": action_text}], reward, False, {"ok": True})


class FaultyProvider(EnvProvider):
    description = "test env that raises on 'boom'"

    def make(self):
        return FaultyEnv()


class UnmakeableProvider(EnvProvider):
    """A provider whose sessions cannot be made (its `make` raises)."""

    description = "test env whose make() raises"

    def make(self):
        raise RuntimeError("no sandbox left")


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


class GatedEnv(Environment):
    """Reset waits until its provider's gate opens; close is recorded."""

    def __init__(self, provider: GatedProvider) -> None:
        self.provider = provider

    async def reset(self, task):
        await self.provider.gate.wait()
        return Observation(messages=list(task.get("prompt", [])))

    async def step(self, action_text):
        return StepResult([], 0.0, True, {})

    async def close(self):
        self.provider.num_closed += 1


class GatedProvider(EnvProvider):
    """Counts the envs it made and the ones closed; `gate` holds every reset."""

    description = "test env whose reset waits for a gate"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.num_made = 0
        self.num_closed = 0

    def make(self):
        self.num_made += 1
        return GatedEnv(self)


class BigResetProvider(EnvProvider):
    """Its reset answers any task with one user message of `num_chars` characters."""

    description = "test env with a huge first observation"

    def __init__(self, num_chars: int) -> None:
        self.num_chars = num_chars

    def make(self):
        return _BigResetEnv(self.num_chars)


class _BigResetEnv(Environment):
    def __init__(self, num_chars: int) -> None:
        self.num_chars = num_chars

    async def reset(self, task):
        return Observation(messages=[{"role": "user", "content": "x" * self.num_chars}])

    async def step(self, action_text):
        return StepResult([], 0.0, True, {})

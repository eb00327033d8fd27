"""Small stand-ins for the engine and the env servers, for unit tests of the rollout logic
and the actor loop (acme's `fakes.py`): same interfaces, no vLLM, no gRPC.

- `ScriptedEngine`: answers each prompt with text chosen by a script, tokenised with the
  real tokenizer and closed with EOS; cuts at `max_tokens` (finish `length`). Logprobs are a
  fixed function of position, versions come from `engine.version` (or a per-token
  schedule), and every call and answer is recorded for the test to compare against.
- `InProcessEnv`: the env connector over the env server's REAL environments, run in this
  process (no second implementation of any environment), with named "addresses" a test can
  take down to simulate an outage, an optional step delay, and env classes it does not host
  (the task is rejected).
- `SilentFollower`: a weight broadcast follower that never delivers a round (monkeypatched
  over `weights.actor_side.follower.BroadcastFollower`), so only snapshots move the engine's
  version.
- `ScriptedFollower`: one whose rounds the test plays (`land`, `fail`), calling back as the
  real follower does.
- `FakeReplicaHandle`: a replica handle (actors/replicas.py) that has exited with a given
  code, or runs until terminated, for tests of the replica supervisor.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.types import Generation, Turn
from envservers.envs.calculator import CalculatorProvider
from envservers.types import Environment, EnvProvider
from protos.client import EnvUnavailable, TaskRejected
from protos.types import Observation, StepResult

GENERATION_PROMPT = "<|im_start|>assistant\n"


@dataclass(frozen=True)
class Call:
    """One generate call as the scripted engine saw it."""

    prompt_token_ids: list[int]
    turn: Turn


def by_turn(*replies: str) -> Callable[[str], str]:
    """A script answering turn k of an episode with replies[k] (the last one repeats);
    the turn is the number of generation prompts in the prompt text, minus one."""
    assert replies, "give at least one reply"

    def reply(prompt_text: str) -> str:
        turn = prompt_text.count(GENERATION_PROMPT) - 1
        return replies[min(turn, len(replies) - 1)]

    return reply


def fake_logprob(position: int) -> float:
    """Logprob the fake engine reports for the token at `position` within a turn."""
    return -0.125 * (1 + position % 8)  # exact in float32


class ScriptedEngine:
    """The Engine interface with scripted answers."""

    def __init__(
        self,
        tokenizer: Any,
        script: Callable[[str], str],
        *,
        version: int = 0,
        version_of_token: Callable[[int], int] | None = None,
        delay_s: float = 0.0,
        delay_for_seed: dict[int, float] | None = None,
        delay_for_turn: dict[int, float] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.version = version
        self.version_of_token = version_of_token
        """If set: version of the k-th token this engine ever generates (mid-turn updates)."""
        self.delay_s = delay_s
        self.delay_for_seed = delay_for_seed or {}
        """Per-request delay by sampling seed (sample i of a seeded group has seed + i)."""
        self.delay_for_turn = delay_for_turn or {}
        """Per-request delay by the episode's turn (0: the first), before the above."""
        self.num_weight_slots = 1
        self.snapshots_loaded: list[tuple[str, int]] = []
        self.calls: list[Call] = []
        self.generations: list[Generation] = []
        self.num_generated = 0
        self.in_flight = 0
        self.max_in_flight = 0
        """Most generate calls ever running at once (concurrency of a group)."""

    async def generate(self, prompt_token_ids: list[int], turn: Turn) -> Generation:
        self.calls.append(Call(list(prompt_token_ids), turn))
        max_tokens, seed = turn.max_tokens, turn.seed
        prompt_text = self.tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        ids = self.tokenizer.encode(self.script(prompt_text), add_special_tokens=False)
        ids = list(ids) + [self.tokenizer.eos_token_id]
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            # Even without a delay, yield: sibling episodes interleave as on a real engine.
            turn_index = prompt_text.count(GENERATION_PROMPT) - 1
            delay = self.delay_for_seed.get(seed, self.delay_s)
            await asyncio.sleep(self.delay_for_turn.get(turn_index, delay))
        finally:
            self.in_flight -= 1
        first = self.num_generated
        self.num_generated += len(ids)
        versions = [
            self.version_of_token(first + i) if self.version_of_token else self.version
            for i in range(len(ids))
        ]
        generation = Generation(
            token_ids=ids,
            logprobs=[fake_logprob(i) for i in range(len(ids))],
            finish_reason=finish,
            versions=versions,
        )
        self.generations.append(generation)
        return generation

    async def load_snapshot(self, path: str, version: int) -> float:
        """Pretend to load a weights snapshot: later tokens are tagged `version`."""
        self.snapshots_loaded.append((path, version))
        self.version = version
        return 0.0


class SilentFollower:
    """A weight broadcast that never delivers a round (and seated us in every one)."""

    missed_version = -1

    def __init__(self, engine, address, *, on_update=None, on_failure=None) -> None:
        pass

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def leave(self) -> None:
        pass


class ScriptedFollower(SilentFollower):
    """A weight broadcast whose rounds the test plays: `land(version)` sets the engine's
    version and calls `on_update`; `await fail(weights_mixed=...)` leaves it and awaits
    `on_failure`, as `weights.actor_side.follower.follow_weights` does. Every instance made is in
    `ScriptedFollower.made` (newest last)."""

    made: list[ScriptedFollower] = []

    def __init__(self, engine, address, *, on_update=None, on_failure=None) -> None:
        self.engine, self.on_update, self.on_failure = engine, on_update, on_failure
        ScriptedFollower.made.append(self)

    def land(self, version: int) -> None:
        from weights.actor_side.follower import WeightUpdate

        self.engine.version = version
        if self.on_update is not None:
            self.on_update(WeightUpdate(version, 0.0, 0.0, 0.0, 0.0, 0))

    async def fail(self, *, weights_mixed: bool) -> None:
        from weights.actor_side.follower import WeightUpdateError

        error = WeightUpdateError("a peer died mid-round", weights_mixed=weights_mixed)
        if self.on_failure is not None:
            await self.on_failure(error)


class InProcessSession:
    """One episode of a real environment, held by one (pretend) server address."""

    def __init__(self, client: InProcessEnv, address: str, env: Environment) -> None:
        self.client, self.address, self.env = client, address, env
        self.observation: Observation | None = None
        self.actions: list[str] = []
        self.closed = False

    async def step(self, action_text: str) -> StepResult:
        await asyncio.sleep(self.client.step_delay_s)
        if self.address in self.client.down:
            raise EnvUnavailable(f"env server {self.address} is down")
        self.actions.append(action_text)
        return await self.env.step(action_text)

    async def close(self) -> None:
        if not self.closed:  # idempotent, like protos.client
            self.closed = True
            self.client.num_closed += 1
            await self.env.close()


class InProcessEnv:
    """The env connector interface over real environments: opens go round robin over
    `addresses`; an address in `down` refuses opens and fails the steps of its sessions
    with EnvUnavailable; an env class not in `providers` rejects the task."""

    def __init__(
        self,
        addresses: tuple[str, ...] = ("env-a", "env-b"),
        *,
        providers: dict[str, EnvProvider] | None = None,
        step_delay_s: float = 0.0,
    ) -> None:
        self.addresses = addresses
        self.providers = providers or {"calculator": CalculatorProvider()}
        self.step_delay_s = step_delay_s
        self.down: set[str] = set()
        self.sessions: list[InProcessSession] = []
        self.num_open_failures = 0
        self.num_closed = 0
        self._next = itertools.cycle(addresses)

    async def open(self, env_class: str, task: dict[str, Any]) -> InProcessSession:
        await asyncio.sleep(0)
        address = next(self._next)
        if address in self.down:
            self.num_open_failures += 1
            raise EnvUnavailable(f"env server {address} is down")
        provider = self.providers.get(env_class)
        if provider is None:
            raise TaskRejected(f"unknown env_class {env_class!r}")
        session = InProcessSession(self, address, provider.make())
        try:
            session.observation = await session.env.reset(task)
        except ValueError as e:  # the env refuses the row, as the server's INVALID_ARGUMENT
            raise TaskRejected(f"env server refused the task: {e}") from e
        self.sessions.append(session)
        return session


def fake_replica_main(spec) -> None:
    """Replica process body on fakes (target `tests.fakes:fake_replica_main`): the real
    actor loop and bus, a ScriptedEngine and an InProcessEnv. `spec.extra` holds `replies`
    (by_turn script), `delay_s`, `delay_for_seed` ({seed: seconds}) and `env_down`."""
    from actors.actor import Actor
    from actors.chat import ChatTemplate
    from actors.replica import actor_id_of, run_replica
    from demo.tokenizer import build_tokenizer

    async def build(spec, config, broker):
        tokenizer = build_tokenizer(num_conversations=200)
        extra = spec.extra
        engine = ScriptedEngine(
            tokenizer,
            by_turn(*extra.get("replies", ["<answer>42</answer>"])),
            delay_s=extra.get("delay_s", 0.0),
            delay_for_seed={int(k): v for k, v in extra.get("delay_for_seed", {}).items()},
        )
        env = InProcessEnv()
        env.down.update(extra.get("env_down", ()))
        actor = Actor(
            config=config,
            broker=broker,
            engine=engine,
            env=env,
            chat=ChatTemplate(tokenizer),
            actor_id=extra.get("actor_id", actor_id_of(spec)),
        )
        return actor, lambda: None

    run_replica(spec, build)


def engine_leaving_replica_main(spec) -> None:
    """Replica process body (target `tests.fakes:engine_leaving_replica_main`) that starts a
    child the way vLLM starts its engine process, writes the child's pid to
    `spec.extra["pid_file"]`, and runs until killed: the engine would outlive it."""
    import subprocess
    import time
    from pathlib import Path

    engine = subprocess.Popen(["sleep", "300"])
    Path(spec.extra["pid_file"]).write_text(str(engine.pid))
    time.sleep(300)


class FakeReplicaHandle:
    """A replica that exited with `exitcode` (None: alive until terminated or killed)."""

    def __init__(self, spec, exitcode: int | None) -> None:
        self.spec, self._exitcode, self.terminated = spec, exitcode, False

    @property
    def pid(self) -> int:
        return 1000 + self.spec.index

    @property
    def alive(self) -> bool:
        return self._exitcode is None and not self.terminated

    @property
    def exitcode(self) -> int | None:
        return self._exitcode

    def terminate(self) -> None:
        self.terminated = True

    def kill(self) -> None:
        self.terminated = True

    def join(self, timeout_s: float | None = None) -> None:
        pass

    def clear_leftovers(self) -> int:
        return 0

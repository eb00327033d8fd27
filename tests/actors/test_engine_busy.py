"""The actor's engine-busy clock: wall time with at least one generation in flight, counted
once however many overlap (bench/async.py and bench/peer_trl.py read it as 1 - idle)."""

import asyncio

import prometheus_client

from actors import metrics
from actors.config import SamplingConfig
from actors.types import Generation, Turn

TURN = Turn(SamplingConfig(), max_tokens=4)


class GatedEngine:
    """generate() returns when its gate opens."""

    version = 3

    def __init__(self) -> None:
        self.gates: list[asyncio.Event] = []

    async def generate(self, prompt_token_ids, turn):
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return Generation(token_ids=[1], logprobs=[0.0], finish_reason="stop", versions=[3])


async def test_overlapping_generations_count_their_union_once(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: now[0])
    engine = GatedEngine()
    clock = metrics.EngineBusyClock(engine)
    assert clock.version == 3

    first = asyncio.create_task(clock.generate([1], TURN))  # busy from t=100
    await asyncio.sleep(0)
    now[0] = 101.0
    second = asyncio.create_task(clock.generate([1], TURN))
    await asyncio.sleep(0)
    now[0] = 102.0
    engine.gates[0].set()
    await first
    now[0] = 103.0
    assert clock.busy_seconds() == 3.0  # still busy: the running stretch counts
    now[0] = 104.0
    engine.gates[1].set()
    assert (await second).token_ids == [1]
    assert clock.busy_seconds() == 4.0  # [100, 104]

    now[0] = 110.0  # idle 104..110 is not counted; a lone generation 110..110.5 is
    third = asyncio.create_task(clock.generate([1], TURN))
    await asyncio.sleep(0)
    now[0] = 110.5
    engine.gates[2].set()
    await third
    assert clock.busy_seconds() == 4.5
    served = prometheus_client.generate_latest().decode()
    assert "tether_actor_engine_busy_seconds_total 4.5" in served

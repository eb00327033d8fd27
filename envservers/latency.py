"""Heavy-tailed tool latency: each tool call waits a log-normal time before it runs, as real
tools do (a search API, a sandbox, a web page: mostly fast, sometimes very slow). For
benchmarks of asynchrony (bench/async.py) and for tests of straggler handling; off unless
configured (`[envserver.calculator] latency_median_s`).

A log-normal is fixed by its median and one upper quantile: median = exp(mu), and the q-th
quantile is exp(mu + z_q sigma), z_q the standard normal quantile (z_0.99 = 2.326). A median
of 50 ms and a p99 of 2 s give sigma = ln(40) / 2.326 = 1.586: the mean is 175 ms, one call
in ten waits over 380 ms. The wait is an `asyncio.sleep`: it costs the server no CPU, like
a tool waiting on someone else's machine.

A load step (`LoadStep`) multiplies every latency by a factor for a while, counted from the
server's first tool call: the tools of a run slowing down mid-run (a rate-limited API, a
busy sandbox pool), the workload an elastic fleet is measured under (bench/elastic.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

from common.tool_parsing import ToolCall
from envservers.tools import ToolGroup

log = logging.getLogger(__name__)


def lognormal_params(median_s: float, quantile_s: float, q: float = 0.99) -> tuple[float, float]:
    """(mu, sigma) of the log-normal whose median is `median_s` and q-quantile `quantile_s`."""
    if median_s <= 0 or quantile_s < median_s:
        raise ValueError(f"need 0 < median ({median_s}) <= quantile ({quantile_s})")
    if not 0.5 < q < 1:
        raise ValueError(f"q must be in (0.5, 1), got {q}")
    z = NormalDist().inv_cdf(q)
    return math.log(median_s), math.log(quantile_s / median_s) / z


@dataclass(frozen=True)
class LoadStep:
    """Latencies times `factor` from `after_s` to `after_s + for_s` past the first call."""

    factor: float
    after_s: float
    for_s: float

    def factor_at(self, since_first_call_s: float) -> float:
        inside = self.after_s <= since_first_call_s < self.after_s + self.for_s
        return self.factor if inside else 1.0


class ToolLatency:
    """Draws tool-call latencies: log-normal with the given median and p99, seeded, times
    the load step's factor while it lasts."""

    def __init__(
        self,
        median_s: float,
        p99_s: float,
        seed: int | None = None,
        step: LoadStep | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mu, self.sigma = lognormal_params(median_s, p99_s)
        self._rng = random.Random(seed)
        self.step = step
        self._clock = clock
        self._first_call: float | None = None
        self._factor = 1.0

    def sample(self) -> float:
        """One latency in seconds."""
        drawn = self._rng.lognormvariate(self.mu, self.sigma)
        if self.step is None:
            return drawn
        now = self._clock()
        if self._first_call is None:
            self._first_call = now
        factor = self.step.factor_at(now - self._first_call)
        if factor != self._factor:  # said with the wall clock, for whoever lines up the run
            log.info("load step: tool latency x%g from unix time %.3f", factor, time.time())
            self._factor = factor
        return drawn * factor


class DelayedTools(ToolGroup):
    """A tool group whose every call first waits a latency drawn from `latency`."""

    def __init__(self, group: ToolGroup, latency: ToolLatency) -> None:
        super().__init__(list(group.tools.values()))
        self.latency = latency

    def subset(self, names: list[str]) -> DelayedTools:
        return DelayedTools(super().subset(names), self.latency)

    async def call(self, call: ToolCall) -> tuple[str, bool]:
        await asyncio.sleep(self.latency.sample())
        return await super().call(call)

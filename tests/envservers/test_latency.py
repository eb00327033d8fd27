"""Heavy-tailed tool latency (envservers/latency.py) and the calculator that uses it."""

import json
import math

import pytest

from envservers import latency as latency_module
from envservers.config import CalculatorConfig, EnvServerConfig
from envservers.latency import LoadStep, ToolLatency, lognormal_params
from envservers.registry import build_providers
from tests.envservers.conftest import calculator_task


def test_lognormal_params_by_hand():
    # median 50 ms: mu = ln 0.05 = -2.9957; p99 2 s: sigma = ln(40) / z_0.99 = 3.68888 / 2.32635
    mu, sigma = lognormal_params(0.05, 2.0)
    assert mu == pytest.approx(-2.995732, abs=1e-6)
    assert sigma == pytest.approx(1.585696, abs=1e-5)
    # the limiting case: a quantile equal to the median is a constant
    assert lognormal_params(0.1, 0.1) == (pytest.approx(math.log(0.1)), 0.0)


@pytest.mark.parametrize("median, quantile", [(0.0, 1.0), (-1.0, 1.0), (0.5, 0.1)])
def test_lognormal_params_refuse_impossible_shapes(median, quantile):
    with pytest.raises(ValueError):
        lognormal_params(median, quantile)


def test_samples_have_the_asked_median_and_p99():
    latency = ToolLatency(0.05, 2.0, seed=0)
    draws = sorted(latency.sample() for _ in range(40_000))
    assert draws[len(draws) // 2] == pytest.approx(0.05, rel=0.05)
    assert draws[int(0.99 * len(draws))] == pytest.approx(2.0, rel=0.15)
    assert ToolLatency(0.05, 2.0, seed=3).sample() == ToolLatency(0.05, 2.0, seed=3).sample()


def _call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def test_a_latent_calculator_waits_one_draw_per_call_then_answers(monkeypatch):
    waits = []

    async def fake_sleep(seconds):
        waits.append(seconds)

    monkeypatch.setattr(latency_module.asyncio, "sleep", fake_sleep)
    config = EnvServerConfig(
        envs=["calculator"],
        calculator=CalculatorConfig(latency_median_s=0.05, latency_p99_s=2.0, latency_seed=7),
    )
    env = build_providers(config)["calculator"].make()
    task = calculator_task()
    task["extra_info"]["tools"] = ["add"]  # the narrowed group keeps the latency
    await env.reset(task)
    result = await env.step(_call("add", a=12, b=30) + _call("add", a=1, b=2))
    assert [o["content"] for o in result.observations] == ["42", "3"]
    expected = ToolLatency(0.05, 2.0, seed=7)
    assert waits == [expected.sample(), expected.sample()]


async def test_the_calculator_has_no_latency_unless_configured(monkeypatch):
    async def no_sleep(seconds):
        raise AssertionError("slept")

    monkeypatch.setattr(latency_module.asyncio, "sleep", no_sleep)
    env = build_providers(EnvServerConfig(envs=["calculator"]))["calculator"].make()
    await env.reset(calculator_task())
    assert (await env.step(_call("add", a=1, b=2))).observations[0]["content"] == "3"


def test_config_refuses_a_p99_below_the_median():
    with pytest.raises(ValueError, match="latency_p99_s"):
        CalculatorConfig(latency_median_s=0.5, latency_p99_s=0.1)


def test_a_load_step_multiplies_latencies_while_it_lasts_from_the_first_call():
    now = [100.0]
    plain = ToolLatency(0.05, 2.0, seed=5)
    stepped = ToolLatency(0.05, 2.0, seed=5, step=LoadStep(10.0, 30.0, 60.0), clock=lambda: now[0])
    ratios = []
    for t in (100.0, 129.0, 130.0, 189.0, 190.0):  # the first call at 100: the step is [130, 190)
        now[0] = t
        ratios.append(round(stepped.sample() / plain.sample(), 6))
    assert ratios == [1.0, 1.0, 10.0, 10.0, 1.0]


def test_a_load_step_without_a_latency_is_refused():
    with pytest.raises(ValueError, match="latency_median_s is 0"):
        CalculatorConfig(load_step_factor=10)

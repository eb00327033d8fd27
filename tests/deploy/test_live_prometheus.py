"""The shipped dashboard and alert rules against a real Prometheus scraping real processes.

    nats-server (session fixture) ◄──── actor replica (real loop, bus, /metrics, gRPC env
      ▲                                 │ client; ScriptedEngine instead of vLLM)
      │ this test: prompt tasks,        ▼
      │ policy versions, env sessions ► envserver (`envservers.cli --env calculator`)
      └─ stream and consumer info ───── learner_producer (learner.metrics.record_step, the
                                        learner's queue-depth poll, serve_metrics)
    prometheus (apt's binary, config from deploy/observability.py, alerts.yml + run_rules.yml)
        scrapes all three every second

Every `expr` of deploy/grafana/tether.json goes through Prometheus's /api/v1/query and must
succeed; all but the broker-failure queries (empty in a healthy run) must return a finite
value. Every alert and recording rule must evaluate without error on this data. The
tether_bus_* gauges come from the run's real streams: nothing consumes its trajectories, so
the ones the actor publishes wait there, and the count Prometheus scraped must lie between
what JetStream reported before and after.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from broker import client as bus
from broker.config import BrokerConfig
from broker.wire import PolicyVersion, PromptTask
from common.procs import free_port
from demo.data import SYSTEM_PROMPT
from deploy import observability
from deploy.grafana.dashboard import DASHBOARD_PATH, queries

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (`apt-get install prometheus`)"
)

# Grafana fills these in before a query reaches Prometheus. With a 1 s scrape interval
# Grafana's $__rate_interval would be 4 s; 10 s leaves room for late scrapes on a busy machine.
GRAFANA_VARIABLES = {"$__rate_interval": "10s", "$__range": "1h"}
EXPECTED_EMPTY = {
    # Counters with a `subject` label get series only once a publish is retried or a
    # message is corrupt; a healthy run has neither.
    "sum by (job, subject) (rate(tether_broker_publish_retries_total[5m]))",
    "sum by (job, subject) (rate(tether_broker_corrupt_messages_total[5m]))",
    # Env counters that move only on a hostile or broken env (docs/security.md).
    "sum by (env) (rate(tether_env_truncated_observations_total[5m]))",
    "sum by (env) (rate(tether_env_nonfinite_rewards_total[5m]))",
    # Broadcast rounds: this actor's scripted engine takes none (tests/actors/
    # test_actor_weights.py checks the two counters on real rounds).
    "sum by (instance) (rate(tether_actor_weight_update_bytes_total[$__rate_interval])) / "
    "(sum by (instance) (rate(tether_actor_weight_wire_seconds_total[$__rate_interval])) > 0)",
}
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
DATA_DEADLINE_S = 45.0


def _promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unsubstituted Grafana variable in {expr!r}"
    return expr


def _get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:  # Prometheus answers a bad query with 400 + JSON
        return e.code, e.read()


def _query(prom_url: str, expr: str) -> dict:
    status, body = _get(f"{prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    answer = json.loads(body)
    answer["http_status"] = status
    return answer


def _finite_values(answer: dict) -> list[float]:
    data = answer["data"]
    if data["resultType"] == "scalar":
        values = [float(data["result"][1])]
    else:
        values = [float(series["value"][1]) for series in data["result"]]
    return [v for v in values if math.isfinite(v)]


async def _wait_http(url: str, timeout_s: float, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, f"{process.args} exited with {process.returncode}"
        try:
            status, _ = await asyncio.to_thread(_get, url, 1.0)
            if status == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        assert time.monotonic() < deadline, f"{url} not ready after {timeout_s}s"
        await asyncio.sleep(0.2)


class Stack:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.processes[name] = subprocess.Popen(
            args, cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()  # the child holds its own descriptor
        return self.processes[name]

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}"
            for path in sorted(self.log_dir.glob("*.log"))
        )


def _task(index: int, *, min_version: int) -> PromptTask:
    return PromptTask(
        task_id=f"obs-{index}",
        step=index,
        min_version=min_version,
        group_size=2,
        env_class="calculator",
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "What is 17 + 25?"},
        ],
        reward_spec={"method": "rule", "ground_truth": "42"},
    )


async def _env_traffic(address: str, stop: asyncio.Event) -> None:
    """Episodes and two kinds of failed RPCs straight through protos.client, until stop."""
    import grpc

    from protos.client import EnvClient

    task = {"prompt": _task(0, min_version=0).prompt, "reward_spec": {"ground_truth": "42"}}
    async with EnvClient(address, max_retries=0) as client:
        while not stop.is_set():
            session = await client.open("calculator", task)
            await session.step(TOOL_CALL)
            result = await session.step("<answer>42</answer>")
            assert result.done and result.reward == 1.0
            with pytest.raises(grpc.aio.AioRpcError):  # FAILED_PRECONDITION: episode done
                await session.step("<answer>42</answer>")
            await session.close()
            with pytest.raises(grpc.aio.AioRpcError):  # NOT_FOUND: no such environment
                await client.open("no-such-env", task)
            await asyncio.sleep(0.3)


async def _actor_traffic(broker: BrokerConfig, stop: asyncio.Event) -> None:
    """Until stop: every second two prompt tasks for the actor replica, and every third a
    new policy version with a snapshot (which the scripted engine 'loads'). Half the tasks
    need the next version, so they wait for weights until it is announced."""
    nc = await bus.connect(broker.url, name="observability-test")
    try:
        js = nc.jetstream()
        await bus.ensure_streams(js, broker.names, broker.stream_limits())
        policy = bus.PolicyStore(js, broker.names)
        version, index = 0, 0
        while not stop.is_set():
            if index % 6 == 0:
                version += 1
                await policy.publish(
                    PolicyVersion(
                        version=version,
                        published_at=time.time(),
                        snapshot_path=f"/fake/v{version}",
                        snapshot_version=version,
                    )
                )
            tasks = [_task(index, min_version=version), _task(index + 1, min_version=version + 1)]
            await bus.publish_prompts(js, broker.names, tasks)
            index += 2
            await asyncio.sleep(1.0)
    finally:
        await nc.close()


@pytest.fixture(scope="module")
async def prometheus(tmp_path_factory, nats_server):
    """A running Prometheus (its URL) scraping the three real processes, with traffic."""
    tmp = tmp_path_factory.mktemp("observability")
    ports = {"learner": free_port(), "actor": free_port(), "envserver": free_port()}
    env_address = f"127.0.0.1:{free_port()}"
    prom_url = f"http://127.0.0.1:{free_port()}"
    broker = BrokerConfig(
        url=nats_server.url,
        namespace=f"t{uuid.uuid4().hex[:12]}",
        max_trajectory_bytes=64 * 1024**2,
    )
    actor_config = tmp / "actor.toml"
    actor_config.write_text(
        f"""
[broker]
url = "{broker.url}"
namespace = "{broker.namespace}"
max_trajectory_bytes = {broker.max_trajectory_bytes}

[actor]
metrics_port = {ports["actor"]}
heartbeat_s = 1.0
fetch_timeout_s = 0.2
drain_timeout_s = 0.0
log_level = "WARNING"
sampling = {{ seed = 0 }}
engine = {{ model = "unused-by-the-scripted-engine" }}
env = {{ addresses = ["{env_address}"], timeout_s = 10.0 }}
"""
    )
    config_path = observability.render(
        ports, tmp / "prometheus", actor_replicas=1, max_staleness=1, scrape_interval="1s"
    )
    stack = Stack(tmp)
    py = sys.executable
    stop = asyncio.Event()
    traffic: list[asyncio.Task] = []
    try:
        envserver = stack.start(
            "envserver",
            [
                py,
                "-m",
                "envservers.cli",
                "--env",
                "calculator",
                "--port",
                env_address.rsplit(":", 1)[1],
                f"envserver.metrics_port={ports['envserver']}",
                "envserver.log_level=WARNING",
            ],
        )
        producer = ["tests.deploy.learner_producer", str(ports["learner"])]
        bus_args = ["--bus", broker.url, broker.namespace, "--bus-interval-s", "0.5"]
        learner = stack.start("learner", [py, "-m", *producer, *bus_args])
        actor = stack.start("actor", [py, "-m", "tests.deploy.actor_producer", str(actor_config)])
        server = stack.start(
            "prometheus",
            observability.prometheus_command(config_path, listen=prom_url[len("http://") :]),
        )
        await _wait_http(f"{prom_url}/-/ready", 30, server)
        await _wait_http(f"http://127.0.0.1:{ports['envserver']}/metrics", 30, envserver)
        await _wait_http(f"http://127.0.0.1:{ports['learner']}/metrics", 30, learner)
        traffic.append(asyncio.create_task(_env_traffic(env_address, stop)))
        await _wait_http(f"http://127.0.0.1:{ports['actor']}/metrics", 60, actor)
        traffic.append(asyncio.create_task(_actor_traffic(broker, stop)))
        yield prom_url, stack, broker
        stop.set()
        await asyncio.gather(*traffic)  # re-raises a failure of the traffic itself
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stop.set()
        await asyncio.gather(*traffic, return_exceptions=True)
        stack.stop_all()


async def _answers_once_data_is_in(prom_url: str, exprs: list[str]) -> dict[str, dict]:
    """Query every expr until each expected one has a finite value (or the deadline)."""
    deadline = time.monotonic() + DATA_DEADLINE_S
    while True:
        answers = {e: await asyncio.to_thread(_query, prom_url, _promql(e)) for e in exprs}
        missing = [
            e
            for e, a in answers.items()
            if e not in EXPECTED_EMPTY and a["status"] == "success" and not _finite_values(a)
        ]
        if not missing or time.monotonic() > deadline:
            return answers
        await asyncio.sleep(1.0)


async def test_every_dashboard_query_returns_data_from_real_processes(prometheus):
    prom_url, stack, _ = prometheus
    started = time.monotonic()
    exprs = queries(json.loads(DASHBOARD_PATH.read_text()))
    assert EXPECTED_EMPTY <= set(exprs)
    answers = await _answers_once_data_is_in(prom_url, exprs)
    failed = {e: a for e, a in answers.items() if a["status"] != "success"}
    assert not failed, failed
    empty = [e for e, a in answers.items() if e not in EXPECTED_EMPTY and not _finite_values(a)]
    assert not empty, f"no finite value from {len(empty)} queries: {empty}\n{stack.logs()}"
    for expr in EXPECTED_EMPTY:
        assert answers[expr]["data"]["result"] == [], expr
    print(f"{len(exprs)} queries answered with data after {time.monotonic() - started:.1f}s")


async def test_every_target_is_up_and_every_rule_evaluates(prometheus):
    prom_url, _, _ = prometheus
    targets = json.loads(_get(f"{prom_url}/api/v1/targets")[1])["data"]["activeTargets"]
    assert sorted(t["labels"]["job"] for t in targets) == ["actor", "envserver", "learner"]
    assert all(t["health"] == "up" for t in targets), targets
    assert {t["labels"].get("replica") for t in targets if t["labels"]["job"] == "actor"} == {"0"}

    groups = json.loads(_get(f"{prom_url}/api/v1/rules")[1])["data"]["groups"]
    rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert len(rules) == 10  # 8 alerts + 2 recording rules
    for name, rule in rules.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
    # The recorded staleness share is exact here: 3 of the producer's 4 groups per step sit
    # at the bound of 1, so 1 - P(staleness <= 0) = 0.75.
    answer = _query(prom_url, "tether:learner_staleness_at_bound:ratio_rate15m")
    assert _finite_values(answer) == [pytest.approx(0.75)]


async def test_the_bus_gauges_are_what_jetstream_says(prometheus):
    """The trajectories the actor publishes wait in their stream (nothing fetches them), so
    its count only grows: the count Prometheus holds a few seconds after JetStream said `a`
    lies between `a` and what JetStream says right after the query."""
    prom_url, _, broker = prometheus
    queue = broker.names.trajectories
    nc = await bus.connect(broker.url, name="observability-check")
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + DATA_DEADLINE_S
        while (before := (await js.stream_info(queue.stream)).state.messages) == 0:
            assert time.monotonic() < deadline, "the actor published no trajectory"
            await asyncio.sleep(0.5)
        await asyncio.sleep(3.0)  # > the producer's poll (0.5 s) + a scrape (1 s), with slack
        scraped = {
            name: _finite_values(
                await asyncio.to_thread(
                    _query, prom_url, f'tether_bus_{name}{{queue="trajectories"}}'
                )
            )
            for name in ("stream_messages", "pending_messages", "stream_max_bytes")
        }
        after = (await js.stream_info(queue.stream)).state.messages
    finally:
        await nc.close()
    [messages], [pending], [max_bytes] = scraped.values()
    assert before <= messages <= after, (before, scraped, after)
    assert before <= pending <= after  # none fetched: every stored trajectory is pending
    assert max_bytes == broker.max_trajectory_bytes

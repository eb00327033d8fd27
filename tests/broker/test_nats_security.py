"""NATS authentication and TLS against a real nats-server started by the embedded launcher:
the right credentials (user/password or token, from the environment or a file) get in,
wrong or missing ones are refused at once; TLS verifies the server, mutual TLS refuses a
client without a certificate of the right CA, and no secret is sent to a server that does
not start TLS. Certificates are made at test time (tests/certs.py)."""

import asyncio
import os
import sys
from pathlib import Path

import pytest

from broker import client
from broker.config import BrokerTlsConfig
from broker.names import BusNames
from broker.security import BrokerRefused, InsecureBroker, NatsAuth
from broker.server import NatsServer
from broker.wire import PolicyVersion
from tests.certs import make_certs

REPO = Path(__file__).resolve().parents[2]
PASSWORD = 'p4ss w"rd\\ü'  # a space, a quote, a backslash, non-ASCII: all survive


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def _tls(certs, **fields) -> BrokerTlsConfig:
    values = dict(
        ca_file=str(certs.ca),
        server_cert_file=str(certs.server_cert),
        server_key_file=str(certs.server_key),
    )
    values.update(fields)
    return BrokerTlsConfig(**values)


async def _round_trip(url: str, *, tls: BrokerTlsConfig | None = None) -> None:
    """Connect, set up the run's streams and KV, write and read the policy version."""
    nc = await client.connect(url, name="security-test", tls=tls, connect_timeout_s=10)
    try:
        js = nc.jetstream()
        names = BusNames("sec")
        await client.ensure_streams(js, names, client.StreamLimits(max_trajectory_bytes=2**20))
        store = client.PolicyStore(js, names)
        await store.publish(PolicyVersion(version=1, published_at=0.0))
        assert (await store.get()).version == 1
    finally:
        await nc.close()


def _env(monkeypatch, **values) -> None:
    for name in ("NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)


async def test_user_and_password_are_required_and_checked(tmp_path, monkeypatch):
    auth = NatsAuth(user="tether", password=PASSWORD)
    with NatsServer(tmp_path, auth=auth) as server:
        assert PASSWORD not in (tmp_path / "nats-server.conf").read_text()
        _env(monkeypatch, NATS_USER="tether", NATS_PASSWORD=PASSWORD)
        await _round_trip(server.url)
        (tmp_path / "secret").write_text(PASSWORD + "\n")
        _env(monkeypatch, NATS_USER="tether", NATS_PASSWORD_FILE=str(tmp_path / "secret"))
        await _round_trip(server.url)
        for wrong in ({"NATS_USER": "tether", "NATS_PASSWORD": "guess"}, {}):
            _env(monkeypatch, **wrong)
            with pytest.raises(BrokerRefused, match="Authorization Violation"):
                await asyncio.wait_for(_round_trip(server.url), 30)  # at once, not forever
    assert PASSWORD not in (tmp_path / "nats-server.log").read_text()


async def test_a_token_is_required_and_checked(tmp_path, monkeypatch):
    with NatsServer(tmp_path, auth=NatsAuth(token="t0ken-of-the-run")) as server:
        _env(monkeypatch, NATS_TOKEN="t0ken-of-the-run")
        await _round_trip(server.url)
        _env(monkeypatch, NATS_TOKEN="another")
        with pytest.raises(BrokerRefused):
            await asyncio.wait_for(_round_trip(server.url), 30)


async def test_tls_verifies_the_server_and_carries_the_credentials(tmp_path, certs, monkeypatch):
    tls = _tls(certs)
    with NatsServer(tmp_path, auth=NatsAuth(token="tls-token"), tls=tls) as server:
        _env(monkeypatch, NATS_TOKEN="tls-token")
        await _round_trip(server.url, tls=tls)
        await _round_trip(server.url.replace("nats://", "tls://"), tls=tls)
        # A client that does not know the CA cannot verify the server: refused at once.
        strangers = BrokerTlsConfig(ca_file=str(certs.impostor_cert))
        with pytest.raises(BrokerRefused, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.wait_for(_round_trip(server.url, tls=strangers), 30)
        # A client without TLS settings is refused by the server.
        with pytest.raises(BrokerRefused):
            await asyncio.wait_for(_round_trip(server.url), 30)


async def test_mutual_tls_requires_a_client_certificate_of_the_ca(tmp_path, certs):
    tls = _tls(certs, verify_clients=True)
    with NatsServer(tmp_path, tls=tls) as server:
        mine = BrokerTlsConfig(
            ca_file=str(certs.ca), cert_file=str(certs.client_cert), key_file=str(certs.client_key)
        )
        await _round_trip(server.url, tls=mine)
        impostor = BrokerTlsConfig(
            ca_file=str(certs.ca),
            cert_file=str(certs.impostor_cert),
            key_file=str(certs.impostor_key),
        )
        for refused in (BrokerTlsConfig(ca_file=str(certs.ca)), impostor):
            with pytest.raises(BrokerRefused):
                await asyncio.wait_for(_round_trip(server.url, tls=refused), 30)


async def test_no_secret_goes_to_a_server_that_does_not_start_tls(tmp_path, certs, monkeypatch):
    # A plain server (misconfigured, or an impostor on the broker's address) that asks for
    # credentials: a client configured for TLS refuses to send them.
    with NatsServer(tmp_path, auth=NatsAuth(token="never-in-plain-text")) as server:
        _env(monkeypatch, NATS_TOKEN="never-in-plain-text")
        tls = BrokerTlsConfig(ca_file=str(certs.ca))
        with pytest.raises(InsecureBroker, match="did not start TLS"):
            await asyncio.wait_for(_round_trip(server.url, tls=tls), 30)
    with NatsServer(tmp_path / "open") as open_server:  # no auth: no data in plain text either
        _env(monkeypatch)
        with pytest.raises(InsecureBroker):
            await asyncio.wait_for(_round_trip(open_server.url, tls=tls), 30)


async def test_the_cli_server_takes_tls_from_the_config_and_auth_from_the_environment(
    tmp_path, certs, monkeypatch
):
    config = tmp_path / "c.toml"
    config.write_text(
        "[broker.tls]\n"
        f'ca_file = "{certs.ca}"\n'
        f'server_cert_file = "{certs.server_cert}"\n'
        f'server_key_file = "{certs.server_key}"\n'
    )
    _env(monkeypatch, NATS_TOKEN="cli-token")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker", "serve", "--port", "0",
        "--store-dir", str(tmp_path / "store"), "--config", str(config),
        stdout=asyncio.subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert line.startswith("nats-server ready at nats://127.0.0.1:"), line
        url = line.split()[3]
        await _round_trip(url, tls=BrokerTlsConfig(ca_file=str(certs.ca)))
        _env(monkeypatch, NATS_TOKEN="wrong")
        with pytest.raises(BrokerRefused):
            await asyncio.wait_for(_round_trip(url, tls=BrokerTlsConfig(ca_file=str(certs.ca))), 30)
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0
    assert "cli-token" not in (tmp_path / "store" / "nats-server.conf").read_text()

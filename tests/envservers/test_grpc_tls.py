"""gRPC TLS and mutual TLS on the env service, with certificates made at test time
(tests/certs.py): the actor's client (`actors.replica.env_client` from `[actor.env.tls]`)
plays episodes over TLS; plain clients, clients that do not trust the server, and (with
mutual TLS) clients without a certificate of the right CA are refused, while the server
keeps serving the honest one."""

import grpc
import pytest

from actors.config import EnvConfig
from actors.replica import env_client
from envservers.server import EnvServer
from protos.client import EnvClient
from tests.certs import make_certs
from tests.envservers.conftest import calculator_task, server_config

ADD = '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def _tls_server(certs, **tls):
    values = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key), **tls}
    return EnvServer(server_config(envs=["calculator"], metrics_port=None, tls=values))


async def _episode(client: EnvClient) -> float:
    session = await client.open("calculator", calculator_task())
    assert (await session.step(ADD)).observations[0]["content"] == "42"
    reward = (await session.step("<answer>42</answer>")).reward
    await session.close()
    return reward


async def _refused(client: EnvClient) -> grpc.StatusCode:
    async with client:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.open("calculator", calculator_task())
    return info.value.code()


async def test_tls_episode_and_refused_clients(certs):
    async with _tls_server(certs) as server:
        config = EnvConfig(addresses=[server.address], tls={"ca_file": str(certs.ca)})
        async with env_client(config) as client:
            assert await _episode(client) == 1.0
            plain = EnvClient(server.address, max_retries=0, timeout_s=5)
            assert await _refused(plain) == grpc.StatusCode.UNAVAILABLE
            stranger = EnvConfig(
                addresses=[server.address], timeout_s=5, tls={"ca_file": str(certs.impostor_cert)}
            )
            assert await _refused(env_client(stranger)) == grpc.StatusCode.UNAVAILABLE
            assert await _episode(client) == 1.0  # still served


async def test_mutual_tls_refuses_clients_without_a_certificate_of_the_ca(certs):
    async with _tls_server(certs, client_ca_file=str(certs.ca)) as server:
        mine = {
            "ca_file": str(certs.ca),
            "cert_file": str(certs.client_cert),
            "key_file": str(certs.client_key),
        }
        async with env_client(EnvConfig(addresses=[server.address], tls=mine)) as client:
            assert await _episode(client) == 1.0
            impostor = {
                **mine,
                "cert_file": str(certs.impostor_cert),
                "key_file": str(certs.impostor_key),
            }
            for tls in ({"ca_file": str(certs.ca)}, impostor):
                refused = env_client(EnvConfig(addresses=[server.address], timeout_s=5, tls=tls))
                assert await _refused(refused) == grpc.StatusCode.UNAVAILABLE
            assert await _episode(client) == 1.0


async def test_the_server_name_checked_can_be_set(certs):
    # The certificate names 127.0.0.1 and localhost: the name checked is server_name when
    # set (for addresses by IP with certificates by DNS name), and a wrong one is refused.
    async with _tls_server(certs) as server:
        for name, works in (("localhost", True), ("envserver.example", False)):
            tls = {"ca_file": str(certs.ca), "server_name": name}
            client = env_client(EnvConfig(addresses=[server.address], timeout_s=5, tls=tls))
            if works:
                async with client:
                    assert await _episode(client) == 1.0
            else:
                assert await _refused(client) == grpc.StatusCode.UNAVAILABLE


async def test_an_unreadable_certificate_is_an_error_naming_the_key(certs, tmp_path):
    server = EnvServer(
        server_config(
            envs=["calculator"],
            metrics_port=None,
            tls={"cert_file": str(tmp_path / "missing.pem"), "key_file": str(certs.server_key)},
        )
    )
    with pytest.raises(ValueError, match="envserver.tls.cert_file: cannot read"):
        await server.start()
    with pytest.raises(ValueError, match="actor.env.tls.ca_file: cannot read"):
        env_client(EnvConfig(tls={"ca_file": str(tmp_path / "missing-ca.pem")}))

"""`make run`'s bus always requires credentials (deploy/local.py `bus_credentials`): the
environment's, which the children inherit as they are, else a token made for the run and
handed only to the children that use the bus. Checked against a real nats-server."""

import pytest

from broker import client
from broker.security import BrokerRefused
from broker.server import NatsServer
from deploy.local import bus_credentials


def test_without_credentials_a_token_is_made_for_each_run():
    auth, child_env = bus_credentials({})
    again, _ = bus_credentials({})
    assert auth.token and child_env == {"NATS_TOKEN": auth.token}
    assert len(auth.token) >= 32 and again.token != auth.token
    assert auth.token not in repr(auth)


def test_the_environments_credentials_are_inherited_unchanged(tmp_path):
    (tmp_path / "token").write_text("mounted-token\n")
    auth, child_env = bus_credentials({"NATS_TOKEN_FILE": str(tmp_path / "token")})
    # Nothing added: a child given NATS_TOKEN beside the inherited NATS_TOKEN_FILE would
    # refuse the pair.
    assert auth.token == "mounted-token" and child_env == {}
    auth, child_env = bus_credentials({"NATS_USER": "u", "NATS_PASSWORD": "p"})
    assert (auth.user, auth.password, child_env) == ("u", "p", {})


async def test_a_child_with_the_run_token_gets_in_and_others_do_not(tmp_path, monkeypatch):
    auth, child_env = bus_credentials({})
    with NatsServer(tmp_path, auth=auth) as server:
        for name in ("NATS_USER", "NATS_PASSWORD", "NATS_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        with pytest.raises(BrokerRefused):
            await client.connect(server.url, name="outsider")
        monkeypatch.setenv("NATS_TOKEN", child_env["NATS_TOKEN"])
        nc = await client.connect(server.url, name="child")
        await nc.close()
    assert auth.token not in (tmp_path / "nats-server.conf").read_text()

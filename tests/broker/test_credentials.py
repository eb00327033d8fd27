"""broker/security.py NatsAuth: NATS credentials come from the environment or from files
only, never show in a repr, and reach nats-server's config only as variable names."""

import os
import subprocess

import pytest

from broker.security import NatsAuth, new_secret


def test_credentials_from_the_environment():
    assert NatsAuth.from_environment({}) is None
    env = {"NATS_USER": "tether", "NATS_PASSWORD": "s3cret", "OTHER": "x"}
    assert NatsAuth.from_environment(env) == NatsAuth(user="tether", password="s3cret")
    assert NatsAuth.from_environment({"NATS_TOKEN": "t0k"}) == NatsAuth(token="t0k")


def test_credentials_from_files(tmp_path):
    (tmp_path / "password").write_text("from-a-file\n")  # a mounted secret ends in a newline
    env = {"NATS_USER": "tether", "NATS_PASSWORD_FILE": str(tmp_path / "password")}
    assert NatsAuth.from_environment(env).password == "from-a-file"
    with pytest.raises(ValueError, match="NATS_TOKEN_FILE: cannot read"):
        NatsAuth.from_environment({"NATS_TOKEN_FILE": str(tmp_path / "missing")})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NATS_USER": "tether"}, "set both NATS_USER and NATS_PASSWORD"),
        ({"NATS_PASSWORD": "x"}, "set both NATS_USER and NATS_PASSWORD"),
        ({"NATS_USER": "u", "NATS_PASSWORD": "p", "NATS_TOKEN": "t"}, "not both"),
        ({"NATS_TOKEN": "t", "NATS_TOKEN_FILE": "/f"}, "NATS_TOKEN or NATS_TOKEN_FILE"),
    ],
)
def test_half_or_double_credentials_are_errors(env, message):
    with pytest.raises(ValueError, match=message):
        NatsAuth.from_environment(env)


def test_secrets_never_show_in_repr_or_in_the_server_config():
    auth = NatsAuth(user="tether", password="hunter2")
    assert "hunter2" not in repr(auth) and "hunter2" not in str(auth)
    assert "hunter2" not in auth.server_block()
    assert auth.server_block() == (
        "authorization {\n  user: $TETHER_NATS_USER\n  password: $TETHER_NATS_PASSWORD\n}\n"
    )
    assert "t0k" not in repr(NatsAuth(token="t0k"))


def test_server_variables_are_quoted_for_the_nats_config_parser():
    # nats-server parses a variable's value as config: quote it; no \u escapes, bytes as \xXX
    auth = NatsAuth(user="alice", password='a b"c\\dü')
    assert auth.server_environment() == {
        "TETHER_NATS_USER": '"alice"',
        "TETHER_NATS_PASSWORD": '"a b\\"c\\\\d\\xc3\\xbc"',
    }


def _server_accepts_password(value: str, tmp_path) -> bool:
    """Whether the real nats-server starts with `password: $PASSWORD`, the value unquoted,
    as the Kubernetes manifests' nats.conf takes it from the Secret."""
    from broker.server import nats_server_binary

    conf = tmp_path / "nats.conf"
    conf.write_text("authorization {\n  user: tether\n  password: $PASSWORD\n}\n")
    check = subprocess.run(
        [nats_server_binary(), "-c", str(conf), "-t"],
        env={**os.environ, "PASSWORD": value},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return check.returncode == 0


def test_generated_secrets_start_the_server_where_it_reads_them_unquoted(tmp_path):
    # Why new_secret exists: a value nats-server parses as a size or a date stops it.
    assert not _server_accepts_password("10M", tmp_path)
    assert not _server_accepts_password("12-ab", tmp_path)
    values = [new_secret() for _ in range(40)]
    assert all(value[0].isalpha() and len(value) >= 32 for value in values)
    assert len(set(values)) == len(values)
    assert all(_server_accepts_password(value, tmp_path) for value in values)

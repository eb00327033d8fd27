"""broker.connection.credentials: NATS user and password come from the environment only."""

import pytest

from broker.connection import credentials


def test_credentials_from_the_environment():
    assert credentials({}) == {}
    env = {"NATS_USER": "tether", "NATS_PASSWORD": "s3cret", "OTHER": "x"}
    assert credentials(env) == {"user": "tether", "password": "s3cret"}


def test_half_a_credential_is_an_error():
    with pytest.raises(ValueError, match="NATS_USER and NATS_PASSWORD"):
        credentials({"NATS_USER": "tether"})

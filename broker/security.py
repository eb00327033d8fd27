"""Who may use the bus and how its traffic is protected: NATS credentials from the
environment or from files (never from a config file, never logged, never written to a run
directory), the clients' TLS context, and the `authorization` and `tls` blocks of the
embedded nats-server's config.

Credentials, by the environment variables the `nats` CLI uses (a cluster fills them from a
Secret), each also readable from a file named by `<NAME>_FILE` (a mounted secret):

    NATS_USER + NATS_PASSWORD (or NATS_PASSWORD_FILE)    user and password
    NATS_TOKEN (or NATS_TOKEN_FILE)                      a bearer token

The embedded server takes the same credentials. Its config file names them only as
variables (`password: $TETHER_NATS_PASSWORD`); nats-server reads their values from its own
environment, so the file written into a run directory holds no secret.
"""

from __future__ import annotations

import os
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from broker.config import BrokerTlsConfig

SERVER_VARIABLES = {
    "user": "TETHER_NATS_USER",
    "password": "TETHER_NATS_PASSWORD",
    "token": "TETHER_NATS_TOKEN",
}
"""Environment variables of the embedded nats-server that its config refers to."""


class BrokerRefused(Exception):
    """The first connection failed for a reason retrying cannot fix: wrong credentials, a
    certificate that does not verify. Not a network error, so it is not retried."""


class InsecureBroker(BrokerRefused):
    """TLS is configured but the server did not start it: nothing secret is sent."""


@dataclass(frozen=True, repr=False)
class NatsAuth:
    """Credentials for NATS: a user and password, or a token. `repr` never shows a secret."""

    user: str = ""
    password: str = ""
    token: str = ""

    def __post_init__(self) -> None:
        if bool(self.user) != bool(self.password):
            raise ValueError("NATS credentials: set both NATS_USER and NATS_PASSWORD, or neither")
        if self.user and self.token:
            raise ValueError(
                "NATS credentials: set NATS_USER/NATS_PASSWORD or NATS_TOKEN, not both"
            )
        if not (self.user or self.token):
            raise ValueError("NATS credentials: none given")

    def __repr__(self) -> str:
        kind = f"user={self.user!r}, password=***" if self.user else "token=***"
        return f"NatsAuth({kind})"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> NatsAuth | None:
        """The credentials the environment gives, or None when it gives none."""
        user = environ.get("NATS_USER", "")
        password = _secret(environ, "NATS_PASSWORD")
        token = _secret(environ, "NATS_TOKEN")
        if not (user or password or token):
            return None
        return cls(user=user, password=password, token=token)

    def server_block(self) -> str:
        """The `authorization` block of nats-server's config: variable names, no secret."""
        if self.token:
            return f"authorization {{\n  token: ${SERVER_VARIABLES['token']}\n}}\n"
        return (
            "authorization {\n"
            f"  user: ${SERVER_VARIABLES['user']}\n"
            f"  password: ${SERVER_VARIABLES['password']}\n"
            "}\n"
        )

    def server_environment(self) -> dict[str, str]:
        """The values of `server_block`'s variables, quoted for nats-server's config parser
        (it parses a variable's value as config: a bare space or quote would break it)."""
        if self.token:
            return {SERVER_VARIABLES["token"]: _config_string(self.token)}
        return {
            SERVER_VARIABLES["user"]: _config_string(self.user),
            SERVER_VARIABLES["password"]: _config_string(self.password),
        }


def new_secret(num_bytes: int = 24) -> str:
    """A random password or token (urlsafe) that starts with a letter. A Kubernetes nats.conf
    takes the Secret's value as an unquoted variable (`password: $NATS_PASSWORD`), and
    nats-server parses that value as config: one that starts with a digit or '-' can read as
    a number, a size ("10M") or a date, and the server does not start (a manifest smoke
    run did not)."""
    while True:
        value = secrets.token_urlsafe(num_bytes)
        if value[0].isalpha():
            return value


def _secret(environ: Mapping[str, str], name: str) -> str:
    """`name` from the environment, else the contents of the file `<name>_FILE` names."""
    value = environ.get(name, "")
    path = environ.get(f"{name}_FILE", "")
    if value and path:
        raise ValueError(f"NATS credentials: set {name} or {name}_FILE, not both")
    if not path:
        return value
    try:
        return Path(path).read_text().rstrip("\r\n")
    except OSError as e:
        raise ValueError(f"NATS credentials: {name}_FILE: cannot read {path}: {e}") from None


def _config_string(value: str) -> str:
    """A double-quoted nats-server config string: quotes and backslashes escaped, every
    byte outside printable ASCII as \\xXX (the parser knows no \\u escapes)."""
    out = []
    for byte in value.encode():
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\x{byte:02x}")
    return '"' + "".join(out) + '"'


def client_tls_context(tls: BrokerTlsConfig) -> ssl.SSLContext | None:
    """The clients' TLS context (None while `tls.ca_file` is empty): the server's chain and
    name are verified against `ca_file`; `cert_file`/`key_file` add a client certificate."""
    if not tls.ca_file:
        return None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"broker.tls.ca_file: cannot load {tls.ca_file}: {e}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.cert_file:
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(
                f"broker.tls.cert_file/key_file: cannot load {tls.cert_file}, {tls.key_file}: {e}"
            ) from None
    return context


def server_tls_block(tls: BrokerTlsConfig) -> str:
    """The `tls` block of the embedded server's config ("" while it has no certificate)."""
    if not tls.server_cert_file:
        return ""
    lines = [
        f"  cert_file: {_config_string(str(Path(tls.server_cert_file).resolve()))}",
        f"  key_file: {_config_string(str(Path(tls.server_key_file).resolve()))}",
    ]
    if tls.ca_file:
        lines.append(f"  ca_file: {_config_string(str(Path(tls.ca_file).resolve()))}")
    if tls.verify_clients:
        lines.append("  verify: true")
    lines.append("  timeout: 5")
    return "tls {\n" + "\n".join(lines) + "\n}\n"

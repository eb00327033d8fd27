"""A real S3-compatible server for the tests: moto in server mode, as its own process on a
free loopback port (stopped by PID), with a fresh bucket per test.

Credentials are dummies passed the one way Tether accepts them, the environment
(`AWS_ACCESS_KEY_ID`, ...): `S3Server.env` for child processes, `monkeypatch` in-process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid

from common.procs import die_with_parent, free_port
from common.storage_config import StorageConfig

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Server:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint_url, timeout=1).close()
                return
            except OSError:  # not listening yet
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **CREDENTIALS}

    def new_bucket(self, **fields) -> StorageConfig:
        """A fresh bucket on this server, and the `[storage]` section that points at it."""
        import boto3

        bucket = f"t-{uuid.uuid4().hex[:16]}"
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        client.create_bucket(Bucket=bucket)
        return StorageConfig(bucket=bucket, endpoint_url=self.endpoint_url, **fields)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def overrides(storage: StorageConfig) -> list[str]:
    """The `storage.*=` command-line overrides of a `[storage]` section's set fields."""
    return [
        f"storage.{name}={value}"
        for name, value in storage.model_dump(exclude_unset=True, mode="json").items()
    ]

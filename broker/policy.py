"""The policy version in the NATS KV: the learner announces, everybody else follows.

nats-py's KV watchers do not survive a reconnect, so `follow()` re-creates its watcher
whenever it fails and polls the key as a fallback: a follower never misses the newest
version for longer than the poll interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from broker.codec import WireDecodeError, decode, encode
from broker.names import BusNames
from broker.retry import until_done
from broker.trajectories import CORRUPT_MESSAGES
from broker.wire import PolicyVersion

log = logging.getLogger(__name__)


class PolicyStore:
    def __init__(self, js: JetStreamContext, names: BusNames) -> None:
        self.js = js
        self.names = names
        self._kv: KeyValue | None = None
        self.num_corrupt = 0

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.js.key_value(self.names.policy_bucket)
        return self._kv

    async def publish(self, version: PolicyVersion) -> None:
        """Store `version` in the KV, waiting out a broker restart (an announcement that
        never lands would leave every actor on old weights)."""
        kv = await until_done(self._bucket, "policy bucket")
        await until_done(
            lambda: kv.put(self.names.policy_version_key, encode(version)), "policy version"
        )

    async def get(self) -> PolicyVersion | None:
        """The newest announced version, or None before the learner announced any."""
        kv = await self._bucket()
        try:
            entry = await kv.get(self.names.policy_version_key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return self._decode(entry.value)

    async def follow(self, poll_interval_s: float = 1.0) -> AsyncIterator[PolicyVersion]:
        """Yield each new policy version, forever: strictly increasing within a lineage,
        the first announcement of every new lineage (a restarted learner), even when its
        version is lower (it resumed from an older checkpoint), and the same version again
        with a newer snapshot (written for engines that missed its broadcast)."""
        newest, lineage, snapshot = -1, None, -1
        watcher = None
        while True:
            version = None
            try:
                if watcher is None:
                    kv = await self._bucket()
                    watcher = await kv.watch(self.names.policy_version_key)
                entry = await watcher.updates(timeout=poll_interval_s)
                if entry is not None and entry.value:
                    version = self._decode(entry.value)
            except TimeoutError:  # nats-py's or asyncio's: no update within the interval
                version = await self.get()  # polling fallback
            # Network boundary: the watcher died with the connection; make a new one.
            except (nats.errors.Error, OSError) as e:
                log.warning("policy watcher failed (%s); re-creating it", e)
                watcher = None
                await asyncio.sleep(poll_interval_s)
                continue
            if version is not None and (
                version.version > newest
                or version.lineage != lineage
                or (version.version == newest and version.snapshot_version > snapshot)
            ):
                newest, lineage = version.version, version.lineage
                snapshot = version.snapshot_version
                yield version

    def _decode(self, data: bytes) -> PolicyVersion | None:
        what = f"KV {self.names.policy_bucket}"
        try:
            return decode(data, PolicyVersion, what=f"({what})")
        except WireDecodeError as e:
            self.num_corrupt += 1
            CORRUPT_MESSAGES.labels(what).inc()
            log.error("ignoring undecodable policy version: %s", e)
            return None

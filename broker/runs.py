"""Runs that share one server: which run holds a namespace, and reclaiming the namespaces
of runs that are done.

A namespace's trajectory stream reserves its `max_bytes` (`broker.max_trajectory_bytes`)
of the server's file store (`max_file_store`) for as long as the stream exists, used or not;
nats-server refuses a stream whose reservation would pass the store (`insufficient storage
resources available`, err_code 10047). Runs in new namespaces one after another would fill
any server, so the learner marks its namespace (key `run` of the policy bucket: run id and
state) when it starts and when it is done. A done run has acked everything it took and
will release nothing more: its namespace holds nothing of value and may be deleted

- when space is needed: `ensure_streams` that meets a full store deletes the namespaces of
  done runs that no actor pulls from any more, and tries again (broker/streams.py);
- by hand: `python -m broker gc` lists every namespace and deletes the done ones, or those
  named (broker/gc.py).

A fresh learner (a new run id) purges its own namespace's queues (`purge_queues`): what an
earlier run left there, prompts never taken and trajectories never acked, is not its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext

from broker.names import BusNames

log = logging.getLogger(__name__)

RUN_KEY = "run"
"""The policy bucket's key that names the namespace's run: {"run_id", "state", "at"}."""
RUNNING, DONE = "running", "done"
STORE_FULL = 10047
"""JetStream's err_code when a stream's reservation would pass the server's store."""
_TRAJECTORIES_SUFFIX = "_TRAJECTORIES"


class StoreFull(RuntimeError):
    """The server's file store is fully reserved by namespaces that cannot be reclaimed."""


@dataclass(frozen=True)
class Namespace:
    """One namespace on the server, as `python -m broker gc` lists it."""

    names: BusNames
    run_id: str | None
    state: str | None
    """`running`, `done`, or None when no learner marked it (an older learner, a test)."""
    stored_bytes: int
    reserved_bytes: int
    """Bytes of the server's file store its streams reserve (their max_bytes x replicas)."""
    num_waiting_pulls: int
    """Pull requests waiting on its prompt queue: actors still attached."""

    @property
    def reclaimable(self) -> bool:
        return self.state == DONE and self.num_waiting_pulls == 0

    def describe(self) -> str:
        state = self.state or "unmarked"
        if self.state == DONE and self.num_waiting_pulls:
            state += f", {self.num_waiting_pulls} actor pull(s) waiting"
        run = f"run {self.run_id}" if self.run_id else "no run"
        return f"{self.names.namespace} ({run}, {state}, {size_text(self.reserved_bytes)} reserved)"


async def mark_run(js: JetStreamContext, names: BusNames, run_id: str, state: str) -> None:
    """Record which run holds `names` and whether it is done (in the policy bucket)."""
    kv = await js.key_value(names.policy_bucket)
    record = {"run_id": run_id, "state": state, "at": time.time()}
    await kv.put(RUN_KEY, json.dumps(record).encode())


async def begin_run(js: JetStreamContext, names: BusNames, run_id: str, *, fresh: bool) -> None:
    """Mark `names` as held by `run_id`, running; a `fresh` run first empties its queues."""
    if fresh:
        await purge_queues(js, names)
    await mark_run(js, names, run_id, RUNNING)


async def read_run(js: JetStreamContext, names: BusNames) -> dict | None:
    """The namespace's run record, None when it has none (or no policy bucket)."""
    try:
        kv = await js.key_value(names.policy_bucket)
        entry = await kv.get(RUN_KEY)
    except nats.js.errors.NotFoundError:  # no bucket, or no such key
        return None
    try:
        record = json.loads(entry.value or b"")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


async def purge_queues(js: JetStreamContext, names: BusNames) -> None:
    """Empty the namespace's work queues, episode checkpoints and spill bucket (a fresh
    run's start)."""
    queues = (names.prompts.stream, names.trajectories.stream, names.episodes_stream)
    for stream in (*queues, _spill_stream(names)):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.purge_stream(stream)


async def list_namespaces(js: JetStreamContext) -> list[Namespace]:
    """Every namespace with a trajectory stream on the server, by name."""
    streams = {info.config.name: info for info in await _all_streams(js)}
    found = []
    for name in sorted(streams):
        if not name.endswith(_TRAJECTORIES_SUFFIX):
            continue
        try:
            names = BusNames(name.removesuffix(_TRAJECTORIES_SUFFIX))
        except ValueError:
            continue  # not a namespace's stream
        if streams[name].config.subjects != [names.trajectories.subject]:
            continue
        own = [streams[s] for s in _stream_names(names) if s in streams]
        run = await read_run(js, names) or {}
        found.append(
            Namespace(
                names=names,
                run_id=run.get("run_id"),
                state=run.get("state"),
                stored_bytes=sum(s.state.bytes for s in own),
                reserved_bytes=sum(_reserved(s.config) for s in own),
                num_waiting_pulls=await _waiting_pulls(js, names),
            )
        )
    return found


async def delete_namespace(js: JetStreamContext, names: BusNames) -> None:
    """Delete every stream and bucket of the namespace (idempotent)."""
    for stream in _stream_names(names):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)


async def reclaim_done(js: JetStreamContext, *, keep: str | None = None) -> list[Namespace]:
    """Delete the namespaces of done runs that no actor pulls from (never `keep`)."""
    reclaimed = []
    for namespace in await list_namespaces(js):
        if namespace.reclaimable and namespace.names.namespace != keep:
            await delete_namespace(js, namespace.names)
            log.warning("deleted namespace %s to free the server's store", namespace.describe())
            reclaimed.append(namespace)
    return reclaimed


async def store_full_error(js: JetStreamContext, names: BusNames, needed: int) -> StoreFull:
    """The error that says who holds the store and what to do."""
    held = [n.describe() for n in await list_namespaces(js) if n.reserved_bytes]
    return StoreFull(
        f"nats-server's file store is fully reserved: namespace {names.namespace} cannot "
        f"create its streams (its trajectory stream reserves {size_text(needed)}). Reserved now: "
        f"{'; '.join(held) or 'nothing of Tether'}. Stop the actors of done runs, delete "
        "namespaces with `python -m broker gc --namespace NS`, start the server with a "
        "larger `--max-file-store`, or lower broker.max_trajectory_bytes (docs/broker.md)."
    )


def is_store_full(error: Exception) -> bool:
    return isinstance(error, nats.js.errors.APIError) and error.err_code == STORE_FULL


def _stream_names(names: BusNames) -> list[str]:
    return [
        names.prompts.stream,
        names.trajectories.stream,
        f"KV_{names.policy_bucket}",
        names.episodes_stream,
        _spill_stream(names),
    ]


def _spill_stream(names: BusNames) -> str:
    return f"OBJ_{names.spill_bucket}"


def _reserved(config) -> int:
    return max(config.max_bytes or 0, 0) * (config.num_replicas or 1)


async def _all_streams(js: JetStreamContext) -> list:
    """Every stream's info (the server answers 256 per page)."""
    infos: list = []
    while page := await js.streams_info(offset=len(infos)):
        infos.extend(page)
    return infos


async def _waiting_pulls(js: JetStreamContext, names: BusNames) -> int:
    try:
        info = await js.consumer_info(names.prompts.stream, names.prompts.consumer)
    except nats.js.errors.NotFoundError:
        return 0
    return info.num_waiting or 0


def size_text(num_bytes: int) -> str:
    """Bytes for people: GiB from 1 GiB up, MiB below."""
    if num_bytes >= 1024**3:
        return f"{num_bytes / 1024**3:.1f} GiB"
    return f"{num_bytes / 1024**2:.1f} MiB"

"""`python -m broker gc [--config C] [--url URL] [--namespace NS ...] [--dry-run]`: list the
namespaces on a server and delete those of runs that are done (broker/runs.py).

    namespace       run                 state     stored    reserved  actors
    tether          tether-3f9a01c2     done      0.1 MiB   4.0 GiB   0      deleted
    exp-7           exp-7-0b77d1e4      running   12.0 MiB  4.0 GiB   2

A done namespace that an actor still pulls from is kept (stop its actors first);
`--namespace NS` deletes NS whatever its state (a namespace no learner marked: an older
release, a run that died and will not be resumed).
"""

from __future__ import annotations

import asyncio

from broker import runs
from broker.config import BrokerConfig
from broker.connection import connect
from broker.names import BusNames

_ROW = "{:<24} {:<28} {:<9} {:>10} {:>10} {:>6}  {}"


async def collect(
    broker: BrokerConfig, *, namespaces: list[str], dry_run: bool
) -> list[tuple[runs.Namespace, bool]]:
    """Every namespace and whether it was (with `dry_run`: would be) deleted."""
    nc = await connect(broker.url, name="broker-gc", tls=broker.tls)
    try:
        js = nc.jetstream()
        named = set(namespaces)
        found = await runs.list_namespaces(js)
        rows = []
        for namespace in found:
            delete = namespace.reclaimable or namespace.names.namespace in named
            if delete and not dry_run:
                await runs.delete_namespace(js, namespace.names)
            rows.append((namespace, delete))
        for missing in named - {n.names.namespace for n in found}:
            if not dry_run:  # what is left of one (a bucket without streams)
                await runs.delete_namespace(js, BusNames(missing))
        return rows
    finally:
        await nc.close()


def gc(broker: BrokerConfig, *, namespaces: list[str], dry_run: bool) -> int:
    rows = asyncio.run(collect(broker, namespaces=namespaces, dry_run=dry_run))
    verb = "would delete" if dry_run else "deleted"
    print(_ROW.format("namespace", "run", "state", "stored", "reserved", "actors", ""))
    for n, deleted in rows:
        cells = (n.names.namespace, n.run_id or "-", n.state or "unmarked")
        sizes = (runs.size_text(n.stored_bytes), runs.size_text(n.reserved_bytes))
        print(_ROW.format(*cells, *sizes, n.num_waiting_pulls, verb if deleted else ""))
    freed = sum(n.reserved_bytes for n, deleted in rows if deleted)
    kept = sum(n.reserved_bytes for n, deleted in rows if not deleted)
    print(f"{verb} {sum(d for _, d in rows)} namespace(s), {runs.size_text(freed)} of "
          f"reservations; {runs.size_text(kept)} still reserved")  # fmt: skip
    return 0

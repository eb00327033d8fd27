"""What every supervisor writes when a process of a role is killed and restarted
(common/supervision.py's event format): the local launcher's roles, the actor's replicas
and a run's roles on Ray are all checked with this one reading."""

from __future__ import annotations


def killed_and_restarted(events: list[dict], role: str) -> tuple[int, int | None]:
    """(pid, exit code) of the role's first process, after checking that it started,
    exited with a restart decided, and started again as a new process (restart 1)."""
    mine = [e for e in events if e["role"] == role]
    kinds = [(e["event"], e.get("restart")) for e in mine[:3]]
    assert kinds == [("started", 0), ("exited", None), ("started", 1)], mine
    first, exited, again = mine[:3]
    assert exited["pid"] == first["pid"] != again["pid"], mine
    assert exited["restart_in_s"] >= 0 and again["time"] >= exited["time"], mine
    return exited["pid"], exited["code"]

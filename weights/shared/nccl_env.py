"""NCCL's process-level watchdogs, kept off the weight broadcast: a round we already gave up
must never take down the learner or a healthy engine minutes later.

What torch 2.13's ProcessGroupNCCL does (read from its source; docs/gpu.md, "First contact"):
a collective that errors or times out on any group makes that group's watchdog raise a
process-wide dump flag, whatever the group's error-handling mode. The heartbeat monitor of
the process's first NCCL group (the learner's FSDP group; vLLM's own world group in each
engine worker) then dumps, sleeps `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC` (480 s) and aborts the
process. Our rounds fail by design (a peer died, a deadline passed) and are handled by our
own bounded waits (weights/shared/communicator.py), so:

- Each weight group is built with `TORCH_NCCL_BLOCKING_WAIT=1` (read per group, in its
  constructor): such a group has no watchdog thread and queues no work for one, so it can
  never raise the flag; errors still surface in `work.is_completed()` / `work.wait()` in
  the thread that polls them. `TORCH_NCCL_ASYNC_ERROR_HANDLING=2` (clean up the
  communicator, never the process) stays as a second guard.
- The communicator is still created non-blocking (`config.blocking = 0`): a blocking
  `ncclCommInitRank` runs before torch registers the communicator, so neither a deadline
  of ours nor `abort()` could end an init stuck on a dead peer. The automatic non-blocking
  mode torch turned off (pytorch #154055, hangs from an unlocked `ncclCommGetAsyncError`,
  fixed by a locked wrapper since) is not what we use: we set it explicitly per group.
  Its bound, `TORCH_NCCL_NONBLOCKING_TIMEOUT`, is read once per process at its first NCCL
  collective (in the learner: FSDP's, long before any weight round), so each role sets it
  at start (`role_environ`), not the weight group.
- The default group keeps torch's defaults: a real FSDP hang still takes the rank down
  (torchrun restarts it), with its flight-recorder dump.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)

WEIGHT_GROUP_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
"""Set around the construction of each weight group's ProcessGroupNCCL (read per group)."""

UNSAFE = {
    "TORCH_NCCL_EXTRA_DUMP_ON_EXEC": ("1", "abort() of a failed round itself raises the dump flag"),
    "TORCH_NCCL_RETHROW_CUDA_ERRORS": ("0", "the default group's timeouts would be swallowed"),
    "TORCH_NCCL_ENABLE_MONITORING": ("0", "a hung watchdog would hang the process for ever"),
}
"""Process-wide settings that would undo the above: (the value, why)."""


def role_environ(init_timeout_s: float) -> dict[str, str]:
    """What a process that will own a weight group sets before its first NCCL collective:
    the bound on forming a non-blocking communicator (the round's transfer timeout)."""
    return {"TORCH_NCCL_NONBLOCKING_TIMEOUT": str(max(1, int(init_timeout_s)))}


def unsafe_settings(environ: Mapping[str, str]) -> list[str]:
    """The settings in `environ` that would let NCCL act against us, one line each."""
    return [
        f"{key}={value}: {why}" for key, (value, why) in UNSAFE.items() if environ.get(key) == value
    ]


def prepare_role(init_timeout_s: float) -> None:
    """At the start of a learner rank or an engine (its workers inherit the environment):
    `role_environ` unless the user set it, and a warning for each unsafe setting."""
    for key, value in role_environ(init_timeout_s).items():
        os.environ.setdefault(key, value)
    for line in unsafe_settings(os.environ):
        log.warning("NCCL setting against the weight broadcast's failure handling: %s", line)

"""Where the learner's metric records go: `<run_dir>/metrics.jsonl`, and W&B when available.

`MetricsSink.log(record)` appends the record as one JSON line and flushes it (the launcher
tails the file), then logs its numbers to W&B:

- `WANDB_API_KEY` set: online. Otherwise offline (`mode="offline"`), the run's files under
  `<run_dir>/wandb`, to `wandb sync` later. An explicit `WANDB_MODE` (e.g. `disabled`) wins.
- `wandb` not installed (it is an optional extra): the JSONL file alone, with a one-line
  notice in the log.
- W&B failing (no network, a bad key, a full disk) never stops training: the error is
  logged once and W&B is switched off for the rest of the run; metrics.jsonl goes on.

To W&B go the record's numbers (bools as 0/1; nested dicts flattened with `/`; strings and
lists skipped), plotted against `version` (`define_metric`), so an eval record of version v
that arrives after later training steps lands at v. A record of `kind` "done" goes to the
run summary instead. Non-finite floats are written to metrics.jsonl as `NaN`/`Infinity`,
which Python's json reads back.

Prometheus is separate (`learner/metrics.py`, `record_step`); the caller feeds both.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
DONE_FILE = "learner_done.json"
"""The learner's final (`done`) record, also the last line of metrics.jsonl: the run finished."""
WANDB_ID_FILE = "wandb_run_id"
"""The run directory's W&B run id: every learner process of the run (a restart, a resumed
run) logs to the same W&B run rather than starting a new one."""


def wandb_mode(environ: Mapping[str, str]) -> str:
    """`WANDB_MODE` if set, else "online" with an API key and "offline" without one."""
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if environ.get("WANDB_API_KEY") else "offline"


def wandb_payload(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of `record`, flat: nested dicts joined with `/`, bools as 0/1."""
    payload: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            payload.update(wandb_payload(value, prefix=f"{name}/"))
        elif isinstance(value, bool):
            payload[name] = int(value)
        elif isinstance(value, int | float):
            payload[name] = value
        elif hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalar
            payload[name] = value.item()
    return payload


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id of `run_dir`, made (and kept in it) by the run's first learner."""
    path = run_dir / WANDB_ID_FILE
    if not path.is_file():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(uuid.uuid4().hex[:16])
        os.replace(tmp, path)  # two learners racing agree on whichever landed
    return path.read_text().strip()


class MetricsSink:
    """metrics.jsonl, plus W&B when `use_wandb` and the package is installed."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        use_wandb: bool = True,
        project: str = "tether",
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._file = open(self.path, "a", encoding="utf-8")  # closed in close()
        self._wandb_run = None
        if use_wandb:
            self._wandb_run = self._start_wandb(project, run_name, dict(config or {}))

    @property
    def wandb_run(self):
        """The live W&B run, or None (not installed, disabled, or failed)."""
        return self._wandb_run

    def log(self, record: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(dict(record), default=_json_default) + "\n")
        self._file.flush()
        if self._wandb_run is None:
            return
        payload = wandb_payload(record)
        # W&B talks to its service process and the network: a failure there must not stop
        # training, so it is logged once and W&B is dropped for the rest of the run.
        try:
            if record.get("kind") == "done":
                self._wandb_run.summary.update(payload)
            else:
                self._wandb_run.log(payload)
        except Exception as e:  # boundary: W&B, see above
            log.warning("W&B logging failed, continuing without W&B: %r", e)
            self._stop_wandb()

    def close(self) -> None:
        self._stop_wandb()
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start_wandb(self, project: str, run_name: str | None, config: dict):
        try:
            import wandb
        except ImportError:
            log.warning("wandb is not installed: metrics go to %s only", self.path)
            return None
        mode = wandb_mode(os.environ)
        if mode == "disabled":
            return None
        # Starting W&B spawns its service and, online, logs in over the network: if that
        # fails the run trains anyway, with metrics.jsonl only.
        try:
            run = wandb.init(
                project=project,
                name=run_name,
                config=config,
                dir=str(self.run_dir),
                mode=mode,
                id=wandb_run_id(self.run_dir),
                resume="allow",  # the run's earlier processes' W&B run, if there is one
                settings=wandb.Settings(console="off"),
            )
            run.define_metric("version")
            run.define_metric("*", step_metric="version")
        except Exception as e:  # boundary: W&B, see above
            log.warning(
                "W&B did not start (mode %s), metrics go to %s only: %r", mode, self.path, e
            )
            return None
        log.info("W&B run %s (%s) in %s", run.id, mode, run.dir)
        return run

    def _stop_wandb(self) -> None:
        run, self._wandb_run = self._wandb_run, None
        if run is None:
            return
        try:
            run.finish()
            # finish() can return before W&B's service has written the run's files;
            # teardown waits for that (and for the upload, online).
            import wandb

            wandb.teardown()
        except Exception as e:  # boundary: W&B, see above
            log.warning("W&B run did not finish cleanly: %r", e)


def _json_default(value: Any) -> Any:
    """numpy / torch scalars become plain numbers; anything else its string."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    return str(value)

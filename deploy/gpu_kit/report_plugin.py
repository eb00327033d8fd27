"""A pytest plugin for the GPU kit's run (`-p deploy.gpu_kit.report_plugin`): each failure's
reason is printed, and appended to $OUT/failures.txt, the moment the test ends, with the
tail of what it wrote to stderr and the log. pytest keeps them for its summary at the end of
the session, which a device call cut short by its time limit never reaches: on 2026-11-26 a
run came back with six FAILED verdicts and no reason; in the next, vLLM's "engine core
initialization failed. See root cause above" pointed at captured stderr nobody printed."""

from __future__ import annotations

import os
from pathlib import Path

CAPTURED_TAIL = 6000


def pytest_runtest_logreport(report) -> None:
    if not report.failed:
        return
    text = f"\n---- {report.nodeid} ({report.when}) FAILED ----\n{report.longreprtext}\n"
    for section, content in report.sections:
        if "stderr" in section or "log" in section:
            text += (
                f"-- {section}, last {CAPTURED_TAIL} characters --\n{content[-CAPTURED_TAIL:]}\n"
            )
    print(text, flush=True)
    if out := os.environ.get("OUT"):
        with (Path(out) / "failures.txt").open("a") as failures:
            failures.write(text)

"""deploy/supervisor.py on real child processes (small Python scripts): restarts with
backoff and a budget, leftovers of a dead child cleared, liveness, a clean stop."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from common.metrics import serve_metrics
from common.supervision import RestartPolicy, event_line, read_events
from deploy import proctree
from deploy.supervisor import Service, Supervisor, http_probe

FAST = RestartPolicy(initial_backoff_s=0.1, max_backoff_s=0.2, budget=2, window_s=60)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _supervisor(tmp_path: Path, **fields) -> Supervisor:
    return Supervisor(tmp_path, policy=FAST, **fields)


def _poll_until(supervisor: Supervisor, predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        supervisor.poll()
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    info = proctree.read_proc(pid)
    return info is not None and info.command != ""  # a zombie has no command line


def test_a_crashing_service_is_restarted_until_its_budget_is_spent(tmp_path):
    supervisor = _supervisor(tmp_path)
    supervisor.start(Service("crasher", _python("import sys; sys.exit(5)")))
    try:
        _poll_until(supervisor, lambda: supervisor.given_up() is not None)
    finally:
        supervisor.stop_all(grace_s=1)
    events = [(e["event"], e.get("code")) for e in read_events(tmp_path)]
    assert events == [
        ("started", None),
        ("exited", 5),
        ("started", None),
        ("exited", 5),
        ("started", None),
        ("gave_up", 5),
    ]
    exits = [e for e in read_events(tmp_path) if e["event"] == "exited"]
    assert [e["restart_in_s"] for e in exits] == [0.1, 0.2]  # doubling backoff
    assert [e["restart"] for e in read_events(tmp_path) if e["event"] == "started"] == [0, 1, 2]
    assert supervisor.num_restarts() == {"crasher": 2}
    assert event_line(read_events(tmp_path)[-1]) == (
        "supervisor: crasher exited with code 5: restart budget spent (2 in 60s, "
        "restarts.budget); giving up"
    )
    assert (tmp_path / "logs" / "crasher.log").exists()


def test_a_service_that_cannot_start_as_configured_is_not_restarted(tmp_path):
    """Exit 2 (a bad config, model path, dataset) or 69 (gave up on the broker): restarting
    would fail the same way, so the run ends at once with the reason."""
    supervisor = _supervisor(tmp_path)
    supervisor.start(Service("learner", _python("import sys; sys.exit(2)"), finishes=True))
    try:
        _poll_until(supervisor, lambda: supervisor.given_up() is not None)
    finally:
        supervisor.stop_all(grace_s=1)
    events = [(e["event"], e.get("code")) for e in read_events(tmp_path)]
    assert events == [("started", None), ("gave_up", 2)]
    assert read_events(tmp_path)[-1]["reason"] == "cannot start as configured"
    assert supervisor.num_restarts() == {"learner": 0}


def test_a_dead_childs_leftovers_are_killed_before_it_restarts(tmp_path):
    # The child starts a grandchild in its session (as an actor starts vLLM engines) and
    # dies; the grandchild must not outlive it.
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen(['sleep', '300'])\n"
        f"open({str(pid_file)!r}, 'a').write(str(p.pid) + ' ')\n"  # a restart adds its own
        "time.sleep(0.3)\n"
        "sys.exit(1)\n"
    )
    supervisor = _supervisor(tmp_path)
    supervisor.start(Service("parent", _python(code)))
    try:
        _poll_until(supervisor, lambda: supervisor.num_restarts()["parent"] == 1)
        grandchild = int(pid_file.read_text().split()[0])  # the first run's
        deadline = time.monotonic() + 5
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild)
        exited = next(e for e in read_events(tmp_path) if e["event"] == "exited")
        assert exited["killed_leftovers"] >= 1
    finally:
        supervisor.stop_all(grace_s=1)


def test_a_finishing_service_that_exits_zero_is_done_not_restarted(tmp_path):
    supervisor = _supervisor(tmp_path)
    supervisor.start(Service("learner", _python("pass"), finishes=True))
    try:
        _poll_until(supervisor, lambda: supervisor.finished("learner"))
        supervisor.poll()
        assert supervisor.num_restarts() == {"learner": 0}
        assert supervisor.pid("learner") is None
    finally:
        supervisor.stop_all(grace_s=1)


def test_a_hung_service_is_killed_after_missed_probes_and_restarted(tmp_path):
    answers = iter([True, False, False, False])  # up, then hung
    supervisor = _supervisor(
        tmp_path, probe=lambda url, timeout_s: next(answers, True), probe_period_s=0.0
    )
    supervisor.start(
        Service("envserver", _python("import time; time.sleep(300)"), liveness_url="http://x")
    )
    first = supervisor.pid("envserver")
    try:
        _poll_until(supervisor, lambda: supervisor.num_restarts()["envserver"] == 1)
        assert supervisor.pid("envserver") not in (None, first)
        events = [e["event"] for e in read_events(tmp_path)]
        assert events == ["started", "unresponsive", "exited", "started"]
        pids = json.loads((tmp_path / "processes.json").read_text())
        assert pids == {"envserver": supervisor.pid("envserver")}
    finally:
        supervisor.stop_all(grace_s=1)


def test_probes_before_the_first_answer_are_start_up_not_failures(tmp_path):
    supervisor = _supervisor(tmp_path, probe=lambda url, timeout_s: False, probe_period_s=0.0)
    supervisor.start(Service("slow", _python("import time; time.sleep(300)"), liveness_url="x"))
    try:
        for _ in range(10):
            supervisor.poll()
        assert supervisor.num_restarts() == {"slow": 0}
        assert supervisor.pid("slow") is not None
    finally:
        supervisor.stop_all(grace_s=1)


def test_a_service_hung_in_its_start_up_is_killed_once_the_start_up_time_is_up(tmp_path):
    # Stopped (or deadlocked) before its probe ever answered: the missed probes count only
    # after `startup_timeout_s`, then it is killed and restarted as any hung process.
    policy = FAST.model_copy(update={"startup_timeout_s": 0.5})
    supervisor = Supervisor(tmp_path, policy=policy, probe=lambda url, timeout_s: False,
                            probe_period_s=0.0)  # fmt: skip
    supervisor.start(Service("stuck", _python("import time; time.sleep(300)"), liveness_url="x"))
    first = supervisor.pid("stuck")
    try:
        for _ in range(5):
            supervisor.poll()
        assert supervisor.num_restarts() == {"stuck": 0}  # within its start-up time
        _poll_until(supervisor, lambda: supervisor.num_restarts()["stuck"] == 1)
        assert supervisor.pid("stuck") not in (None, first)
        events = [e["event"] for e in read_events(tmp_path)]
        assert events[:4] == ["started", "unresponsive", "exited", "started"]
    finally:
        supervisor.stop_all(grace_s=1)


def test_http_probe_against_a_real_health_endpoint():
    port = serve_metrics(0)
    assert http_probe(f"http://127.0.0.1:{port}/healthz", 2.0)
    assert not http_probe("http://127.0.0.1:9/healthz", 0.5)  # nobody listens on port 9


def test_stop_all_kills_processes_that_left_the_childs_process_group(tmp_path):
    # An actor replica moves to a process group of its own (so its engine can be killed
    # with it); stopping the run must still reach it through the session.
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import os, subprocess, time\n"
        "p = subprocess.Popen(['sleep', '300'], process_group=0)\n"
        f"open({str(pid_file)!r}, 'a').write(str(p.pid) + ' ')\n"  # a restart adds its own
        "time.sleep(300)\n"
    )
    supervisor = _supervisor(tmp_path)
    supervisor.start(Service("actor", _python(code)))
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    assert os.getpgid(grandchild) == grandchild
    supervisor.stop_all(grace_s=0.5)
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_proctree_parses_stat_with_a_command_holding_parentheses():
    text = "123 (a (b) c) S 1 123 123 0 -1 4194560 " + " ".join(["0"] * 14) + " 77 rest"
    ppid, pgid, sid, rss = proctree.parse_stat(text)
    assert (ppid, pgid, sid, rss) == (1, 123, 123, 77)
    own = proctree.read_proc(os.getpid())
    assert own is not None and own.pid == os.getpid() and own.rss_bytes > 0

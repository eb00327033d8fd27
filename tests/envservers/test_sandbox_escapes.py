"""More ways out of the `python` sandbox, each tried through a real server (namespaces
mode, as root): the host's own listening port, the server's environment and process, other
sessions' files, symlinks planted for the server to follow, and CPU and memory hogs spread
over many processes. Every one is refused or killed, and the server keeps serving. The weak
`rlimits` mode (no root) is checked for the honest mistakes its audit hook catches."""

import os
import time
from pathlib import Path

import pytest

from tests.envservers.conftest import calculator_task, sandbox_uids
from tests.envservers.test_python_sandbox import _output

NEEDS_ROOT = pytest.mark.skipif(os.getuid() != 0, reason="namespaces sandbox needs root")

SECRET = "sandbox-must-never-see-this-7c1e"
SANDBOX_UIDS = sandbox_uids()  # this worker's env servers' (tests/envservers/conftest.py)


async def _open(client):
    task = calculator_task(truth="1")
    task["env_class"] = "python"
    return await client.open("python", task)


@pytest.fixture
async def session(client):
    opened = await _open(client)
    yield opened
    await opened.close()


@NEEDS_ROOT
async def test_the_servers_own_port_is_unreachable(env_server, session):
    code = (
        "import socket\n"
        f"try: socket.create_connection(('127.0.0.1', {env_server.port}), timeout=2)\n"
        "except OSError as e: print(type(e).__name__, e)\n"
        "else: print('CONNECTED')\n"
        "print(socket.if_nameindex())"
    )
    out = await _output(session, code)
    assert "Network is unreachable" in out and "CONNECTED" not in out
    assert out.strip().endswith("[(1, 'lo')]")  # only a loopback, and it is down


@NEEDS_ROOT
async def test_the_servers_environment_and_process_are_out_of_reach(session, monkeypatch):
    monkeypatch.setenv("NATS_PASSWORD", SECRET)  # as a server with bus credentials has
    out = await _output(session, "import os; print(sorted(os.environ))")
    assert SECRET not in out and "NATS_PASSWORD" not in out
    assert eval(out) == ["HOME", "LANG", "PATH", "TMPDIR"]
    for path in (f"/proc/{os.getpid()}/environ", "/proc/self/environ", "/proc/1/cmdline"):
        assert "No such file or directory" in await _output(session, f"open({path!r}).read()")
    out = await _output(session, f"import os; os.kill({os.getpid()}, 9)")
    assert "ProcessLookupError" in out  # the server's pid does not exist in there
    out = await _output(session, "import os; os.kill(-1, 9); print('survived')")
    assert "killed" in out or "exit code" in out  # it killed only its own pid namespace


@NEEDS_ROOT
async def test_another_sessions_files_are_out_of_reach(client, env_server, session):
    other = await _open(client)
    await _output(other, f"open('notes.txt', 'w').write({SECRET!r})")
    sandbox = next(
        s.env.sandbox for s in env_server.service.sessions.values() if s.id == other.session_id
    )
    for path in (sandbox.scratch / "notes.txt", sandbox.dir):
        out = await _output(session, f"print(open({str(path)!r}).read())")
        assert SECRET not in out and "No such file or directory" in out
    await other.close()


@NEEDS_ROOT
async def test_a_planted_symlink_is_never_followed_by_the_server(client, env_server, tmp_path):
    # The program replaces main.py (which the server rewrites, as root, before every run)
    # with a symlink to a host file. The next run must not write through it.
    victim = tmp_path / "host-file"
    victim.write_text("untouched")
    session = await _open(client)
    await _output(
        session, f"import os; os.remove('main.py'); os.symlink({str(victim)!r}, 'main.py')"
    )
    out = await _output(session, "print('next run')")
    assert victim.read_text() == "untouched"  # not overwritten by the server, as root
    assert out == "next run\n"
    await session.close()
    assert victim.read_text() == "untouched"  # closing (rmtree) does not follow it either


@NEEDS_ROOT
async def test_cpu_hogs_in_many_processes_are_killed_on_time(session):
    code = (
        "import os, threading\n"
        "for _ in range(8):\n"
        "    if os.fork() == 0:\n"
        "        for _ in range(4):\n"
        "            threading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()\n"
        "        while True: pass\n"
        "while True: pass"
    )
    start = time.monotonic()
    out = await _output(session, code)
    assert time.monotonic() - start < 30  # timeout_s 3 in the test config: a bound, not a speed
    assert out.startswith("error: killed") or "exit code" in out
    assert not _sandbox_processes()  # the step returns once nothing of the run is left


@NEEDS_ROOT
async def test_memory_limits_hold_in_every_process_of_a_run(session):
    code = (
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try: bytearray(2 * 1024**3)\n"
        "    except MemoryError: os._exit(3)\n"
        "    os._exit(0)\n"
        "print('child exit', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))"
    )
    assert await _output(session, code) == "child exit 3\n"  # RLIMIT_AS holds in children


def _sandbox_processes() -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid_line = next(
                    line
                    for line in (entry / "status").read_text().splitlines()
                    if line.startswith("Uid:")
                )
            except (OSError, StopIteration):
                continue
            if int(uid_line.split()[1]) in SANDBOX_UIDS:
                found.append(entry.name)
    return found


@pytest.mark.parametrize(
    ("code", "refusal"),
    [
        ("import socket; socket.socket()", "socket.__new__ is not allowed"),
        ("import os; os.fork()", "os.fork is not allowed"),
        ("import subprocess; subprocess.run(['ls'])", "subprocess.Popen is not allowed"),
        ("open('/etc/hostname').read()", "/etc/hostname is outside the scratch dir"),
        ("open('../escape', 'w')", "is outside the scratch dir"),
    ],
)
async def test_the_weak_rlimits_mode_refuses_honest_mistakes(tmp_path, code, refusal):
    # rlimits mode (machines without root) is a seat belt, not a wall (docs/security.md):
    # its audit hook stops these, not a determined attacker.
    from envservers.config import SandboxConfig
    from envservers.sandbox import Sandbox

    sandbox = Sandbox(SandboxConfig(isolation="rlimits", timeout_s=10, scratch_root=str(tmp_path)))
    try:
        result = await sandbox.run(code)
    finally:
        await sandbox.close()
    assert result.exit_code == 1 and refusal in result.output

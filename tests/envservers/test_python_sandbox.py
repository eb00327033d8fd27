"""The `python` environment through a real server: model code runs, and every escape we
know to try — network, host files, writes outside the scratch dir, fork bombs, memory hogs,
infinite loops, sleeping forever, floods of output — is refused or killed while the server
keeps serving."""

import json
import os
import time

import pytest

from tests.envservers.conftest import calculator_task, sandbox_uids

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="namespaces sandbox needs root")


def _run(code: str) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": "run_python", "arguments": {"code": code}})
        + ("</tool_call>")
    )


@pytest.fixture
async def python_session(client):
    task = calculator_task(truth="120")
    task["env_class"] = "python"
    session = await client.open("python", task)
    yield session
    await session.close()


async def _output(session, code: str) -> str:
    result = await session.step(_run(code))
    assert not result.done
    [message] = result.observations
    assert message["role"] == "tool"
    return message["content"]


async def test_runs_code_keeps_files_and_scores_the_answer(python_session):
    assert await _output(python_session, "import math; print(math.factorial(5))") == "120\n"
    assert await _output(python_session, "open('f.txt', 'w').write('kept')") == ""
    assert await _output(python_session, "print(open('f.txt').read())") == "kept\n"
    assert python_session.observation.tools[0]["function"]["name"] == "run_python"
    result = await python_session.step("<answer>120</answer>")
    assert (result.reward, result.done) == (1.0, True)


async def test_exception_in_model_code_is_an_error_observation(python_session):
    out = await _output(python_session, "raise ValueError('bad model')")
    assert out.startswith("error: exit code 1") and "ValueError: bad model" in out


@pytest.mark.parametrize(
    "code, expected",
    [
        (
            "import socket; socket.create_connection(('127.0.0.1', 1), timeout=1)",
            "Network is unreachable",
        ),
        (
            "import socket; s = socket.socket(); s.bind(('0.0.0.0', 8080)); s.listen();"
            "socket.create_connection(('127.0.0.1', 8080), timeout=1); print('reached')",
            "Network is unreachable",
        ),
        (
            "import urllib.request; urllib.request.urlopen('http://127.0.0.1:1', timeout=1)",
            "error: exit code 1",
        ),
        ("print(open('/etc/passwd').read())", "No such file or directory: '/etc/passwd'"),
        ("open('/usr/evil', 'w')", "Read-only file system"),
        ("open('/evil', 'w')", "Read-only file system"),
        ("open('../escape', 'w')", "Read-only file system"),
        ("import os; os.setuid(0)", "Operation not permitted"),
    ],
)
async def test_network_and_host_files_are_refused(python_session, code, expected):
    assert expected in await _output(python_session, code)


async def test_the_sandbox_root_holds_only_the_interpreter_and_scratch(python_session):
    out = await _output(python_session, "import os; print(sorted(os.listdir('/')))")
    visible = set(eval(out))
    assert visible <= {
        "usr",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "bin",
        "sbin",
        "dev",
        "scratch",
        *os.path.realpath(__import__("sys").base_prefix).split("/"),
    }
    assert not visible & {"etc", "work", "proc", "home", "tmp", "var"}


async def test_fork_bomb_is_contained(python_session):
    code = (
        "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            import time; time.sleep(60)\n        n += 1\n"
        "except OSError as e:\n    print('stopped after', n, type(e).__name__)"
    )
    out = await _output(python_session, code)
    assert "stopped after" in out and "BlockingIOError" in out
    assert int(out.split()[2]) < 20  # RLIMIT_NPROC = 16 processes for the run's uid
    # the run's children died with its pid namespace
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) in sandbox_uids()]


def _uid_of(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("Uid:")).split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return -1


async def test_memory_hog_file_hog_and_output_flood(python_session):
    assert "MemoryError" in await _output(python_session, "x = bytearray(2 * 1024**3)")
    out = await _output(python_session, "open('big', 'wb').write(b'x' * 64 * 1024**2)")
    assert "File too large" in out
    out = await _output(python_session, "while True: print('y' * 1000)")
    assert out.startswith("error: killed: output limit")
    assert out.endswith("[... output cut at 16384 bytes: the program was killed for writing more]")


async def test_infinite_loop_and_sleep_are_killed_on_time(client, python_session):
    for code in ("while True: pass", "import time; time.sleep(1000)"):
        start = time.monotonic()
        out = await _output(python_session, code)
        assert time.monotonic() - start < 6  # timeout_s = 3 in the test config
        assert (
            out.startswith("error: killed")
            or "exit code 137" in out
            or "-9" in out
            or "exit code 152" in out
        )
    session = await client.open("calculator", calculator_task())
    result = await session.step(
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'
    )
    assert result.observations[0]["content"] == "2"

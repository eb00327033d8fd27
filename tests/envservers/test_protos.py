"""The committed generated code must equal what `python -m protos.generate` makes now, the
versions it demands at import must be what pyproject.toml lets pip install, and the wire
messages' fields are a contract (changing them must be a visible edit here)."""

import re
import tomllib
from pathlib import Path

from protos import env_pb2
from protos.generate import PROTO_DIR, fix_imports, generate


def test_committed_generated_code_matches_a_fresh_generation(tmp_path):
    written = generate(tmp_path)
    assert {p.name for p in written} == {"env_pb2.py", "env_pb2.pyi", "env_pb2_grpc.py"}
    for fresh in written:
        committed = PROTO_DIR / fresh.name
        assert committed.read_text() == fresh.read_text(), (
            f"protos/{fresh.name} is stale: run `python -m protos.generate` and commit"
        )


def _floor(requirement: str) -> tuple[int, ...]:
    """(1, 85, 1) for "grpcio>=1.85.1" (the lower bound pip may pick)."""
    return tuple(int(part) for part in re.search(r">=([\d.]+)", requirement)[1].split("."))


def test_pyproject_floors_cover_what_the_generated_code_demands():
    # The generated modules raise at import below the grpcio and protobuf they were generated
    # by: on 2026-11-26 an image with grpcio 1.84.0 (pyproject then said >=1.66) could not
    # start an env server. The floors move with `make proto`.
    pyproject = tomllib.loads((PROTO_DIR.parent / "pyproject.toml").read_text())
    floors = {re.match(r"[\w-]+", r)[0]: r for r in pyproject["project"]["dependencies"]}
    grpc_code = (PROTO_DIR / "env_pb2_grpc.py").read_text()
    grpc_generated = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", grpc_code)[1]
    for package in ("grpcio", "grpcio-health-checking", "grpcio-reflection"):
        assert _floor(floors[package]) >= tuple(map(int, grpc_generated.split("."))), package
    pb2 = (PROTO_DIR / "env_pb2.py").read_text()
    major, minor, patch = re.search(r"PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", pb2).groups()
    assert _floor(floors["protobuf"]) >= (int(major), int(minor), int(patch))
    assert f"<{int(major) + 1}" in floors["protobuf"]  # a new major refuses this gencode


def test_imports_are_made_package_relative():
    assert fix_imports("import env_pb2 as env__pb2\nimport grpc\n") == (
        "from protos import env_pb2 as env__pb2\nimport grpc\n"
    )
    text = (PROTO_DIR / "env_pb2_grpc.py").read_text()
    assert "from protos import env_pb2 as env__pb2" in text


def _fields(message) -> list[tuple[str, int]]:
    return [(f.name, f.type) for f in message.DESCRIPTOR.fields]


def test_wire_surface():
    f = env_pb2.DESCRIPTOR.services_by_name["EnvService"]
    assert [m.name for m in f.methods] == ["ListEnvs", "Reset", "Step", "Close", "RunWorkflow"]
    string, double, boolean, uint32, message = 9, 1, 8, 13, 11
    assert _fields(env_pb2.ChatMessage) == [("role", string), ("content", string), ("name", string)]
    assert _fields(env_pb2.ResetRequest) == [
        ("env_class", string),
        ("task_json", string),
        ("session_id", string),
        ("tool_format", string),  # the client's model's tool-call format; "": the server's
    ]
    assert _fields(env_pb2.ResetResponse) == [
        ("session_id", string),
        ("messages", message),
        ("tools", message),
        ("metadata_json", string),
        ("kind", string),  # "": stepped; "workflow": run by RunWorkflow
    ]
    assert _fields(env_pb2.RunWorkflowRequest) == [
        ("session_id", string),
        ("base_url", string),
        ("api_key", string),
    ]
    assert _fields(env_pb2.RunWorkflowResponse) == [
        ("reward", double),
        ("metadata_json", string),
        ("error", string),
    ]
    assert _fields(env_pb2.StepRequest) == [
        ("session_id", string),
        ("action", string),
        ("seq", uint32),
    ]
    assert _fields(env_pb2.StepResponse) == [
        ("observations", message),
        ("reward", double),
        ("done", boolean),
        ("metadata_json", string),
    ]
    assert Path(PROTO_DIR / "env.proto").is_file()

"""The architecture as the imports say it is (docs/architecture.md): the roles never import
each other, and the shared packages import no role. Every import counts, at the top of a
module or inside a function; the import graph is read from the source, not from what a test
happened to import. Inside the learner, its torch side (learner/trainer/) imports nothing of
its bus side. Also the size rules docs/architecture.md states: no module over 350 lines, no
function over 80 (generated code and dashboards aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROLES = ("actors", "learner", "envservers")
SHARED = ("broker", "weights", "protos", "common", "demo")
PACKAGES = ROLES + SHARED + ("deploy", "bench")
# Generated code and dashboards (declarative panel lists) are exempt (docs/architecture.md).
GENERATED = {
    "protos/env_pb2.py",
    "protos/env_pb2_grpc.py",
    "protos/env_pb2.pyi",
    "deploy/grafana/dashboard.py",
}
MAX_MODULE_LINES = 350
MAX_FUNCTION_LINES = 80


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts)


def _imported_modules(path: Path) -> set[str]:
    """Dotted names of the modules `path` imports, anywhere in it (`from a.b import c`
    counts as `a.b.c`: c may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _imported_packages(path: Path) -> set[str]:
    """Top-level package names `path` imports, anywhere in it."""
    return {name.split(".")[0] for name in _imported_modules(path)}


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(REPO)} imports {name}"
        for path in _modules(package)
        for name in sorted(_imported_packages(path) & set(forbidden))
    ]


@pytest.mark.parametrize("role", ROLES)
def test_roles_never_import_each_other(role):
    others = tuple(r for r in ROLES if r != role)
    assert _violations(role, others) == []


@pytest.mark.parametrize("package", SHARED)
def test_shared_packages_import_no_role(package):
    assert _violations(package, ROLES) == []


def test_nothing_imports_the_launchers_or_benchmarks():
    for package in ROLES + SHARED:
        assert _violations(package, ("deploy", "bench", "tests")) == []


def test_the_trainer_imports_nothing_of_the_bus():
    """learner/trainer/ (model, losses, FSDP, checkpoints) sees samples, never the bus: no
    broker/, no NATS, no module of the learner's bus side (loop, intake, dispatcher, ...)."""
    bus_side = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in _modules("learner/trainer")
        for name in sorted(_imported_modules(path))
        if name.split(".")[0] in ("broker", "nats")
        or (name.startswith("learner.") and not name.startswith("learner.trainer."))
    ]
    assert _modules("learner/trainer") and bus_side == []


def test_no_module_over_350_lines():
    long = [
        f"{p.relative_to(REPO)}: {n}"
        for package in PACKAGES
        for p in _modules(package)
        if str(p.relative_to(REPO)) not in GENERATED
        and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long == []


def test_no_function_over_80_lines():
    long = []
    for package in PACKAGES:
        for path in _modules(package):
            if str(path.relative_to(REPO)) in GENERATED:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {n}")
    assert long == []

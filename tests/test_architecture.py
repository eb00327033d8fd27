"""The architecture as the imports say it is (docs/architecture.md): the roles never import
each other, and the shared packages import no role. Every import counts, at the top of a
module or inside a function; the import graph is read from the source, not from what a test
happened to import. Inside the learner, its torch side (learner/trainer/) imports nothing of
its bus side. No import cycles anywhere (two modules importing each other, however deep,
hide a missing seam). Also the size rules docs/architecture.md states: no module over 350
lines, no function over 80 (generated code and dashboards aside)."""

from __future__ import annotations

import ast
import shutil
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


WEIGHT_SIDES = ("learner_side", "actor_side", "engine_side")
"""weights/ by the process each part runs in: learner rank 0, the actor process, the vLLM
worker. `shared` (both ends of a round) and `formats` (what is on disk) belong to none."""


def _weights_problems(path: Path) -> list[str]:
    part = path.relative_to(REPO / "weights").parts[0]
    problems = []
    for name in sorted(_imported_modules(path)):
        top, _, rest = name.partition(".")
        if top == "vllm" and part != "engine_side":
            problems.append("imports vllm: only weights/engine_side may")
        if name.startswith("torch.distributed.fsdp") and part != "learner_side":
            problems.append("imports FSDP: only weights/learner_side may")
        side = rest.split(".")[0] if top == "weights" else ""
        if side in WEIGHT_SIDES and side != part:
            problems.append(f"imports {name}: a side imports only its own, shared and formats")
    return [f"{path.relative_to(REPO)} {problem}" for problem in problems]


def test_each_side_of_the_weight_path_imports_only_its_own_and_the_shared_parts():
    modules = _modules("weights")
    assert {p.relative_to(REPO / "weights").parts[0] for p in modules} <= {
        *WEIGHT_SIDES,
        "shared",
        "formats",
        "config.py",
    }
    assert [problem for path in modules for problem in _weights_problems(path)] == []


def test_the_engine_workers_state_is_one_object():
    """vLLM mixes our worker methods into its worker class: state kept as that class's
    attributes would share its namespace. It lives in one WorkerState (engine_side/state.py),
    reached through `worker_state`; no attribute or method of ours is named `_tether...`."""
    found = [
        f"{path.relative_to(REPO)}:{node.lineno} {getattr(node, 'attr', getattr(node, 'name', ''))}"
        for package in ("weights", "actors")
        for path in _modules(package)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute | ast.FunctionDef)
        and getattr(node, "attr", getattr(node, "name", "")).startswith("_tether")
    ]
    assert found == []


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


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """{module: the modules of `packages` it imports}, every import anywhere in it counted;
    `from a.b import c` is an edge to a.b.c when that is a module, else to a.b."""
    paths = {
        _module_name(p, root): p
        for package in packages
        for p in (root / package).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    graph = {}
    for module, path in paths.items():
        targets = set()
        for name in _imported_modules(path):
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):  # the longest prefix that is a module
                if (candidate := ".".join(parts[:cut])) in paths:
                    targets.add(candidate)
                    break
        graph[module] = targets - {module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules, as one cycle through it
    (Tarjan's algorithm, iterative), sorted."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(_cycle_through(sorted(group), graph))
    return sorted(groups)


def _cycle_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A path from the group's first module back to itself inside the group (breadth-first,
    so the cycle named is a shortest one)."""
    members, first = set(group), group[0]
    came_from: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(came_from[path[-1]])
                    return [first, *reversed(path[:-1]), first] if node != first else [first]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{group} is not strongly connected")


def test_no_import_cycles():
    cycles = import_cycles(import_graph(REPO, PACKAGES))
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_a_cycle_added_to_a_copy_of_the_tree_is_named(tmp_path):
    for package in ("common", "broker"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    assert import_cycles(import_graph(tmp_path, ("common", "broker"))) == []
    (tmp_path / "common" / "first.py").write_text("def f():\n    from broker import second\n")
    (tmp_path / "broker" / "second.py").write_text("from common.first import f\n")
    assert import_cycles(import_graph(tmp_path, ("common", "broker"))) == [
        ["broker.second", "common.first", "broker.second"]
    ]


def test_no_package_edits_sys_path():
    """The project installs its packages (bench included), so a script runs as `python -m
    bench.NAME` and nothing puts the repository on sys.path by hand."""
    edits = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for package in PACKAGES
        for path in _modules(package)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr in ("insert", "append")
        and ast.unparse(node.value) == "sys.path"
    ]
    assert edits == []

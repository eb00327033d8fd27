"""Calls in test modules checked against the real signatures, without running them.

The GPU tests run only where a GPU is lent, so nothing else notices when an API they call
changes: `make gpu-check` once failed with a TypeError before testing anything
(`engine.generate(prompt, sampling, max_tokens=...)` against `generate(prompt_token_ids,
turn)`). This reads a module's source and binds each call it can resolve to the callee's
`inspect.signature`, placeholders for values:

- a call of a name imported from this repository (a function or a class);
- a method called on a class of this repository (`VllmEngine.start(...)`);
- a method called on a variable or fixture whose class is known from how it was made:
  `x = Cls(...)`, `x = await Cls.start(...)` (a classmethod annotated to return `Cls`), or a
  fixture returning or yielding such a value; the method must exist;
- `asyncio.to_thread(f, *args)`: `f` called with `args`.

Calls with `*args` or `**kwargs` are not bound (their arity is unknown). Nothing is
imported but what the module imports itself.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

REPO_PACKAGES = ("actors", "learner", "weights", "broker", "common", "envservers", "demo",
                 "deploy", "protos", "tests")  # fmt: skip


def _ours(obj) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in REPO_PACKAGES


def _imports(tree: ast.Module) -> dict[str, object]:
    """Every name the module imports (at the top or inside functions) -> the object."""
    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = importlib.import_module(alias.name)
                names[alias.asname or alias.name.split(".")[0]] = (
                    module if alias.asname else importlib.import_module(alias.name.split(".")[0])
                )
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if hasattr(module, alias.name):  # a name whose value may be None
                    value = getattr(module, alias.name)
                else:
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                names[alias.asname or alias.name] = value
    return names


class _Module:
    def __init__(self, path: Path, fixtures: dict[str, type]):
        self.path = path
        self.tree = ast.parse(path.read_text())
        self.names = _imports(self.tree)
        self.types: dict[str, type] = dict(fixtures)  # variable or fixture name -> class
        self._infer_types()

    def type_of(self, expr: ast.expr) -> type | None:
        """The class of this repository an expression makes, when it says so plainly."""
        if isinstance(expr, ast.Await):
            return self.type_of(expr.value)
        if isinstance(expr, ast.Name):
            return self.types.get(expr.id)
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func
        if isinstance(func, ast.Name):
            made = self.names.get(func.id)
            return made if isinstance(made, type) and _ours(made) else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            cls = self.names.get(func.value.id)
            if isinstance(cls, type) and _ours(cls):
                factory = inspect.getattr_static(cls, func.attr, None)
                if isinstance(factory, classmethod):
                    returns = inspect.signature(factory.__func__).return_annotation
                    if returns in (cls.__name__, cls):
                        return cls
        return None

    def _infer_types(self) -> None:
        for _ in range(2):  # a fixture may return a variable typed further down the file
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if isinstance(target, ast.Name) and (made := self.type_of(node.value)):
                        self.types[target.id] = made
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _is_fixture(node):
                    for inner in ast.walk(node):
                        value = getattr(inner, "value", None)
                        if isinstance(inner, ast.Return | ast.Yield) and value is not None:
                            if made := self.type_of(value):
                                self.types[node.name] = made

    def fixture_types(self) -> dict[str, type]:
        return {
            node.name: self.types[node.name]
            for node in ast.walk(self.tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and _is_fixture(node)
            and node.name in self.types
        }

    def callee(self, func: ast.expr) -> tuple[object, str, bool] | str | None:
        """(callable, its name, whether a `self` must be supplied); a message when the
        method does not exist; None when the call is not ours to check."""
        if isinstance(func, ast.Name):
            target = self.names.get(func.id)
            if callable(target) and _ours(target):
                return target, func.id, False
            return None
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return None
        owner, method = func.value.id, func.attr
        cls = self.names.get(owner)
        if isinstance(cls, type) and _ours(cls):
            static = inspect.getattr_static(cls, method, None)
            if static is None:
                return f"{cls.__name__} has no attribute {method!r}"
            return getattr(cls, method), f"{cls.__name__}.{method}", False
        cls = self.types.get(owner)
        if cls is None:
            return None
        static = inspect.getattr_static(cls, method, None)
        if static is None:
            if method in getattr(cls, "model_fields", {}) or method in getattr(
                cls, "__dataclass_fields__", {}
            ):
                return None  # a field holding a callable
            return f"{owner} ({cls.__name__}) has no attribute {method!r}"
        if isinstance(static, property):
            return None
        needs_self = not isinstance(static, classmethod | staticmethod)
        return getattr(cls, method), f"{cls.__name__}.{method}", needs_self

    def problems(self) -> list[str]:
        found = []
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            func, args = node.func, list(node.args)
            if _is_to_thread(func) and args:  # asyncio.to_thread(f, *args, **kwargs)
                func, args = args[0], args[1:]
            if any(isinstance(a, ast.Starred) for a in args) or any(
                k.arg is None for k in node.keywords
            ):
                continue
            callee = self.callee(func)
            if callee is None:
                continue
            where = f"{self.path.name}:{node.lineno}"
            if isinstance(callee, str):
                found.append(f"{where}: {callee}")
                continue
            target, name, needs_self = callee
            try:
                signature = inspect.signature(target)
            except (TypeError, ValueError):
                continue  # a builtin without a signature
            placeholders = [None] * (len(args) + needs_self)
            try:
                signature.bind(*placeholders, **{k.arg: None for k in node.keywords})
            except TypeError as e:
                found.append(f"{where}: {name}{signature}: {e}")
        return found


def _is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
    return False


def _is_to_thread(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "to_thread"


def check_calls(paths: list[Path], conftests: list[Path] = ()) -> list[str]:
    """Every call in `paths` that cannot bind to its callee's signature, one line each.
    Fixtures defined in `conftests` are typed first, for the modules that use them."""
    fixtures: dict[str, type] = {}
    for conftest in conftests:
        fixtures |= _Module(conftest, {}).fixture_types()
    return [problem for path in paths for problem in _Module(path, fixtures).problems()]

"""Regenerate the Python code of the env service from `protos/*.proto` (`make proto`).

    python -m protos.generate            # writes protos/env_pb2.py, env_pb2.pyi, env_pb2_grpc.py
    python -m protos.generate --out DIR  # writes them into DIR instead (the drift test does this)

grpc_tools emits `import env_pb2 as env__pb2` in the *_grpc.py file, which only works with
protos/ on sys.path; we rewrite that line to the package-relative `from protos import ...`,
deterministically, so the generated files are identical on every machine with the same
grpcio-tools version.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PACKAGE = "protos"
_BARE_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def fix_imports(text: str) -> str:
    """`import env_pb2 as env__pb2` -> `from protos import env_pb2 as env__pb2`."""
    return _BARE_IMPORT.sub(rf"from {PACKAGE} import \1 as \2", text)


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on every .proto in protos/ into `out_dir`; return the files written."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    out_dir.mkdir(parents=True, exist_ok=True)
    protos = proto_files()
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[p.name for p in protos],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written = []
    for proto in protos:
        stem = proto.stem
        for name in (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"):
            path = out_dir / name
            path.write_text(fix_imports(path.read_text()))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_DIR, help="output directory")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

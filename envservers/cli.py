"""`envserver --config C` (or `--env NAME --port P`): run one env server.

Parses arguments and validates the config before importing grpc or any environment, so
`--help` and a bad config answer at once. Overrides are dotted from the top of the config
file: `envserver.port=50052 envserver.python.timeout_s=5`.
"""

from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="envserver", description="Serve tool environments over gRPC."
    )
    parser.add_argument("--config", help="TOML or YAML file with an [envserver] section")
    parser.add_argument(
        "--env",
        action="append",
        default=None,
        metavar="NAME",
        help="host this environment (repeatable; replaces envserver.envs)",
    )
    parser.add_argument("--port", type=int, default=None, help="gRPC port (0 = free port)")
    parser.add_argument("--host", default=None, help="address to listen on")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="e.g. envserver.max_sessions=100"
    )
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace):
    from common.config import load_section
    from envservers.config import EnvServerConfig

    overrides = list(args.overrides)
    if args.env:
        overrides.append("envserver.envs=" + json.dumps(args.env))
    if args.port is not None:
        overrides.append(f"envserver.port={args.port}")
    if args.host is not None:
        overrides.append(f"envserver.host={args.host}")
    return load_section(EnvServerConfig, args.config, "envserver", overrides)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args)
    except ValueError as e:
        print(f"envserver: {e}", file=sys.stderr)
        return 2
    problem = preflight(config)
    if problem:
        print(f"envserver: {problem}", file=sys.stderr)
        return 2

    import asyncio
    import logging

    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from envservers.registry import build_providers

    try:  # before grpc loads: a plug-in that cannot load is one line at once
        providers = build_providers(config)
    except ValueError as e:
        print(f"envserver: {e}", file=sys.stderr)
        return 2
    from envservers.server import serve

    try:
        asyncio.run(serve(config, providers))
    except ValueError as e:
        print(f"envserver: {e}", file=sys.stderr)
        return 2
    return 0


def preflight(config) -> str | None:
    """A port of this server already taken, found before any environment starts (gRPC would
    even share a port with another gRPC server: it binds with SO_REUSEPORT). None if free."""
    from common.metrics import PortInUse, require_free_port

    ports = [("envserver.port", config.port)]
    if config.metrics_port is not None:
        ports.append(("envserver.metrics_port", config.metrics_port))
    for setting, port in ports:
        try:
            require_free_port(port, config.host, setting=setting)
        except PortInUse as e:
            return str(e)
    return None


if __name__ == "__main__":
    sys.exit(main())

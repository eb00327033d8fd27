"""`python -m broker serve [--port P] [--store-dir DIR] [--max-file-store SIZE] [--config C]`:
run an embedded nats-server. Credentials it requires come from the environment
(NATS_USER/NATS_PASSWORD or NATS_TOKEN, or their _FILE variants); TLS from the config
file's `[broker.tls]`.

`python -m broker gc [--config C] [--url URL] [--namespace NS ...] [--dry-run]`: delete the
streams and buckets of runs that are done, freeing the file store they reserve
(docs/broker.md, "Runs sharing one server")."""

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from broker.server import DEFAULT_MAX_FILE_STORE

    parser = argparse.ArgumentParser(prog="python -m broker", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run nats-server with JetStream until Ctrl-C")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=4222, help="client port (0: a free one)")
    serve.add_argument("--monitor-port", type=int, default=0, help="HTTP monitoring (0: free)")
    serve.add_argument("--store-dir", default="runs/nats", help="JetStream data directory")
    serve.add_argument(
        "--max-file-store",
        default=DEFAULT_MAX_FILE_STORE,
        help="JetStream file store; each live namespace reserves broker.max_trajectory_bytes",
    )
    serve.add_argument("--config", default=None, help="config file whose [broker.tls] to use")
    gc = commands.add_parser("gc", help="delete the streams of runs that are done")
    gc.add_argument("--config", default=None, help="config file whose [broker] to use")
    gc.add_argument("--url", default=None, help="NATS URL (default: the config's broker.url)")
    gc.add_argument(
        "--namespace", action="append", default=[], help="delete this one too, in any state"
    )
    gc.add_argument("--dry-run", action="store_true", help="list; delete nothing")
    args = parser.parse_args(argv)

    from broker.config import BrokerConfig
    from broker.names import BusNames
    from broker.security import NatsAuth
    from common.config import load_section

    overrides = [f"broker.url={args.url}"] if getattr(args, "url", None) else []
    try:
        broker = load_section(BrokerConfig, args.config, "broker", overrides)
        auth = NatsAuth.from_environment()
        for namespace in getattr(args, "namespace", []):
            BusNames(namespace)  # a ValueError naming the rule
    except ValueError as e:
        print(f"python -m broker {args.command}: {e}", file=sys.stderr)
        return 2
    if args.command == "gc":
        from broker.gc import gc

        return gc(broker, namespaces=args.namespace, dry_run=args.dry_run)
    from broker.server import serve_forever

    return serve_forever(
        args.store_dir,
        args.host,
        args.port or None,
        auth=auth,
        tls=broker.tls,
        max_file_store=args.max_file_store,
        monitor_port=args.monitor_port or None,
    )


if __name__ == "__main__":
    sys.exit(main())

"""`python -m broker serve [--port P] [--store-dir DIR] [--config C]`: run an embedded
nats-server. Credentials it requires come from the environment (NATS_USER/NATS_PASSWORD or
NATS_TOKEN, or their _FILE variants); TLS from the config file's `[broker.tls]`."""

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run nats-server with JetStream until Ctrl-C")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=4222, help="client port (0: a free one)")
    serve.add_argument("--store-dir", default="runs/nats", help="JetStream data directory")
    serve.add_argument("--config", default=None, help="config file whose [broker.tls] to use")
    args = parser.parse_args(argv)

    from broker.config import BrokerConfig
    from broker.security import NatsAuth
    from broker.server import serve_forever
    from common.config import load_section

    try:
        broker = load_section(BrokerConfig, args.config, "broker")
        auth = NatsAuth.from_environment()
    except ValueError as e:
        print(f"python -m broker serve: {e}", file=sys.stderr)
        return 2
    return serve_forever(args.store_dir, args.host, args.port or None, auth=auth, tls=broker.tls)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m broker serve [--port P] [--store-dir DIR]`: run an embedded nats-server."""

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run nats-server with JetStream until Ctrl-C")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=4222, help="client port (0: a free one)")
    serve.add_argument("--store-dir", default="runs/nats", help="JetStream data directory")
    args = parser.parse_args(argv)

    from broker.server import serve_forever

    return serve_forever(args.store_dir, args.host, args.port or None)


if __name__ == "__main__":
    sys.exit(main())

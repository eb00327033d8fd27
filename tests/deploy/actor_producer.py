"""A real actor replica process without vLLM, for the live Prometheus test: the real actor
loop, bus, /metrics and gRPC env client (`actors.replica.run_replica`, `GrpcEnvConnector`),
with `actors.fakes.ScriptedEngine` in place of the vLLM engine. It plays the calculator
episodes it pulls from NATS against a real env server.

    python -m tests.deploy.actor_producer CONFIG     # [actor] and [broker] sections

Runs until SIGTERM (the replica's graceful stop).
"""

from __future__ import annotations

import sys

TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
ANSWER = "<answer>42</answer>"


async def build(spec, config, broker):
    from actors.replica import actor_id_of, grpc_actor
    from demo.tokenizer import build_tokenizer
    from tests.fakes import ScriptedEngine, by_turn

    tokenizer = build_tokenizer(num_conversations=50)
    engine = ScriptedEngine(tokenizer, by_turn(TOOL_CALL, ANSWER), delay_s=0.05)
    actor = grpc_actor(config, broker, engine, tokenizer, actor_id=actor_id_of(spec))
    return actor, lambda: None


def main(argv: list[str]) -> None:
    from actors.replica import run_replica
    from actors.replicas import ReplicaSpec

    run_replica(ReplicaSpec(index=0, config_path=argv[0]), build)


if __name__ == "__main__":
    main(sys.argv[1:])

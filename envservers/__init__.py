"""Environment servers: tools and rewards for multi-turn RL rollouts, over gRPC.

`types` (the Environment interface), `tool_parsing`/`tools`/`rewards`/`tool_env` (pure
episode logic), `envs/` (calculator, noop, sql, python, mcp), `adapters/` (skyrl-gym,
OpenEnv), `service`/`server`/`cli` (the gRPC server), `client` (what actors call).
Knows nothing of the actor or the learner. See docs/envservers.md.
"""

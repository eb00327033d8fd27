"""The bus's size limit, which the server, every connection and every publisher agree on:
one message's payload. Its own module so that nothing imports the server's launcher for a
number (that made a circle: config -> streams -> server -> config)."""

MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
"""8 MB: the largest payload NATS documents as sensible; larger trajectories are spilled."""

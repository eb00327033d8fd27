"""common.procs.free_port: a port outside the kernel's ephemeral range, which an outgoing
connection cannot take between the launcher's choice and the server's bind (one did, and an
env server could not start through ten restarts in the fault suite)."""

from __future__ import annotations

import socket

from common.procs import ephemeral_range, free_port


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound():
    low, high = ephemeral_range()
    assert 1024 <= low < high
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports)
    assert len(ports) > 1  # chosen at random, not one fixed port for every caller
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_given():
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        assert all(free_port() != taken for _ in range(200))

"""Hostile bytes at the gRPC port: random garbage, an HTTP/2 frame far over the frame size
limit, a gRPC message declaring 2 GB, idle connections that never speak. The server closes
or refuses each of them and keeps serving an honest client the whole time, without
allocating what a declared length asks for. Message-size limits hold on both ends."""

import asyncio
import random
import resource
import struct

import grpc
import pytest

from envservers.server import EnvServer
from protos.client import EnvClient
from tests.envservers.conftest import calculator_task, server_config
from tests.envservers.fakes import BigResetProvider

ADD = '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS = 0x0, 0x1, 0x3, 0x4
END_STREAM, END_HEADERS = 0x1, 0x4


def _frame(kind: int, flags: int, stream: int, payload: bytes, *, length: int | None = None):
    size = len(payload) if length is None else length
    return struct.pack(">I", size)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _grpc_headers(authority: bytes, path: bytes) -> bytes:
    return (
        b"\x83"  # :method POST (static table 3)
        + b"\x86"  # :scheme http (static table 6)
        + b"\x04" + bytes([len(path)]) + path  # :path, name from static table 4
        + b"\x01" + bytes([len(authority)]) + authority  # :authority, static table 1
        + _literal(b"content-type", b"application/grpc")
        + _literal(b"te", b"trailers")
    )  # fmt: skip


@pytest.fixture
async def server():
    config = server_config(envs=["calculator"], metrics_port=None, max_message_bytes=1024**2)
    async with EnvServer(config) as s:
        yield s


async def _honest_episode(address: str) -> None:
    async with EnvClient(address, timeout_s=30, max_retries=0) as client:
        session = await client.open("calculator", calculator_task())
        assert (await session.step(ADD)).observations[0]["content"] == "42"
        assert (await session.step("<answer>42</answer>")).reward == 1.0
        await session.close()


async def _send_and_drain(port: int, data: bytes, timeout_s: float = 20.0) -> bytes:
    """Send `data`, then read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = b""
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout_s):
            while chunk := await reader.read(65536):
                received += chunk
    except ConnectionResetError:
        pass  # closed hard: as good as a close
    finally:
        writer.close()
    return received


async def test_random_bytes_are_dropped_and_the_server_keeps_serving(server):
    rng = random.Random(0)
    garbage = [rng.randbytes(rng.randint(1, 65536)) for _ in range(40)]
    garbage += [PREFACE + rng.randbytes(4096) for _ in range(10)]  # a valid start, then noise
    honest = asyncio.create_task(_honest_episode(server.address))
    await asyncio.gather(*(_send_and_drain(server.port, g) for g in garbage))
    await honest
    await _honest_episode(server.address)


async def test_an_oversize_http2_frame_closes_only_its_connection(server):
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(20)]
    # A DATA frame announcing 16 MB, against HTTP/2's default 16 KB SETTINGS_MAX_FRAME_SIZE.
    oversize = _frame(DATA, 0, 1, b"x" * 1024, length=2**24 - 1)
    await _send_and_drain(server.port, PREFACE + _frame(SETTINGS, 0, 0, b"") + oversize)
    await _honest_episode(server.address)  # while 20 idle connections still hold on
    for _, writer in idle:
        writer.close()


async def test_a_declared_2gb_grpc_message_is_refused_without_allocating_it(server):
    rss_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    path = b"/tether.env.v1.EnvService/Step"
    message = b"\x00" + struct.pack(">I", 2**31 - 1) + b"\x0a\x01x"  # 2 GB declared, 3 sent
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        PREFACE
        + _frame(SETTINGS, 0, 0, b"")
        + _frame(HEADERS, END_HEADERS, 1, _grpc_headers(server.address.encode(), path))
        + _frame(DATA, 0, 1, message)
    )
    # The server ends stream 1 at once (trailers with grpc-status 8, RESOURCE_EXHAUSTED:
    # "Received message larger than max") and keeps the connection open.
    ended = False
    async with asyncio.timeout(20):
        while not ended:
            kind, flags, stream, _ = await _read_frame(reader)
            ended = stream == 1 and (kind == RST_STREAM or (kind == HEADERS and flags & END_STREAM))
    writer.close()
    await _honest_episode(server.address)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kb) / 1024
    assert grown_mb < 512, f"peak RSS grew by {grown_mb:.0f} MB"


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes]:
    header = await reader.readexactly(9)
    length = int.from_bytes(header[:3], "big")
    stream = int.from_bytes(header[5:], "big") & 0x7FFF_FFFF
    return header[3], header[4], stream, await reader.readexactly(length)


async def test_message_size_limits_hold_on_both_ends(server):
    big_prompt = calculator_task(question="x" * 300_000)
    # A client limited to 64 KB refuses to send a 300 KB request itself.
    async with EnvClient(server.address, max_retries=0, max_message_bytes=64 * 1024) as small:
        with pytest.raises(grpc.aio.AioRpcError) as sent:
            await small.open("calculator", big_prompt)
    assert sent.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Sent message larger than max" in sent.value.details()
    # The server (1 MB) refuses a 2 MB request; a client within both limits gets through.
    async with EnvClient(server.address, max_retries=0, max_message_bytes=4 * 1024**2) as big:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await big.open("calculator", calculator_task(question="x" * 2 * 1024**2))
        session = await big.open("calculator", big_prompt)
        await session.close()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await _honest_episode(server.address)


async def test_a_reply_over_the_clients_limit_is_refused_by_the_client():
    config = server_config(envs=["calculator"], metrics_port=None)
    async with EnvServer(config, {"big": BigResetProvider(300_000)}) as server:
        async with EnvClient(server.address, max_retries=0, max_message_bytes=256 * 1024) as c:
            with pytest.raises(grpc.aio.AioRpcError) as received:
                await c.open("big", {})
    assert received.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Received message larger than max" in received.value.details()

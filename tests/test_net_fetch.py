"""net/fetch.py: the fetch protocol over plain asyncio streams (a unix socketpair, no libp2p)."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

from swarm_node.codec import digest as packet_digest
from swarm_node.net.fetch import Offers, PacketServer, StreamLimits, request_packet
from swarm_node.net.records import decode_frame_body, encode_frame, frame_length


async def _pipe(server: PacketServer, peer: object = None):
    """A client (reader, writer) connected to ``server`` over a unix socketpair, as `peer`."""
    a, b = socket.socketpair()
    server_side = await asyncio.open_connection(sock=a)
    task = asyncio.ensure_future(server.handle(*server_side, peer))
    reader, writer = await asyncio.open_connection(sock=b)
    return reader, writer, task


def test_fetch_protocol_over_plain_streams():
    data = os.urandom(2_500_000)
    d = packet_digest(data)
    fake = packet_digest(b"promised")
    table = {d: data, fake: b"other bytes"}

    async def main():
        stats: dict[str, int] = {}
        server = PacketServer("run-a", table.get, stats)

        async def fetch(run_id, digest, max_bytes=16 * 2**20):
            reader, writer, task = await _pipe(server)
            try:
                return await asyncio.wait_for(request_packet(reader, writer, run_id, digest, max_bytes), 5)
            finally:
                writer.close()
                await task

        assert await fetch("run-a", d) == (data, "ok")
        assert await fetch("run-a", packet_digest(b"unknown")) == (None, "not_found")
        assert await fetch("run-b", d) == (None, "not_found")  # other runs' requests are not served
        assert await fetch("run-a", fake) == (None, "mismatch")
        assert await fetch("run-a", d, max_bytes=2**20) == (None, "oversize")
        reader, writer, task = await _pipe(server)  # garbage request -> bad_request reply
        writer.write(b"\0\0\0\3abc")
        header = decode_frame_body(await reader.readexactly(frame_length(await reader.readexactly(4))))
        assert header == {"status": "bad_request"}
        writer.close()
        await task
        assert stats["bytes_out"] == len(data) + len(b"other bytes") and stats["serve_not_found"] == 2

    asyncio.run(main())


def test_offers_keep_the_newest_packets():
    offers = Offers(keep=2)
    blobs = [os.urandom(10 + i) for i in range(3)]
    for r, b in enumerate(blobs):
        offers.add(r, packet_digest(b), b)
    assert offers.announced() == [(1, packet_digest(blobs[1]), 11), (2, packet_digest(blobs[2]), 12)]
    assert offers.get(packet_digest(blobs[0])) is None and offers.get(packet_digest(blobs[2])) == blobs[2]
    offers.add(1, packet_digest(blobs[1]), blobs[1])  # re-offered: becomes the newest, nothing else dropped
    assert [d for _, d, _ in offers.announced()] == [packet_digest(blobs[2]), packet_digest(blobs[1])]


async def _header(reader: asyncio.StreamReader) -> dict:
    return decode_frame_body(await reader.readexactly(frame_length(await reader.readexactly(4))))


def test_streams_beyond_the_per_peer_and_total_limits_are_refused_at_once():
    """Held-open streams (no request sent) count against their peer: beyond 2 per peer or 3 in all
    the server answers busy without reading anything and closes, so they cost no descriptor."""
    data = b"packet"
    d = packet_digest(data)

    async def main():
        stats: dict[str, int] = {}
        server = PacketServer("run", {d: data}.get, stats, StreamLimits(max_per_peer=2, max_open=3))
        held = [await _pipe(server, "QmA") for _ in range(2)]
        await asyncio.sleep(0.05)  # the handlers are waiting for the requests
        assert server.limits.open == {"QmA": 2}
        reader, writer, task = await _pipe(server, "QmA")  # a third from QmA: busy, at once
        t0 = time.monotonic()
        assert await asyncio.wait_for(_header(reader), 2) == {"status": "busy"}
        assert await reader.read() == b"" and time.monotonic() - t0 < 0.5
        await task
        other = await _pipe(server, "QmB")  # QmB's first stream is the third in all: allowed
        await asyncio.sleep(0.05)
        reader, writer, task = await _pipe(server, "QmC")  # the fourth in all: busy
        assert await asyncio.wait_for(_header(reader), 2) == {"status": "busy"}
        await task
        assert stats["serve_refused"] == 2
        for r, w, t in held:  # QmA finally asks: both of its streams are served, then its slots are free again
            w.write(encode_frame({"run_id": "run", "digest": d}))
            assert (await _header(r))["status"] == "ok" and await r.readexactly(len(data)) == data
            w.close()
            await t
        other[1].close()
        await asyncio.wait_for(other[2], 15)  # the server gives up on QmB's silent stream (EOF)
        assert server.limits.open == {}
        reader, writer, task = await _pipe(server, "QmA")
        writer.write(encode_frame({"run_id": "run", "digest": d}))
        assert (await _header(reader))["status"] == "ok"
        writer.close()
        await task

    asyncio.run(main())


def test_raise_fd_limit_lifts_the_soft_limit_to_the_hard_one():
    code = ("import resource; from swarm_node.net.fetch import raise_fd_limit;"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE);"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard)); print(hard, *raise_fd_limit(),"
            "*resource.getrlimit(resource.RLIMIT_NOFILE))")
    hard, soft_after, hard_after, soft_now, hard_now = map(int, subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout.split())
    assert soft_after == soft_now and hard_after == hard_now == hard
    assert soft_now == (hard if hard != -1 else 1 << 20)  # -1: RLIM_INFINITY

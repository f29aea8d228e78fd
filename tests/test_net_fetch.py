"""net/fetch.py: the fetch protocol over plain asyncio streams (a unix socketpair, no libp2p)."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from swarm_node.net.fetch import (MAX_SHORT_STREAMS, MIN_RESUME_BYTES, STRANGER_REQUEST_TIMEOUT_S, Download, Offers,
                                  PacketServer, StreamLimits, download_packet)
from swarm_node.net.records import decode_frame_body, encode_frame, frame_length
from swarm_node.wire.codec import digest as packet_digest


async def _pipe(server: PacketServer, peer: object = None, buffer: int | None = None):
    """A client (reader, writer) connected to ``server`` over a unix socketpair, as `peer` (`buffer`: the
    sockets' send and receive buffers, bytes)."""
    a, b = socket.socketpair()
    for sock in (a, b) if buffer else ():
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
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
                return await asyncio.wait_for(Download(run_id, digest, max_bytes).request(reader, writer), 5)
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


RELAY_BUDGET = 128 << 10  # what the relays in hivemind's p2pd let through per direction per connection


class CuttingRelay:
    """Streams to `server` through a relay that forwards at most `budget` bytes of each response,
    then resets both sides (as go-libp2p's circuit relay does with its default limits)."""

    def __init__(self, budget: int, server: PacketServer, first_budget: int | None = None):
        self.budget, self.server, self.first_budget = budget, server, first_budget  # first: the first stream's
        self.tasks: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks
        self.opened = 0

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.opened += 1
        (client_r, client_w), (relay_r, relay_w) = [await asyncio.open_connection(sock=s) for s in socket.socketpair()]
        (upstream_r, upstream_w), server_side = [await asyncio.open_connection(sock=s) for s in socket.socketpair()]

        async def pipe(src, dst, limit):
            while limit > 0 and (chunk := await src.read(min(65536, limit))):
                dst.write(chunk)
                await dst.drain()
                limit -= len(chunk)
            for w in (relay_w, upstream_w):
                w.transport.abort()

        for coro in (self.server.handle(*server_side, "QmCut"), pipe(relay_r, upstream_w, 1 << 30),
                     pipe(upstream_r, relay_w, self.first_budget if self.opened == 1 and self.first_budget else
                          self.budget)):
            task = asyncio.ensure_future(coro)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return client_r, client_w


def test_a_download_cut_by_a_relay_budget_resumes_where_it_stopped():
    """3 MiB through a relay that resets every connection after 128 KiB: one stream cannot carry
    it; resumed streams (each asking for the rest) can, and the whole still has to match the digest."""
    data = os.urandom(3 << 20)
    d = packet_digest(data)

    async def main():
        relay = CuttingRelay(RELAY_BUDGET, PacketServer("run", {d: data}.get, {}))
        single = Download("run", d, 16 << 20)
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):  # one stream cannot carry it
            await asyncio.wait_for(single.request(*await relay.connect()), 10)
        assert 0 < single.received < RELAY_BUDGET
        resumed = Download("run", d, 16 << 20)
        got = await asyncio.wait_for(download_packet(relay.connect, resumed), 60)
        return got, resumed

    (got, reason), resumed = asyncio.run(main())
    print(f"\n3 MiB through a 128 KiB relay: {resumed.resumes} resumes")
    assert reason == "ok" and got == data
    assert (3 << 20) // RELAY_BUDGET - 1 <= resumed.resumes <= (3 << 20) // MIN_RESUME_BYTES


def test_one_short_stream_does_not_end_a_download():
    """A resumed stream can land on a relayed connection that other streams had nearly used up: it
    brings little, and the next one, on a fresh connection, carries on."""
    data = os.urandom(1 << 20)
    d = packet_digest(data)
    relay = CuttingRelay(RELAY_BUDGET, PacketServer("run", {d: data}.get, {}), first_budget=MIN_RESUME_BYTES // 4)
    got, reason = asyncio.run(asyncio.wait_for(download_packet(relay.connect, Download("run", d, 16 << 20)), 60))
    assert got == data and reason == "ok" and relay.opened > 1


def test_a_cut_that_brings_too_little_or_a_changed_story_ends_the_download():
    """Resuming is bounded: MAX_SHORT_STREAMS streams in a row each cut before MIN_RESUME_BYTES end the
    download (no endless reconnects to a peer that cuts at once); a server that skips bytes or changes
    the size fails it."""
    data = os.urandom(1 << 20)
    d = packet_digest(data)

    async def main():
        stingy = CuttingRelay(MIN_RESUME_BYTES // 2, PacketServer("run", {d: data}.get, {}))
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):  # not resumed
            await asyncio.wait_for(download_packet(stingy.connect, Download("run", d, 16 << 20)), 10)

        liars = []

        async def liar(header: dict):  # answers `header` and a few bytes, whatever was asked
            a, b = socket.socketpair()
            reader, writer = await asyncio.open_connection(sock=b)
            a.sendall(encode_frame(header) + data[:100])
            a.shutdown(socket.SHUT_WR)
            liars.append(a)
            return reader, writer

        partial = Download("run", d, 16 << 20)
        partial.buf, partial.received = bytearray(len(data)), 50
        skipped = await Download.request(partial, *await liar({"status": "ok", "size": len(data), "offset": 80}))
        resized = await Download.request(partial, *await liar({"status": "ok", "size": len(data) + 1, "offset": 0}))
        return stingy.opened, skipped, resized

    opened, skipped, resized = asyncio.run(main())
    assert opened == MAX_SHORT_STREAMS and skipped == (None, "error") and resized == (None, "mismatch")


def test_the_server_sends_from_the_offset_asked():
    data = os.urandom(300_000)
    d = packet_digest(data)

    async def ask(request: dict) -> tuple[dict, bytes]:
        server = PacketServer("run", {d: data}.get, {})
        reader, writer, task = await _pipe(server)
        writer.write(encode_frame(request))
        header = await _header(reader)
        body = await reader.read()
        writer.close()
        await task
        return header, body

    async def main():
        return [await ask({"run_id": "run", "digest": d, **extra})
                for extra in ({}, {"offset": 123_456}, {"offset": len(data)}, {"offset": len(data) + 1},
                              {"offset": -1}, {"offset": "7"})]

    whole, middle, end, past, negative, text = asyncio.run(main())
    assert whole == ({"status": "ok", "size": len(data), "offset": 0}, data)
    assert middle == ({"status": "ok", "size": len(data), "offset": 123_456}, data[123_456:])
    assert end == ({"status": "ok", "size": len(data), "offset": len(data)}, b"")
    assert past[0] == negative[0] == text[0] == {"status": "bad_request"}


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


def test_silent_streams_of_strangers_cannot_make_a_favoured_peers_fetch_busy():
    """Red team 7: ids that open streams and send nothing filled the one shared cap, and every fetch of
    our packet, by our neighbour too, was answered busy. Strangers now share the cap, a favoured peer
    (a neighbour) is served outside it, and a stranger's silent stream is closed after
    STRANGER_REQUEST_TIMEOUT_S."""
    data = b"packet"
    d = packet_digest(data)

    async def main():
        stats: dict[str, int] = {}
        server = PacketServer("run", {d: data}.get, stats, StreamLimits(max_per_peer=2, max_open=4),
                              favoured=lambda peer: peer == "QmNeighbour")
        held = [await _pipe(server, f"QmSybil{i // 2}") for i in range(4)]  # 2 ids x 2 silent streams: the cap
        await asyncio.sleep(0.05)
        reader, writer, task = await _pipe(server, "QmStranger")  # another stranger: busy
        assert await asyncio.wait_for(_header(reader), 2) == {"status": "busy"}
        await task
        reader, writer, task = await _pipe(server, "QmNeighbour")  # the neighbour: served
        writer.write(encode_frame({"run_id": "run", "digest": d}))
        assert (await asyncio.wait_for(_header(reader), 2))["status"] == "ok" and await reader.readexactly(len(data)) == data
        writer.close()
        await task
        t0 = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(t for _, _, t in held)), 10)  # the silent streams are given up
        assert time.monotonic() - t0 < STRANGER_REQUEST_TIMEOUT_S + 1 and server.limits.open == {}
        assert server.limits.strangers == 0 and stats["serve_errors"] == 4

    asyncio.run(main())


def test_requests_a_stranger_never_reads_cannot_take_a_favoured_peers_upload():
    """Red team 8: 2 ids x 4 streams that ask for our packet and never read its answer held all
    MAX_CONCURRENT_UPLOADS slots for SERVE_TIMEOUT_S (120 s), and our neighbour's fetch was answered
    busy. A favoured peer's uploads are not counted there, and a stranger must read each chunk within
    STRANGER_CHUNK_S."""
    from swarm_node.net import fetch as fetch_module
    from swarm_node.net.records import MAX_CONCURRENT_UPLOADS

    data = os.urandom(4 << 20)
    d = packet_digest(data)

    async def main():
        server = PacketServer("run", {d: data}.get, {}, favoured=lambda peer: peer == "QmNeighbour")
        held = []
        for i in range(MAX_CONCURRENT_UPLOADS):
            held.append(await _pipe(server, f"QmSybil{i // 4}", buffer=4096))
            held[-1][1].write(encode_frame({"run_id": "run", "digest": d}))
        await asyncio.sleep(0.5)
        assert server.stranger_uploads == MAX_CONCURRENT_UPLOADS  # every stranger's slot is held by a reader that never reads
        reader, writer, task = await _pipe(server, "QmStranger")
        writer.write(encode_frame({"run_id": "run", "digest": d}))
        assert (await asyncio.wait_for(_header(reader), 2))["status"] == "busy"
        writer.close()
        await task
        reader, writer, task = await _pipe(server, "QmNeighbour")
        writer.write(encode_frame({"run_id": "run", "digest": d}))
        assert (await asyncio.wait_for(_header(reader), 2))["status"] == "ok"
        assert await asyncio.wait_for(reader.readexactly(len(data)), 10) == data
        writer.close()
        await task
        t0 = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(t for _, _, t in held)), fetch_module.STRANGER_CHUNK_S + 5)
        assert time.monotonic() - t0 < fetch_module.STRANGER_CHUNK_S + 2 and server.stranger_uploads == 0

    asyncio.run(main())

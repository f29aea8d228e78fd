"""Fetch protocol ("swarm_node.fetch.v1") over any asyncio byte stream, and the collect loop.

No hivemind here: ``swarm.py`` supplies libp2p streams (opened to an authenticated peer id) and
the DHT peer listing; this module only speaks the framing of protocol/SPEC.md (sections 11-12).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from .swarm_records import (
    CHUNK_BYTES, MAX_CONCURRENT_UPLOADS, REQUEST_TIMEOUT_S, SERVE_TIMEOUT_S, STATUS_BAD_REQUEST, STATUS_BUSY,
    STATUS_NOT_FOUND, STATUS_OK, FrameError, PeerInfo, Received, decode_frame_body, encode_frame, frame_length,
    is_digest, packet_digest,
)

logger = logging.getLogger(__name__)

# failure reasons besides the server's statuses
TIMEOUT, OVERSIZE, MISMATCH, ERROR = "timeout", "oversize", "mismatch", "error"


async def request_packet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, run_id: str, digest: str,
                         max_bytes: int) -> tuple[bytes | None, str]:
    """Client side of one fetch on an open stream: (data, "ok") or (None, reason). I/O errors raise;
    the caller bounds the whole call with its fetch timeout."""
    writer.write(encode_frame({"run_id": run_id, "digest": digest}))
    await writer.drain()
    header = decode_frame_body(await reader.readexactly(frame_length(await reader.readexactly(4))))
    status = header.get("status")
    if status != STATUS_OK:
        return None, status if status in (STATUS_NOT_FOUND, STATUS_BUSY, STATUS_BAD_REQUEST) else ERROR
    size = header.get("size")
    if type(size) is not int or not 0 <= size <= max_bytes:
        return None, OVERSIZE  # refused before allocating anything
    buf, pos = bytearray(size), 0
    with memoryview(buf) as view:
        while pos < size:
            chunk = await reader.read(min(CHUNK_BYTES, size - pos))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", size - pos)
            view[pos:pos + len(chunk)] = chunk
            pos += len(chunk)
    if packet_digest(buf) != digest:
        return None, MISMATCH
    return bytes(buf), STATUS_OK


class PacketServer:
    """Server side: answers one request per stream from ``lookup(digest) -> bytes | None``."""

    def __init__(self, run_id: str, lookup: Callable[[str], bytes | None], stats: dict[str, int]):
        self.run_id, self.lookup, self.stats = run_id, lookup, stats
        self.uploads = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object = None) -> None:
        try:
            await asyncio.wait_for(self._respond(reader, writer), SERVE_TIMEOUT_S)
        except Exception as e:
            self.stats["serve_errors"] = self.stats.get("serve_errors", 0) + 1
            logger.debug("serving %s failed: %r", peer, e)
        finally:
            writer.close()

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def reply(status: str, **extra) -> None:
            writer.write(encode_frame({"status": status, **extra}))
            await writer.drain()

        try:
            n = frame_length(await asyncio.wait_for(reader.readexactly(4), REQUEST_TIMEOUT_S))
            request = decode_frame_body(await asyncio.wait_for(reader.readexactly(n), REQUEST_TIMEOUT_S))
        except FrameError:
            return await reply(STATUS_BAD_REQUEST)
        digest, run_id = request.get("digest"), request.get("run_id")
        if not is_digest(digest) or not isinstance(run_id, str):
            return await reply(STATUS_BAD_REQUEST)
        data = self.lookup(digest) if run_id == self.run_id else None
        if data is None:
            self.stats["serve_not_found"] = self.stats.get("serve_not_found", 0) + 1
            return await reply(STATUS_NOT_FOUND)
        if self.uploads >= MAX_CONCURRENT_UPLOADS:
            return await reply(STATUS_BUSY)
        self.uploads += 1
        try:
            view = memoryview(data)
            await reply(STATUS_OK, size=len(view))
            for off in range(0, len(view), CHUNK_BYTES):
                writer.write(view[off:off + CHUNK_BYTES])
                await writer.drain()
            self.stats["bytes_out"] = self.stats.get("bytes_out", 0) + len(view)
            self.stats["packets_served"] = self.stats.get("packets_served", 0) + 1
        finally:
            self.uploads -= 1


async def collect_offers(
    list_peers: Callable[[float], Awaitable[list[PeerInfo]]],
    fetch: Callable[[str, str, float], Awaitable[tuple[bytes | None, str]]],
    *, wanted: Callable[[int], bool], keep: Callable[[PeerInfo], bool], skip: Callable[[str, str], bool],
    seen: set[str], min_packets: int, deadline_s: float, poll_s: float, fetch_timeout_s: float,
    max_packet_bytes: int, max_parallel: int = 4, lookup_timeout_s: float = 10.0,
) -> list[Received]:
    """Poll ``list_peers``, fetch offered packets of wanted rounds not in ``seen`` (adding the digests of
    received ones), until ``min_packets`` new packets arrived (one pass if <= 0) or the deadline passed.
    Every wait is clamped to the deadline. ``skip(peer, digest)`` excludes known-bad offers."""
    loop = asyncio.get_running_loop()
    t_end = loop.time() + max(0.0, deadline_s)
    received: list[Received] = []
    retry_at: dict[tuple[str, str], float] = {}
    backoff = {STATUS_BUSY: 0.5, STATUS_NOT_FOUND: 2.0}
    sem = asyncio.Semaphore(max_parallel)

    async def job(peer: str, digest: str) -> tuple[bytes | None, str]:
        async with sem:
            remaining = t_end - loop.time()
            if remaining <= 0:
                return None, TIMEOUT
            return await fetch(peer, digest, min(fetch_timeout_s, remaining))

    while t_end - loop.time() > 0:
        jobs: dict[str, tuple[str, int]] = {}  # digest -> (peer, round); first offering peer wins this pass
        now = loop.time()
        for info in await list_peers(min(lookup_timeout_s, max(0.05, t_end - now))):
            if not keep(info):
                continue
            for r, d, size in info.offers:
                if (d in seen or d in jobs or size > max_packet_bytes or not wanted(r) or skip(info.peer_id, d)
                        or retry_at.get((info.peer_id, d), 0.0) > now):
                    continue
                jobs[d] = (info.peer_id, r)
        pending = {loop.create_task(job(peer, d)): (d, peer, r) for d, (peer, r) in jobs.items()}
        try:
            while pending and (min_packets <= 0 or len(received) < min_packets):
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    d, peer, r = pending.pop(task)
                    data, reason = task.result()
                    if data is not None and d not in seen:
                        seen.add(d)
                        received.append(Received(peer_id=peer, round=r, digest=d, data=data))
                    elif data is None:
                        retry_at[(peer, d)] = loop.time() + backoff.get(reason, fetch_timeout_s)
        finally:
            for task in pending:
                task.cancel()
        if len(received) >= min_packets:
            break
        if not jobs:
            await asyncio.sleep(max(0.0, min(poll_s, t_end - loop.time())))
    return received

"""Fetch protocol ("swarm_node.fetch.v1") over any asyncio byte stream: client and server.

No hivemind here: `hivemind.py` supplies libp2p streams (opened to an authenticated peer id);
this module only speaks the framing of protocol/SPEC.md (sections 11-12). One request per
stream: the client sends {run_id, digest}, the server answers a header {status, size} and then
`size` bytes of packet body, which the client checks against the digest.

The server bounds what streams can cost it (docs/RELIABILITY.md, issue 18 point 5): at most
`MAX_STREAMS_PER_PEER` open streams per peer and `MAX_OPEN_STREAMS` in all; a stream beyond either
is answered "busy" and closed at once, so held-open streams cannot exhaust file descriptors (each
stream is one socket from p2pd to this process). `raise_fd_limit` lifts the soft RLIMIT_NOFILE to
the hard limit; the transport calls it before p2pd starts (p2pd inherits the limit).
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable

from swarm_node import codec
from swarm_node.net.records import (
    CHUNK_BYTES, MAX_CONCURRENT_UPLOADS, REQUEST_TIMEOUT_S, SERVE_TIMEOUT_S, STATUS_BAD_REQUEST, STATUS_BUSY,
    STATUS_NOT_FOUND, STATUS_OK, FrameError, decode_frame_body, encode_frame, frame_length, is_digest,
)

logger = logging.getLogger(__name__)

# failure reasons besides the server's statuses
TIMEOUT, OVERSIZE, MISMATCH, ERROR = "timeout", "oversize", "mismatch", "error"
MAX_STREAMS_PER_PEER = 4  # open fetch streams one peer may hold at once (an honest one uses 1)
MAX_OPEN_STREAMS = 256  # open fetch streams in all
NOFILE_IF_UNLIMITED = 1 << 20  # soft open-files limit raise_fd_limit sets when the hard limit is unlimited


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
    if codec.digest(buf) != digest:
        return None, MISMATCH
    return bytes(buf), STATUS_OK


class StreamLimits:
    """Open inbound streams, at most `max_per_peer` per peer and `max_open` in all. One instance may
    be shared by the handlers of several protocols, so their streams count together."""

    def __init__(self, max_per_peer: int = MAX_STREAMS_PER_PEER, max_open: int = MAX_OPEN_STREAMS):
        self.max_per_peer, self.max_open = max_per_peer, max_open
        self.open: Counter = Counter()  # peer -> open streams

    def admit(self, peer: object) -> bool:
        """Count a new stream of `peer`, or say False (over a limit): then answer busy and close it."""
        if self.open[peer] >= self.max_per_peer or self.open.total() >= self.max_open:
            return False
        self.open[peer] += 1
        return True

    def release(self, peer: object) -> None:
        self.open[peer] -= 1
        if self.open[peer] <= 0:
            del self.open[peer]


def refuse_stream(writer: asyncio.StreamWriter, frame: bytes) -> None:
    """Answer `frame` without reading the request, and close: the socket is released at once."""
    try:
        writer.write(frame)
    except Exception:  # already closed by the peer: nothing to answer
        pass
    writer.close()


class PacketServer:
    """Server side: answers one request per stream from ``lookup(digest) -> bytes | None``; streams
    beyond `limits` (per peer, in all) are answered busy at once."""

    def __init__(self, run_id: str, lookup: Callable[[str], bytes | None], stats: dict[str, int],
                 limits: StreamLimits | None = None):
        self.run_id, self.lookup, self.stats = run_id, lookup, stats
        self.limits = limits if limits is not None else StreamLimits()
        self.uploads = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object = None) -> None:
        if not self.limits.admit(peer):
            self.stats["serve_refused"] = self.stats.get("serve_refused", 0) + 1
            return refuse_stream(writer, encode_frame({"status": STATUS_BUSY}))
        try:
            await asyncio.wait_for(self._respond(reader, writer), SERVE_TIMEOUT_S)
        except Exception as e:
            self.stats["serve_errors"] = self.stats.get("serve_errors", 0) + 1
            logger.debug("serving %s failed: %r", peer, e)
        finally:
            writer.close()
            self.limits.release(peer)

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


class Offers:
    """The packets a node serves: digest -> (round, bytes), only the newest `keep` of them."""

    def __init__(self, keep: int):
        self.keep = keep
        self._packets: OrderedDict[str, tuple[int, bytes]] = OrderedDict()

    def add(self, round: int, digest: str, data: bytes) -> None:
        self._packets[digest] = (round, data)
        self._packets.move_to_end(digest)
        while len(self._packets) > self.keep:
            self._packets.popitem(last=False)

    def get(self, digest: str) -> bytes | None:
        entry = self._packets.get(digest)
        return entry[1] if entry is not None else None

    def announced(self) -> list[tuple[int, str, int]]:
        """(round, digest, size) of each packet served, oldest first: what a record lists."""
        return [(r, d, len(data)) for d, (r, data) in self._packets.items()]


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit where allowed, and return (soft, hard) as they
    are afterwards. Call it before p2pd starts: the daemon inherits the limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else NOFILE_IF_UNLIMITED
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:  # e.g. above the kernel's nr_open
        logger.debug("could not raise the open-files limit from %d to %d: %r", soft, target, e)
        return soft, hard
    return target, hard

"""Fetch protocol ("/swarm-node/fetch/1.0.0", legacy "swarm_node.fetch.v1") over any asyncio byte stream.

No hivemind here: `hivemind.py` supplies libp2p streams (opened to an authenticated peer id);
this module only speaks the framing of protocol/SPEC.md (sections 11-12). One request per
stream: the client sends {run_id, digest, offset}, the server answers a header {status, size,
offset} and then the packet body from `offset` on; the client checks the whole against the digest.
A download cut mid-body (a relay's budget ran out) resumes on a new stream where it stopped.

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
from collections.abc import Awaitable, Callable

from swarm_node.net.records import (CHUNK_BYTES, MAX_CONCURRENT_UPLOADS, REQUEST_TIMEOUT_S, SERVE_TIMEOUT_S,
                                    STATUS_BAD_REQUEST, STATUS_BUSY, STATUS_NOT_FOUND, STATUS_OK, FrameError,
                                    encode_frame, is_digest, read_frame)
from swarm_node.net.scores import PeerLimiter
from swarm_node.wire import codec

logger = logging.getLogger(__name__)

# failure reasons besides the server's statuses
TIMEOUT, OVERSIZE, MISMATCH, ERROR = "timeout", "oversize", "mismatch", "error"
MAX_STREAMS_PER_PEER = 4  # open fetch streams one peer may hold at once (an honest one uses 1)
MAX_OPEN_STREAMS = 256  # open fetch streams in all of peers we do not favour (`StreamLimits`)
STRANGER_REQUEST_TIMEOUT_S = 2.0  # their request frame must arrive this soon after the stream opens
STRANGER_CHUNK_S = 10.0  # ... and each 1 MiB chunk of our answer must be read within this (100 KiB/s at least)
MIN_RESUME_BYTES = 16 << 10  # a stream cut mid-body that brought less than this is "short"
MAX_SHORT_STREAMS = 3  # consecutive short streams that end a download (a relayed connection other
#                        streams had nearly used up brings little once; a peer that always cuts early, every time)
NOFILE_IF_UNLIMITED = 1 << 20  # soft open-files limit raise_fd_limit sets when the hard limit is unlimited


class Download:
    """Client side: one packet arriving over one or more streams. A stream cut mid-body keeps the
    bytes received so far, and the next `request` on a new stream asks only for the rest (`offset`).
    Relayed libp2p connections need this: the relays in hivemind's p2pd usually reset a relayed
    connection after 128 KiB per direction, whatever their flags say (protocol/SPEC.md 12.1)."""

    def __init__(self, run_id: str, digest: str, max_bytes: int):
        self.run_id, self.digest, self.max_bytes = run_id, digest, max_bytes
        self.buf: bytearray | None = None  # the packet, allocated once its size is known
        self.received = 0  # bytes of `buf` filled, from the start
        self.resumes = 0  # streams opened after a cut

    async def request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[bytes | None, str]:
        """One stream's worth: (data, "ok") once complete, (None, reason) on a refusal. A stream cut
        mid-body raises (the caller bounds the whole download with its fetch timeout) and keeps the
        progress for the next call."""
        writer.write(encode_frame({"run_id": self.run_id, "digest": self.digest, "offset": self.received}))
        await writer.drain()
        header = await read_frame(reader)
        status = header.get("status")
        if status != STATUS_OK:
            return None, status if status in (STATUS_NOT_FOUND, STATUS_BUSY, STATUS_BAD_REQUEST) else ERROR
        size, offset = header.get("size"), header.get("offset", 0)  # a server without resume sends it all
        if type(size) is not int or not 0 <= size <= self.max_bytes:
            return None, OVERSIZE  # refused before allocating anything
        if self.buf is not None and size != len(self.buf):
            return None, MISMATCH  # the same digest cannot have two sizes
        if type(offset) is not int or not 0 <= offset <= self.received:
            return None, ERROR  # bytes we never asked to skip
        if self.buf is None:
            self.buf = bytearray(size)
        self.received = offset
        with memoryview(self.buf) as view:
            while self.received < size:
                chunk = await reader.read(min(CHUNK_BYTES, size - self.received))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", size - self.received)
                view[self.received:self.received + len(chunk)] = chunk
                self.received += len(chunk)
        if codec.digest(self.buf) != self.digest:
            return None, MISMATCH
        return bytes(self.buf), STATUS_OK


async def download_packet(open_stream: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
                          download: Download) -> tuple[bytes | None, str]:
    """`download` to its end over streams from `open_stream()`: a stream cut mid-body is followed by a
    new one asking for the rest, until `MAX_SHORT_STREAMS` streams in a row each brought less than
    `MIN_RESUME_BYTES` (a peer that cuts early ends its download; a relay's 128 KiB budget brings
    ~100 KiB per stream). I/O errors raise; the caller bounds the whole with its fetch timeout."""
    short = 0
    while True:
        reader, writer = await open_stream()
        before = download.received
        try:
            return await download.request(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            short = short + 1 if download.received - before < MIN_RESUME_BYTES else 0
            if short >= MAX_SHORT_STREAMS:
                raise
            download.resumes += 1
        finally:
            writer.close()


class StreamLimits:
    """Open inbound streams, at most `max_per_peer` per peer, and `max_open` in all of peers we do not
    favour (neighbours and initial peers are not counted there: 64 cheap ids holding 4 silent streams
    each filled one shared cap, and every fetch of an honest packet was answered busy; red team 7).
    One instance may be shared by the handlers of several protocols, so their streams count together
    (announcements have their own: `PushDiscovery.serving`, one per peer)."""

    def __init__(self, max_per_peer: int = MAX_STREAMS_PER_PEER, max_open: int = MAX_OPEN_STREAMS):
        self.max_per_peer, self.max_open = max_per_peer, max_open
        self.open: Counter = Counter()  # peer -> open streams
        self.strangers = 0  # open streams of peers we do not favour

    def admit(self, peer: object, favoured: bool = False) -> bool:
        """Count a new stream of `peer`, or say False (over a limit): then answer busy and close it."""
        if self.open[peer] >= self.max_per_peer or not favoured and self.strangers >= self.max_open:
            return False
        self.open[peer] += 1
        self.strangers += not favoured
        return True

    def release(self, peer: object, favoured: bool = False) -> None:
        self.open[peer] -= 1
        self.strangers -= not favoured
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
    beyond `limits` (per peer, in all of those we do not favour) are answered busy at once; a stream
    over its peer's rate (`rates`, scores.PeerLimiter) is closed before anything is read.
    `favoured(peer)` (our neighbours, configured peers, anchors): served outside the strangers' caps on
    streams and uploads, with REQUEST_TIMEOUT_S for its request (an honest fetcher writes it as the
    stream opens) and no deadline per chunk but SERVE_TIMEOUT_S for the whole answer (`_respond`)."""

    def __init__(self, run_id: str, lookup: Callable[[str], bytes | None], stats: dict[str, int],
                 limits: StreamLimits | None = None, rates: PeerLimiter | None = None,
                 favoured: Callable[[str], bool] = lambda peer: False):
        self.run_id, self.lookup, self.stats, self.rates, self.favoured = run_id, lookup, stats, rates, favoured
        self.limits = limits if limits is not None else StreamLimits()
        self.stranger_uploads = 0  # answers being written to peers we do not favour

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object = None) -> None:
        if self.rates is not None and not self.rates.allow(str(peer), "fetch"):  # counted by the limiter
            writer.close()
            return
        favoured = self.favoured(str(peer))
        if not self.limits.admit(peer, favoured):
            self.stats["serve_refused"] = self.stats.get("serve_refused", 0) + 1
            return refuse_stream(writer, encode_frame({"status": STATUS_BUSY}))
        try:
            await asyncio.wait_for(self._respond(reader, writer, favoured), SERVE_TIMEOUT_S)
        except Exception as e:
            self.stats["serve_errors"] = self.stats.get("serve_errors", 0) + 1
            logger.debug("serving %s failed: %r", peer, e)
        finally:
            writer.close()
            self.limits.release(peer, favoured)

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, favoured: bool) -> None:
        """One request of a peer we favour or not: a stranger has STRANGER_REQUEST_TIMEOUT_S to ask, takes one
        of MAX_CONCURRENT_UPLOADS, and must read each chunk within STRANGER_CHUNK_S (red team 8: 8 requests
        never read held every upload slot for 120 s, and our neighbour's fetch was answered busy)."""
        async def reply(status: str, **extra) -> None:
            writer.write(encode_frame({"status": status, **extra}))
            await writer.drain()

        try:
            request = await asyncio.wait_for(read_frame(reader), REQUEST_TIMEOUT_S if favoured else
                                             STRANGER_REQUEST_TIMEOUT_S)
        except FrameError:
            return await reply(STATUS_BAD_REQUEST)
        digest, run_id, offset = request.get("digest"), request.get("run_id"), request.get("offset", 0)
        if not is_digest(digest) or not isinstance(run_id, str) or type(offset) is not int or offset < 0:
            return await reply(STATUS_BAD_REQUEST)
        data = self.lookup(digest) if run_id == self.run_id else None
        if data is None:
            self.stats["serve_not_found"] = self.stats.get("serve_not_found", 0) + 1
            return await reply(STATUS_NOT_FOUND)
        if offset > len(data):
            return await reply(STATUS_BAD_REQUEST)
        if not favoured and self.stranger_uploads >= MAX_CONCURRENT_UPLOADS:
            return await reply(STATUS_BUSY)
        self.stranger_uploads += not favoured  # a favoured peer's are bounded by its streams (StreamLimits.max_per_peer)
        try:
            view = memoryview(data)
            await reply(STATUS_OK, size=len(view), offset=offset)
            for off in range(offset, len(view), CHUNK_BYTES):
                writer.write(view[off:off + CHUNK_BYTES])
                await asyncio.wait_for(writer.drain(), None if favoured else STRANGER_CHUNK_S)
            self.stats["bytes_out"] = self.stats.get("bytes_out", 0) + len(view) - offset
            self.stats["packets_served"] = self.stats.get("packets_served", 0) + 1  # to its end
        finally:
            self.stranger_uploads -= not favoured


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

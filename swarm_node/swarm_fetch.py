"""Fetch protocol ("swarm_node.fetch.v1") over any asyncio byte stream, and the collect loop.

No hivemind here: ``swarm.py`` supplies libp2p streams (opened to an authenticated peer id) and
the DHT peer listing; this module only speaks the framing of protocol/SPEC.md (sections 11-12).
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
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
    max_peer_packets: int = 4, max_peer_bytes: int = 32 * 2**20,
    taken: dict[tuple[str, int], str] | None = None, dropped: Counter | None = None,
    counted: set[tuple[str, str, str]] | None = None, count_peers: bool = False, newest: int | None = None,
) -> list[Received]:
    """Poll ``list_peers``, fetch offered packets of wanted rounds not in ``seen`` (adding the digests of
    received ones), until ``min_packets`` new packets arrived (one pass if <= 0) or the deadline passed.
    With ``count_peers``, ``min_packets`` counts distinct peers instead (a fast peer cannot fill the quota
    alone). Every wait is clamped to the deadline. ``skip(peer, digest)`` excludes known-bad offers.
    ``newest``: the newest round wanted; when every peer is already past it and offers nothing wanted
    that is still unseen, nothing useful can come, so the call returns without waiting for the deadline
    (a node that fell behind, e.g. after a restart, catches up instead of waiting every round).

    Per-peer limits (a hostile peer gets no more than an honest one; see docs/RELIABILITY.md):

    * one fetch in flight per peer, so a stalling peer holds at most one of the ``max_parallel`` slots;
    * one packet per (peer, round), ever: ``taken`` maps (peer, round) -> the digest fetched for it
      (persistent across calls when the caller passes it); another digest offered for that round
      by that peer is never fetched (``duplicate_round``);
    * within this call at most ``max_peer_packets`` packets and ``max_peer_bytes`` declared bytes per
      peer (``flood`` / ``too_many_bytes``); an attempt counts unless the peer refused it
      (not_found, busy) or it failed in transit (timeout, error);
    * offers declaring more than ``max_packet_bytes`` are never fetched (``oversize``); a peer that
      serves bytes not matching the digest or more than it declared is counted (``digest_mismatch``,
      ``oversize``) and, by the caller's ``skip``, never asked for that digest again.

    Dropped offers are counted in ``dropped`` (reason -> count): an offer left unfetched at the end of
    the call for a budget reason once per call, the others once per (peer, digest, reason) in
    ``counted`` (persistent when the caller passes it)."""
    loop = asyncio.get_running_loop()
    t_end = loop.time() + max(0.0, deadline_s)
    received: list[Received] = []
    retry_at: dict[tuple[str, str], float] = {}
    backoff = {STATUS_BUSY: 0.5, STATUS_NOT_FOUND: 2.0}
    sem = asyncio.Semaphore(max_parallel)
    peer_sems: dict[str, asyncio.Semaphore] = {}
    taken = {} if taken is None else taken
    dropped = Counter() if dropped is None else dropped
    counted = set() if counted is None else counted
    deferred: dict[tuple[str, str], str] = {}  # (peer, digest) -> budget reason, if still unfetched at the end
    used: Counter[str] = Counter()  # packets per peer in this call (in flight or counted)
    used_bytes: Counter[str] = Counter()  # declared bytes per peer in this call

    def enough() -> bool:
        return (len({x.peer_id for x in received}) if count_peers else len(received)) >= min_packets

    def drop(peer: str, digest: str, reason: str) -> None:
        deferred.pop((peer, digest), None)
        if (peer, digest, reason) not in counted:
            counted.add((peer, digest, reason))
            dropped[reason] += 1

    async def job(peer: str, digest: str) -> tuple[bytes | None, str]:
        async with peer_sems.setdefault(peer, asyncio.Semaphore(1)), sem:
            remaining = t_end - loop.time()
            if remaining <= 0:
                return None, TIMEOUT
            return await fetch(peer, digest, min(fetch_timeout_s, remaining))

    while t_end - loop.time() > 0:
        jobs: dict[str, tuple[str, int, int]] = {}  # digest -> (peer, round, size); first offering peer wins this pass
        rounds_in_flight: set[tuple[str, int]] = set()
        now = loop.time()
        peers = [info for info in await list_peers(min(lookup_timeout_s, max(0.05, t_end - now))) if keep(info)]
        for info in peers:
            peer = info.peer_id
            for r, d, size in info.offers:
                if (d in seen or d in jobs or not wanted(r) or skip(peer, d)
                        or retry_at.get((peer, d), 0.0) > now or (peer, r) in rounds_in_flight):
                    continue
                if size > max_packet_bytes:
                    drop(peer, d, OVERSIZE)
                elif taken.get((peer, r), d) != d:
                    drop(peer, d, "duplicate_round")
                elif used[peer] >= max_peer_packets:
                    deferred[(peer, d)] = "flood"
                elif used_bytes[peer] + size > max_peer_bytes:
                    deferred[(peer, d)] = "too_many_bytes"
                else:
                    deferred.pop((peer, d), None)
                    jobs[d] = (peer, r, size)
                    rounds_in_flight.add((peer, r))
                    used[peer] += 1
                    used_bytes[peer] += size
        pending = {loop.create_task(job(peer, d)): (d, peer, r, size) for d, (peer, r, size) in jobs.items()}
        try:
            while pending and (min_packets <= 0 or not enough()):
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    d, peer, r, size = pending.pop(task)
                    data, reason = task.result()
                    if data is not None:
                        taken.setdefault((peer, r), d)
                        if d not in seen:
                            seen.add(d)
                            received.append(Received(peer_id=peer, round=r, digest=d, data=data))
                        continue
                    if reason in (MISMATCH, OVERSIZE):
                        drop(peer, d, "digest_mismatch" if reason == MISMATCH else OVERSIZE)
                    else:  # refused or failed in transit: does not use up the peer's budget
                        used[peer] -= 1
                        used_bytes[peer] -= size
                    retry_at[(peer, d)] = loop.time() + backoff.get(reason, fetch_timeout_s)
        finally:
            for task in pending:
                task.cancel()
            for d, peer, r, size in pending.values():  # cancelled: not received, budget returned
                used[peer] -= 1
                used_bytes[peer] -= size
        if enough():
            break
        if not jobs and newest is not None and peers and not any(
                info.round <= newest or any(wanted(r) and d not in seen and not skip(info.peer_id, d)
                                            for r, d, _ in info.offers) for info in peers):
            break
        if not jobs:
            await asyncio.sleep(max(0.0, min(poll_s, t_end - loop.time())))
    got = {item.digest for item in received}
    dropped.update(reason for (_, d), reason in deferred.items() if d not in got)
    return received

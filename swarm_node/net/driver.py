"""The background work of a networked node's announcement mesh (`announce.Mesh`; protocol/SPEC.md section 11).

`MeshDriver` runs a Mesh on an event loop: pushes our announcement to every neighbor on offer
(rate-limited and coalesced), keeps neighbors alive, prunes and evicts what the node measured as
idle (`scores.py`), dials candidates while short of neighbors or of outbound ones (and, starving, its
initial peers and the peers that offered packets, full or not), and reads DHT membership when out of
candidates. The stream side is the transport's (`discovery.PushDiscovery`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from swarm_node.net.announce import MAX_KNOWN, Mesh
from swarm_node.net.records import ANNOUNCE_PROTOCOL

logger = logging.getLogger(__name__)

MIN_PUSH_INTERVAL_S = 0.5  # pushes to one neighbor at most this often; changes in between coalesce into one
LEAVE_TIMEOUT_S = 2.0  # a leaving node tells its neighbors within this, then goes


class OldVersion(Exception):
    """The peer does not accept the announcement protocol: an older swarm-node, or one shielded against a flood
    (`lanes.py`)."""

    protocol = ANNOUNCE_PROTOCOL


# (peer, addrs, our announcement) -> (reply, the remote address of the connection, None if unknown); raises on failure
Contact = Callable[[str, list[str], dict], Awaitable[tuple[dict, str | None]]]
ReadMembers = Callable[[], Awaitable[list[tuple[str, list[str]]]]]


class MeshDriver:
    """Runs a Mesh on an event loop: pushes our announcement to every neighbor when `push` is called,
    keeps neighbors alive, and dials candidates while short of neighbors. `contact` raises
    `OldVersion` when the peer does not speak discovery v2, any other exception when unreachable."""

    TICK_S = 1.0  # maintenance period
    MEMBER_READ_S = 30.0  # DHT membership is read at most this often, and only when out of candidates;
    MAX_MEMBER_READ_S = 600.0  # a read that brings no new peer doubles the wait, up to this

    def __init__(self, mesh: Mesh, contact: Contact, read_members: ReadMembers | None = None,
                 clock: Callable[[], float] = time.time):
        self.mesh, self.contact, self.read_members, self.clock = mesh, contact, read_members, clock
        self.in_flight: dict[str, asyncio.Task] = {}
        self.again: set[str] = set()  # neighbors to push to once their exchange in flight ends
        self.pushed_at: dict[str, float] = {}  # neighbor -> loop time of our last push to it
        self.deferred: set[str] = set()  # neighbors with a push scheduled (MIN_PUSH_INTERVAL_S)
        self.old_version: OrderedDict[str, None] = OrderedDict()  # peers that do not speak discovery v2 (logged once)
        self.last_member_read, self.member_read_s = -math.inf, self.MEMBER_READ_S

    def push(self) -> None:
        """Send our (new) announcement to every neighbor, in the background, at most once per
        MIN_PUSH_INTERVAL_S per neighbor: a push sooner than that is scheduled for when the interval
        ends and then sends the newest announcement, so fast rounds cannot flood a neighbor."""
        loop = asyncio.get_running_loop()
        for peer in list(self.mesh.neighbors):
            if peer in self.deferred:
                continue  # already scheduled: it will carry this announcement too
            wait = self.pushed_at.get(peer, -math.inf) + MIN_PUSH_INTERVAL_S - loop.time()
            if wait > 0:
                self.deferred.add(peer)
                loop.call_later(wait, self._push_deferred, peer)
            else:
                self._push_now(peer)

    def _push_now(self, peer: str) -> None:
        if len(self.pushed_at) > 4 * MAX_KNOWN:
            self.pushed_at = {p: t for p, t in self.pushed_at.items() if p in self.mesh.neighbors}
        self.pushed_at[peer] = asyncio.get_running_loop().time()
        self._start(peer, self.mesh.neighbors[peer].addrs)

    def _push_deferred(self, peer: str) -> None:
        self.deferred.discard(peer)
        if peer in self.mesh.neighbors:
            self._push_now(peer)

    def _start(self, peer: str, addrs: list[str]) -> None:
        if peer in self.in_flight:
            self.again.add(peer)
            return
        self.in_flight[peer] = asyncio.get_running_loop().create_task(self._exchange(peer, addrs))

    async def _exchange(self, peer: str, addrs: list[str]) -> None:
        try:
            mesh = self.mesh
            if peer in mesh.neighbors:
                mesh.neighbors[peer].sent_at = self.clock()
            try:
                reply, addr = await self.contact(peer, addrs, mesh.announcement(to=peer))
            except OldVersion:
                if peer not in self.old_version:
                    logger.warning("peer %s does not accept %s: it runs an older swarm-node (discovery v1), "
                                   "which cannot exchange with this one (upgrade it), or it refuses strangers for a "
                                   "while against a flood (it is tried again later)", peer, OldVersion.protocol)
                self.old_version[peer] = None
                while len(self.old_version) > MAX_KNOWN:  # any id may claim an old version: the latest are enough
                    self.old_version.popitem(last=False)
                mesh.on_failure(peer, self.clock(), old_version=True)
            except Exception as e:
                logger.debug("announcement to %s failed: %r", peer, e)
                mesh.on_failure(peer, self.clock())
            else:
                mesh.on_reply(peer, reply, self.clock(), addr)
        finally:
            self.in_flight.pop(peer, None)
        if peer in self.again:  # discarded either way: a neighbour dropped meanwhile must not stay in it
            self.again.discard(peer)
            if peer in self.mesh.neighbors:
                self._start(peer, self.mesh.neighbors[peer].addrs)

    async def tick(self) -> None:
        """One maintenance step: expire, keepalive, dial candidates when short, read membership."""
        mesh, now = self.mesh, self.clock()
        mesh.expire(now)
        pruned = mesh.prune(now)  # benched like the evicted: a slot's end must be readable from the log alone
        if pruned:
            logger.info("%d idle neighbor(s) pruned over D = %d: %s", len(pruned), mesh.params.degree, ", ".join(pruned))
        mesh.evict(now)
        for peer in [p for p, n in mesh.neighbors.items() if n.sent_at < now - mesh.params.ttl_s / 3]:  # keepalive
            self._start(peer, mesh.neighbors[peer].addrs)
        for peer, addrs in mesh.rescue(now, busy=set(self.in_flight)):  # eclipsed: dial out even when full
            self._start(peer, addrs)
        if not mesh.short():
            return
        need = mesh.dials_wanted() - sum(p not in mesh.neighbors for p in self.in_flight)
        found = mesh.candidates(need, now, busy=set(self.in_flight)) if need > 0 else []
        for peer, addrs in found:
            self._start(peer, addrs)
        if need > 0 and not found and self.read_members is not None and now - self.last_member_read >= self.member_read_s:
            self.last_member_read = now
            try:
                members = await self.read_members()
            except Exception as e:
                logger.debug("membership read failed: %r", e)
                members = []
            new = [m for m in members if m[0] not in mesh.known and m[0] != mesh.own_id]
            mesh.learn(members)
            # a small swarm stays short of D neighbors forever: stop asking the DHT every 30 s
            self.member_read_s = self.MEMBER_READ_S if new else min(self.MAX_MEMBER_READ_S, 2 * self.member_read_s)

    async def run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.TICK_S)

    async def leave(self) -> None:
        """Tell every neighbor we leave (`leaving: true`), all at once, within LEAVE_TIMEOUT_S."""
        async def tell(peer: str, addrs: list[str]) -> None:
            try:
                await self.contact(peer, addrs, self.mesh.leaving(peer))
            except Exception as e:  # a courtesy: it drops us after ttl_s anyway
                logger.debug("leave announcement to %s failed: %r", peer, e)

        tasks = [asyncio.ensure_future(tell(p, n.addrs)) for p, n in list(self.mesh.neighbors.items())]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=LEAVE_TIMEOUT_S)
            for t in late:
                t.cancel()

    async def close(self) -> None:
        tasks = list(self.in_flight.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2)

"""Connection tags: p2pd's connection manager closes strangers' connections before a neighbour's (issue 27).

p2pd's connection manager (go-libp2p v0.32's, at p2pd's defaults: low 256, high 512, a 2-minute grace) looks
every 10 s and, once `high` connections or more are open, closes connections down to `low`: whole peers, in
order, among those neither protected nor first seen within the grace; it closes nothing if fewer than `low`
connections are past the grace. The order: by value (the sum of a peer's tags), then peers with no stream
open, then inbound before outbound. A stranger is worth 0; go-libp2p gives some peers a little (a relay's
reservation 10, a relayed stream 5, its Kademlia table's peers 5, and protects the nearest of those outright:
every hivemind node runs p2pd's DHT server, a table an attacker's own DHT servers can fill). Red team 26 held
1,000 connections to a node: one trim closed 745, very probably one of them a neighbour's.

Each neighbour is tagged NEIGHBOUR_WEIGHT while it holds its slot (`PushDiscovery`'s lane loop calls `keep`
every second). p2pd forgets a peer's tags when its last connection closes, and drops a tag set while it has
none, so the tag is sent again every TAG_REFRESH_S (a neighbour that reconnected is worth 100 again within
that). The bound: a neighbour's connection is closed by a trim only when more than `low` unprotected
connections past the grace belong to peers worth as much (we tag only our D + 2 neighbours), or within
TAG_REFRESH_S of a reconnect. `tests/test_net_conn_tags.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from hivemind.p2p import P2P, PeerID
from hivemind.proto import p2pd_pb2

from swarm_node.net.hivemind_internals import conn_manager

logger = logging.getLogger(__name__)

NEIGHBOUR_TAG = "swarm-node/neighbour"
NEIGHBOUR_WEIGHT = 100  # above what go-libp2p gives on its own (a relay reservation: 10)
TAG_REFRESH_S = 10.0  # a tag is sent again this often (p2pd dropped it if the peer reconnected meanwhile)
TAG_PEER, UNTAG_PEER = p2pd_pb2.ConnManagerRequest.TAG_PEER, p2pd_pb2.ConnManagerRequest.UNTAG_PEER


class ConnTags:
    """Which peers carry our tag in p2pd's connection manager, kept equal to a wanted set."""

    def __init__(self, p2p: P2P, clock: Callable[[], float] = time.monotonic):
        self.p2p, self.clock = p2p, clock
        self.tagged: dict[str, float] = {}  # peer -> when we last tagged it (a failed request is tried again next time)

    async def keep(self, wanted: set[str]) -> None:
        """Untag the peers not in `wanted`, then tag those in it not tagged within TAG_REFRESH_S; one request each,
        a failure logged and left for the next call."""
        now = self.clock()
        for peer in sorted(set(self.tagged) - wanted):
            if await self._request(UNTAG_PEER, peer):
                del self.tagged[peer]
        for peer in sorted(p for p in wanted if now - self.tagged.get(p, -TAG_REFRESH_S) >= TAG_REFRESH_S):
            if await self._request(TAG_PEER, peer, NEIGHBOUR_WEIGHT):
                self.tagged[peer] = now

    async def _request(self, kind: int, peer: str, weight: int | None = None) -> bool:
        try:
            await conn_manager(self.p2p, kind, PeerID.from_base58(peer), NEIGHBOUR_TAG, weight)
            return True
        except Exception as e:  # p2pd gone (closing) or busy: the next call tries again
            logger.warning("cannot %s %s in p2pd's connection manager: %r", "tag" if weight else "untag", peer, e)
            return False

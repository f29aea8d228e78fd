"""Connection tags: p2pd's connection manager closes strangers' connections before a neighbour's (issue 27).

p2pd (go-libp2p's connection manager, hivemind starts it at low 256, high 512, a 2-minute grace) trims
the connections of as many peers as it takes to get back to `low` once more than `high` are open,
the peers of lowest value first, skipping those first seen within the grace. A peer's value is the
sum of its tags, 0 for a stranger. Peers that run p2pd's own DHT server (every hivemind node does) were
seldom trimmed in our runs (go-libp2p's Kademlia tags the peers of its table, up to 20 a bucket, which
an attacker's own DHT servers compete for); a client without it, as red team 26's was, always is.
Red team 26 held 1,000 connections to a node: one trim closed 745, very
probably one of them a neighbour's. Among peers of equal value p2pd closes inbound ones first, so a
neighbour that dialled us went before attackers we had dialled (`tests/test_net_conn_tags.py`).

Each neighbour is tagged NEIGHBOUR_WEIGHT while it holds its slot (set by `PushDiscovery`'s lane loop
every second): a trim closes every untagged peer past the grace before any neighbour. The bound: a
neighbour's connection is closed by a trim only when more than `low` peers past the grace are worth as
much (our D + 2 neighbours are the only ones we tag).
"""

from __future__ import annotations

from hivemind.p2p import P2P, PeerID
from hivemind.proto import p2pd_pb2

from swarm_node.net.hivemind_internals import conn_manager

NEIGHBOUR_TAG = "swarm-node/neighbour"
NEIGHBOUR_WEIGHT = 100  # above what p2pd gives on its own (go-libp2p's Kademlia tags its table's peers 5)
TAG_PEER, UNTAG_PEER, TRIM = (p2pd_pb2.ConnManagerRequest.TAG_PEER, p2pd_pb2.ConnManagerRequest.UNTAG_PEER,
                              p2pd_pb2.ConnManagerRequest.TRIM)


class ConnTags:
    """Which peers carry our tag in p2pd's connection manager, kept equal to a wanted set."""

    def __init__(self, p2p: P2P):
        self.p2p = p2p
        self.tagged: set[str] = set()  # as p2pd has them (a failed request is tried again next time)

    async def keep(self, wanted: set[str]) -> None:
        """Tag the peers in `wanted` and untag the others; one request per change."""
        for peer in sorted(wanted - self.tagged):
            await conn_manager(self.p2p, TAG_PEER, PeerID.from_base58(peer), NEIGHBOUR_TAG, NEIGHBOUR_WEIGHT)
            self.tagged.add(peer)
        for peer in sorted(self.tagged - wanted):
            await conn_manager(self.p2p, UNTAG_PEER, PeerID.from_base58(peer), NEIGHBOUR_TAG)
            self.tagged.discard(peer)


async def trim(p2p: P2P) -> None:
    """Ask p2pd to trim now, as it does by itself past `high` connections (tests, the red team's harness)."""
    await conn_manager(p2p, TRIM)

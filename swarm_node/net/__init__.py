"""The network layer: how a node's packets reach its peers, behind one `Transport` protocol.

    Transport        the seam: offer our bytes for round r, collect peers' bytes for a range of
                     rounds within a deadline, distrust a (peer, digest); exchange.py is given one
    records.py       record schema, limits, fetch framing (no hivemind: re-implementable from SPEC)
    identity.py      the RSA key that is both libp2p identity and DHT record owner; record checks
    fetch.py         the fetch protocol over any asyncio stream (client, server, served offers)
    collect.py       the collect loop: per-peer limits, each digest delivered once, stale offers
    loop.py          a private event loop on a thread, and bounded (cancelling) calls into it
    announce.py      discovery v2: a bounded-degree mesh of neighbors that push their offers to
                     each other (no hivemind; shared by the libp2p and in-memory transports)
    driver.py        MeshDriver: the mesh's background work on an event loop (push, keepalive, dial, prune)
    scores.py        what a node measured of its neighbours (credits, outbound, idle) and per-peer
                     stream rates with a graylist (issue 27; no hivemind)
    slots.py         what a node remembers of neighbours that lost their slot: the bench, the idle
                     clock of empty ones that left, slots held for their /24 (issue 27; no hivemind)
    knockers.py      peers a full node refused that offered packets: fetched from in turn while it
                     starves, dialled first once their packet was taken (issue 27; no hivemind)
    lanes.py         announcement and fetch ids of each neighbour's own, and which public ids are registered
                     in p2pd (issue 27's flood; talks to p2pd through any object with hivemind's P2P methods)
    conn_tags.py     neighbours tagged in p2pd's connection manager, so that a trim closes strangers first
    shield.py        ids unregistered for a while when flooded, then open a guaranteed share (no hivemind)
    discovery.py     hivemind DHT: membership records (v2), the v1 single-key records, validators
    reach.py         reachability: the dial-back check, p2pd options per mode, the status line (no hivemind)
    daemon.py        start p2pd so peers can reach it: public, or private behind a circuit relay
    firewall.py      a per-source limit on new connections to the node's port, in the kernel (nftables;
                     `swarm-node firewall`): p2pd signs a handshake for each, and cannot refuse them
    hivemind.py      HivemindTransport: push announcements + libp2p stream pull (v1 selectable)
    hivemind_internals.py  every use of a hivemind private attribute, fenced in one place
    hivemind_hardening.py  hivemind's readers of a peer's bytes, bounded (patched before p2pd starts)
    memory.py        MemoryTransport: the same protocol and collect loop in one process, for tests
    probe.py         the live conformance probe of a running node (`protocol conformance --peer`; no hivemind)

Only conn_tags.py, daemon.py, discovery.py, hivemind.py, hivemind_internals.py and hivemind_hardening.py import hivemind: they are
the libp2p implementation, split to keep each module readable; private attributes are touched only in
hivemind_internals.py and hivemind_hardening.py (which replaces three of hivemind's methods), and pyproject.toml pins the hivemind range those were tested with. Everything above this layer
sees only bytes, peer ids, digests and rounds: no hivemind types.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from swarm_node.errors import SwarmNodeError


class SwarmError(SwarmNodeError):
    """A user-facing transport error (bad multiaddr, identity in use, daemon did not start)."""


@dataclass
class PeerInfo:
    """What a peer's discovery record says about it."""

    peer_id: str
    model_id: str
    tokenizer: str
    protocol: int
    round: int
    policy_version: int
    offers: list[tuple[int, str, int]]  # (round, digest, size) of the packets it serves
    updated_at: float
    addrs: list[str] = field(default_factory=list)  # where to dial it, best first (v2 announcements)
    produces: bool = True  # False: it announced that it offers no packets (a relay, a light client); never waited for


@dataclass
class Received:
    """One packet's bytes, fetched from an authenticated peer."""

    peer_id: str  # the libp2p peer id of the peer that served the bytes
    round: int  # the round its offer announced
    digest: str  # "sha256:<hex>" of `data`
    data: bytes


@dataclass
class Collected:
    """What one `Transport.collect` call brought: new packets, and offers it did not fetch."""

    packets: list[Received] = field(default_factory=list)
    peers: int = 0  # live peers of this run seen during the call
    dropped: Counter = field(default_factory=Counter)  # reason -> offers not fetched (stale, flood, oversize, ...)
    failed: set[str] = field(default_factory=set)  # peers a fetch of which was refused or failed during the call


class Transport(Protocol):
    """Moves packet bytes between peers. Implementations own all per-peer state (which digests
    were already delivered, which (peer, digest) pairs are distrusted); every call is bounded in
    time. The node calls it from one thread (its round loop); an implementation may allow more
    (HivemindTransport hops every call onto its own event-loop thread, so any thread may call it)."""

    @property
    def peer_id(self) -> str:
        """This node's peer id (known after `start`)."""

    def start(self) -> None:
        """Join the network (bootstrap from the configured peers); raises SwarmError on user errors."""

    def set_manifest(self, digest: str, required: bool = False) -> None:
        """Before `start`: announce the digest of our run manifest (swarm_node/wire/contract.py) and refuse
        peers that announce another one (or none, when `required`), before fetching anything from them."""

    def join_addrs(self) -> list[str]:
        """Full addresses others can bootstrap from (`--peers`), the most useful first."""

    def offer(self, round: int, policy_version: int, data: bytes) -> str:
        """Serve `data` as our packet for `round` and announce it; returns its digest. Our own
        digest is never delivered back to us by `collect`."""

    def collect(self, oldest: int, newest: int, min_peers: int, deadline_s: float) -> Collected:
        """Fetch peers' not-yet-delivered packets offered for rounds `oldest..newest` until
        packets from `min_peers` distinct peers arrived (one pass if <= 0) or `deadline_s`
        passed. Offers older than `oldest` are counted once as `dropped["stale"]`. Each digest
        is delivered at most once over the transport's lifetime."""

    def distrust(self, peer_id: str, digest: str) -> None:
        """Never fetch `digest` from `peer_id` again, and let another peer deliver it (the bytes
        were not that peer's packet)."""

    def measure(self) -> None:
        """Before `start`: the node credits the neighbours whose packets it took and found no
        misbehaviour in (`credit`), so a neighbor that delivers nothing, or only implausible
        data, may lose its slot (a transport used without an exchange idles nobody)."""

    def credit(self, peer_id: str, useful: bool = True, taken: bool = True) -> None:
        """`peer_id` delivered a packet the node admitted and trained with (swarm/exchange.py says
        when), `useful` if a group of it carried a training signal: what the transport measured of
        its neighbors keeps that one in the mesh (net/scores.py); a self-reported degree does not.
        `taken=False`: a packet that could teach, admitted, that the step had no room for: the
        neighbour is not idle, and earns nothing else."""

    def neighbours(self) -> dict[str, dict]:
        """What this node measured of each neighbour (net/scores.py): {peer: {outbound, credits,
        rounds_idle, rounds_useless}}; the node writes it to OUT/status.json every round."""

    def peers(self) -> list[PeerInfo]:
        """The live peers of this run, as their records describe them."""

    def stats(self) -> dict[str, int]:
        """Cumulative counters (bytes_in, bytes_out, fetch_timeouts, ...)."""

    def close(self) -> None:
        """Leave the network; idempotent."""

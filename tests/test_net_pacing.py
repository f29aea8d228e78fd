"""Pacing a neighbour cannot steer (issue 28), over the in-memory transport: a neighbour's announced
round is a claim; one far from ours, either way, neither holds a round for the full deadline nor
lets the node skip its waits. A neighbour that produces nothing says so (`produces: false`)."""
from __future__ import annotations

import time

from swarm_node.config import SwarmConfig
from swarm_node.net import PeerInfo
from swarm_node.net.memory import MemoryNetwork, MemoryTransport
from swarm_node.wire.codec import digest as packet_digest

DEADLINE_S, IDLE_S, ROUND = 2.0, 0.4, 100


def _node(network: MemoryNetwork) -> MemoryTransport:
    node = MemoryTransport(network, "QmNode", cfg=SwarmConfig(deadline_s=DEADLINE_S, alone_wait_s=IDLE_S))
    node.start()
    return node


def _liar(network: MemoryNetwork, pid: str, round_: int, offers=(), produces: bool = True) -> None:
    info = PeerInfo(pid, "m", "t", 1, round_, 0, list(offers), 0.0)
    info.produces = produces
    network.publish(info, {})


def _wait(node: MemoryTransport) -> float:
    """How long the collect of our round waits (staleness 2, one peer wanted)."""
    t0 = time.monotonic()
    got = node.collect(ROUND - 2, ROUND + 2, min_peers=1, deadline_s=DEADLINE_S)
    assert got.packets == []
    return time.monotonic() - t0


def test_alone_the_node_waits_its_own_idle_pace():
    node = _node(MemoryNetwork())
    assert IDLE_S - 0.05 <= _wait(node) < IDLE_S + 0.5


def test_neighbour_at_round_zero_without_offers_does_not_hold_every_round_for_the_deadline():
    network = MemoryNetwork()
    node = _node(network)
    _liar(network, "QmZero", 0)
    assert [p.round for p in node.peers()] == [0]
    assert IDLE_S - 0.05 <= _wait(node) < IDLE_S + 0.5  # was DEADLINE_S


def test_neighbour_at_round_one_million_does_not_end_every_wait_at_once():
    network = MemoryNetwork()
    node = _node(network)
    _liar(network, "QmFar", 1_000_000)
    assert [p.round for p in node.peers()] == [1_000_000]
    assert IDLE_S - 0.05 <= _wait(node) < IDLE_S + 0.5  # was ~0: 365 rounds in 35 s


def test_both_lies_together_and_stale_offers_far_behind_change_nothing():
    network = MemoryNetwork()
    node = _node(network)
    _liar(network, "QmZero", 0)
    _liar(network, "QmFar", 1_000_000)
    _liar(network, "QmOld", 3, offers=[(3, packet_digest(b"old"), 3)])  # far behind: cannot deliver our rounds
    assert len(node.peers()) == 3
    assert IDLE_S - 0.05 <= _wait(node) < IDLE_S + 0.5


def test_an_explicit_non_producer_is_never_waited_for_and_a_near_producer_is():
    network = MemoryNetwork()
    node = _node(network)
    _liar(network, "QmRelay", ROUND, produces=False)
    assert [p.produces for p in node.peers()] == [False]
    assert _wait(node) < IDLE_S + 0.5
    _liar(network, "QmNear", ROUND)  # a producer at our round: its packet may come, so the round waits for it
    assert DEADLINE_S - 0.05 <= _wait(node) < DEADLINE_S + 0.5


def test_a_near_producer_past_our_rounds_still_lets_a_node_that_fell_behind_catch_up():
    network = MemoryNetwork()
    node = _node(network)
    _liar(network, "QmAhead", ROUND + 10, offers=[(ROUND + 10, packet_digest(b"new"), 3)])
    assert _wait(node) < 0.2


def test_a_leaving_neighbor_is_dropped_at_once_and_holds_no_round():
    """Issue 28: a departed neighbor was kept for record_ttl_s (60 s) and held every round for the
    deadline meanwhile. A node that leaves says so (`leaving: true`); its neighbors drop it at once."""
    network = MemoryNetwork()
    node = _node(network)
    other = MemoryTransport(network, "QmOther", cfg=SwarmConfig(deadline_s=DEADLINE_S, alone_wait_s=IDLE_S))
    other.start()
    other.offer(ROUND, 1, b"a packet of our round")
    assert [p.peer_id for p in node.peers()] == ["QmOther"]
    node.collect(ROUND - 2, ROUND + 2, min_peers=1, deadline_s=DEADLINE_S)  # takes its packet
    other.close()
    assert node.peers() == [] and "QmOther" not in node._mesh.known
    assert _wait(node) < IDLE_S + 0.5  # was DEADLINE_S until the neighbor expired

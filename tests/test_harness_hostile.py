"""harness/hostile.py: several attacker ids of one process seen as one peer (Crowd)."""
from __future__ import annotations

import time

from swarm_node.harness.hostile import Crowd, honest_rounds
from swarm_node.net import PeerInfo


def _info(peer: str, round_: int) -> PeerInfo:
    return PeerInfo(peer, "m", "t", 1, round_, round_, [], 0.0)


class FakeId:
    """One attacker id: its peer id and the peers it has heard of."""

    def __init__(self, peer_id: str, heard: list[PeerInfo]):
        self.peer_id, self.heard = peer_id, heard

    def peers(self) -> list[PeerInfo]:
        return list(self.heard)


def test_a_crowd_hears_through_any_of_its_ids_at_the_newest_round_and_never_lists_itself():
    evicted = FakeId("QmSybil1", [_info("QmV", 5), _info("QmSybil2", 9)])  # V stopped talking to it at round 5
    live = FakeId("QmSybil2", [_info("QmV", 7), _info("QmH", 3), _info("QmSybil1", 8)])
    crowd = Crowd([evicted, live])
    assert crowd.peer_id == "QmSybil1"
    assert sorted((p.peer_id, p.round) for p in crowd.peers()) == [("QmH", 3), ("QmV", 7)]
    rounds = honest_rounds(crowd, time.monotonic() + 5, min, poll_s=0.01)
    assert next(rounds)[0] == 3  # following the oldest honest round, not a fellow Sybil's 8 or 9
    live.heard = [_info("QmV", 9), _info("QmH", 6)]
    assert next(rounds)[0] == 6

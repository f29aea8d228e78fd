"""net/scores.py and the mesh's use of it (issue 27): neighbours are kept by what the node measured
(packets accepted from them, whether it dialled them), never by the degree they announce; rates.
Unit tests, no network, and one real-process test in network namespaces (the per-subnet limit);
the flood test is test_net_flood.py, anchors across a restart test_net_hivemind.py."""
from __future__ import annotations

import os
import dataclasses
import random
import subprocess
import sys
import time

import pytest

from swarm_node.harness.netns import Internet, leftover_namespaces, unavailable
from swarm_node.harness.process import NodeProcess
from swarm_node.net.announce import Mesh
from swarm_node.net.knockers import TRIAL_FETCH_S, TRIAL_S
from swarm_node.net.scores import MeshParams, PeerLimiter, best_outbound, subnet_of
from swarm_node.net.slots import (EMPTY_MEMORY_S, IDLE_BENCH_S, MAX_HOLDS, MAX_IDLE_BENCH_S, SILENT_BENCH_S,
                                  STARVING_BENCH_S, bench_s)
from swarm_node.status import read_status

ADDR = ["/ip4/127.0.0.1/tcp/1"]
SYBILS = [f"QmSybiA{i}" for i in range(1, 7)]
IDLE_ROUNDS = 3


def _ann(round_=1, peers=(), degree=0, offers=()):
    return {"run_id": "r", "seq": round_, "degree": degree, "model_id": "m", "tokenizer": "t", "protocol": 1,
            "round": round_, "policy_version": 1, "offers": [[round_, f"sha256:{d * 64}", 100] for d in offers],
            "addrs": ADDR, "peers": [[p, ADDR] for p in peers]}


def _params():  # k = 1: D = 4, D + 2 = 6
    return MeshParams(4, 6, ttl_s=600.0, max_packet_bytes=1000, out_quota=2, idle_rounds=IDLE_ROUNDS, idle_s=0.0)


class Swarm:
    """Two honest meshes V and H, and six live Sybils that announce degree 0 to both every round,
    accept every neighbour, never prune, name each other in peer exchange, and never deliver."""

    def __init__(self, sybils_first: bool):
        self.v = Mesh("QmV", "r", 1, _params(), initial={"QmH": ADDR}, rng=random.Random(1))
        self.h = Mesh("QmH", "r", 1, _params(), initial={"QmV": ADDR}, rng=random.Random(2))
        self.meshes = {"QmV": self.v, "QmH": self.h}
        self.v.measuring = self.h.measuring = True  # an exchange runs and credits accepted packets
        self.sybils_first = sybils_first
        self.tenure = {(m, s): 0 for m in self.meshes for s in SYBILS}  # consecutive rounds a Sybil held a slot it
        self.longest = 0  # dialled itself (inbound); one the node dialled (outbound) waits for a candidate

    def contact(self, src: str, dst: str, t: float) -> None:
        mesh = self.meshes[src]
        if dst in self.meshes:
            reply = self.meshes[dst].receive(src, mesh.announcement(to=dst), t)
        else:  # a Sybil: always ok, always degree 0, peer exchange of its fellows
            reply = {"status": "ok", **_ann(peers=SYBILS, degree=0)}
        mesh.on_reply(dst, reply, t)

    def round(self, r: int) -> None:
        t = 10.0 * r
        for name, mesh in self.meshes.items():
            mesh.set_own("m", "t", r, 1, [], ADDR)
        if r > 0 or self.sybils_first:
            for s in SYBILS:  # every Sybil (re)dials both honest nodes every round
                for mesh in self.meshes.values():
                    mesh.receive(s, _ann(r, peers=SYBILS, degree=0), t)
        for name, mesh in self.meshes.items():  # pushes between neighbours, then deliveries
            for peer in [p for p in mesh.neighbors if p in self.meshes]:
                self.contact(name, peer, t)
        for name, mesh in self.meshes.items():
            other = "QmH" if name == "QmV" else "QmV"
            if other in mesh.neighbors:
                mesh.credit(other, t)  # the honest peer's packet arrived and was accepted
        for name, mesh in self.meshes.items():  # the driver's tick
            mesh.expire(t)
            mesh.prune(t)
            mesh.evict(t)
            if mesh.short():
                for peer, _ in mesh.candidates(mesh.dials_wanted(), t):
                    self.contact(name, peer, t)
        for (m, s) in self.tenure:
            n = self.meshes[m].neighbors.get(s)
            self.tenure[(m, s)] = self.tenure[(m, s)] + 1 if n is not None and not n.score.outbound else 0
        self.longest = max(self.longest, *self.tenure.values())


@pytest.mark.parametrize("sybils_first", [False, True])
def test_sybils_announcing_degree_zero_cannot_eclipse_an_honest_pair(sybils_first):
    """The old prune dropped neighbours "whose last degree exceeds D": V and H, both above D because
    the Sybils take every slot, pruned each other within seconds. Now: once linked, the honest pair
    is never pruned; a Sybil that dialled in loses its slot within IDLE_ROUNDS + 1 rounds; Sybils the
    node dialled itself (out_quota) hold at most those slots, and lose them to any candidate."""
    swarm = Swarm(sybils_first)
    linked_at = None
    for r in range(25):
        swarm.round(r)
        linked = "QmH" in swarm.v.neighbors and "QmV" in swarm.h.neighbors
        if linked_at is None and linked:
            linked_at = r
        assert linked_at is None or linked, f"the honest pair was pruned in round {r}"
    assert linked_at is not None and linked_at <= IDLE_ROUNDS + 2
    assert swarm.longest <= IDLE_ROUNDS + 1
    for mesh in (swarm.v, swarm.h):
        assert len(mesh.neighbors) <= mesh.params.max_degree and max(mesh.slots.evictions.values()) >= 2  # benched, back, again
        scores = mesh.scores()
        other = "QmH" if mesh is swarm.v else "QmV"
        assert scores[other]["credits"] >= 20 and scores[other]["rounds_idle"] == 0


def test_answers_never_take_a_node_past_its_slots():
    """Red team 17's fuzz: 14 "ok" answers (dials that were all out at once, or answers never asked for) made 14
    neighbours of a node with 6 slots. A starving node's rescue dials may take it out_quota past its slots; an
    answer beyond that is treated as "full"."""
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    answers = [mesh.on_reply(f"QmDialled{i}", {"status": "ok", **_ann()}, 1.0) for i in range(14)]
    most = mesh.params.max_degree + mesh.params.out_quota
    assert len(mesh.neighbors) == most == answers.count("ok")
    assert answers.count("full") == 14 - most and mesh.retry_at["QmDialled13"] > 1.0


def test_inbound_peers_cannot_take_the_outbound_slots_and_degree_claims_buy_nothing():
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    for s in SYBILS:
        mesh.receive(s, _ann(degree=0), 1.0)
    assert len(mesh.neighbors) == 4 and mesh.outbound() == 0  # max_degree - out_quota inbound at most
    assert mesh.receive("QmLate", _ann(degree=0), 1.0)["status"] == "full"
    assert mesh.short() and mesh.dials_wanted() == 2  # full of inbound: still dials out_quota of its own
    assert mesh.on_reply("QmPicked", {"status": "ok", **_ann(degree=99)}, 1.0) == "ok"
    assert mesh.scores()["QmPicked"]["outbound"] is True
    # over D, nobody idle yet: nobody pruned, whatever they announced
    mesh.set_own("m", "t", 1, 1, [], ADDR)
    assert mesh.prune(2.0) == []
    # rounds pass; QmSybil0 delivers, the others do not: over D the idle inbound go first, the outbound stays
    mesh.set_own("m", "t", 1 + IDLE_ROUNDS, 1, [], ADDR)
    mesh.credit(SYBILS[0], 2.0)
    gone = mesh.prune(3.0)
    assert len(gone) == 1 and gone[0] not in (SYBILS[0], "QmPicked") and len(mesh.neighbors) == 4
    assert mesh.receive(gone[0], _ann(degree=0), 3.5)["status"] == "full"  # benched: cannot take it straight back
    # below D, idle neighbours that dialled us lose their slot at once, and so does an outbound one that
    # never delivered (an empty Sybil we picked); an outbound one that delivered before, only to a candidate
    assert mesh.on_reply("QmDelivered", {"status": "ok", **_ann(degree=1)}, 1.0) == "ok"
    mesh.credit("QmDelivered", 1.5)
    mesh.set_own("m", "t", 1 + 2 * IDLE_ROUNDS, 1, [], ADDR)
    for p in mesh.known:  # (those refused as full were remembered as candidates: none waits now)
        mesh.retry_at.setdefault(p, 10**9)
    idle_inbound = sorted(p for p in mesh.neighbors if p not in (SYBILS[0], "QmPicked", "QmDelivered"))
    mesh.credit(SYBILS[0], 9.0)
    assert sorted(mesh.evict(10.0)) == sorted([*idle_inbound, "QmPicked"])
    assert set(mesh.neighbors) == {SYBILS[0], "QmDelivered"} and mesh.evict(10.0) == []
    mesh.learn([("QmCandidate", ADDR)])
    assert mesh.evict(10.0) == ["QmDelivered"] and mesh.candidates(5, 10.0) == [("QmCandidate", ADDR)]


def test_streams_over_a_peers_rate_are_refused_and_repeated_excess_graylists_it():
    from swarm_node.net.scores import RateLimits

    now, grayed = [0.0], []
    lim = RateLimits(announce_rate=2.0, announce_burst=4.0, fetch_rate=10.0, fetch_burst=10.0, graylist_after=5,
                     misbehaviour_window_s=10.0, graylist_s=60.0)
    limiter = PeerLimiter(lim, clock=lambda: now[0], on_graylist=lambda p, s: grayed.append((p, s)))
    assert [limiter.allow("QmA", "announce") for _ in range(6)] == [True] * 4 + [False] * 2  # the burst, then refused
    assert all(limiter.allow("QmA", "fetch") for _ in range(10))  # another kind: its own bucket
    assert limiter.allow("QmB", "announce")  # another peer: unaffected
    now[0] += 0.5
    assert limiter.allow("QmA", "announce") and not limiter.allow("QmA", "announce")  # refilled at 2/s
    # an honest pace (2/s) is never refused, however long
    for _ in range(40):
        now[0] += 0.5
        assert limiter.allow("QmB", "announce")
    # misbehaviour older than the window is forgotten: 3 strikes so far for QmA, 2 more graylist it
    assert not grayed and limiter.over_rate == 3
    now[0] += 20.0  # the old strikes expire
    for _ in range(4):
        limiter.allow("QmA", "announce")  # the burst again
    assert [limiter.allow("QmA", "announce") for _ in range(5)] == [False] * 5
    assert grayed == [("QmA", 60.0)] and limiter.graylisted("QmA") and limiter.graylisted_total == 1
    now[0] += 30.0
    assert not limiter.allow("QmA", "announce") and not limiter.allow("QmA", "fetch")  # ignored, every kind
    assert limiter.allow("QmB", "announce")
    now[0] += 31.0
    assert limiter.allow("QmA", "announce") and not limiter.graylisted("QmA")  # after graylist_s


def test_a_graylisted_neighbour_is_dropped_refused_and_not_dialled():
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    assert mesh.receive("QmA", _ann(), 1.0)["status"] == "ok"
    mesh.graylist("QmA", 100.0, 1.0)
    assert "QmA" not in mesh.neighbors and mesh.receive("QmA", _ann(), 50.0)["status"] == "full"
    assert mesh.candidates(5, 50.0) == [] and mesh.candidates(5, 100.0) == [("QmA", ADDR)]


def test_an_idle_neighbour_gone_silent_after_delivering_is_benched_briefly_others_for_a_minute():
    """A partition makes neighbours idle on both sides of the cut, and silent: each side benched the other for
    60 s, and the cut node took a packet 19 rounds after a 20 s cut healed (chaos soak, CI, session 32). One
    that keeps announcing while it delivers nothing holds a slot: a minute; so does one that never delivered and
    let our pushes hang (red team 14: else empty Sybils chose the short bench). Each waits twice as long next time."""
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    mesh.set_own("m", "t", 1, 1, [], ADDR)
    for peer in ("QmTalks", "QmCut", "QmEmpty", "QmFed"):
        assert mesh.receive(peer, _ann(), 1.0)["status"] == "ok"
    mesh.credit("QmCut", 1.0)  # it delivered once, then the link went down
    for r in range(2, 2 + IDLE_ROUNDS):  # rounds pass: QmTalks keeps announcing, QmCut and QmEmpty are silent
        mesh.set_own("m", "t", r, 1, [], ADDR)
        mesh.receive("QmTalks", _ann(r), float(r))
        mesh.credit("QmFed", float(r))
    now = float(2 + IDLE_ROUNDS)
    mesh.set_own("m", "t", 2 + IDLE_ROUNDS, 1, [], ADDR)
    assert not mesh.starving(now) and sorted(mesh.evict(now)) == ["QmCut", "QmEmpty", "QmTalks"]
    assert mesh.slots.benched == {"QmTalks": now + IDLE_BENCH_S, "QmEmpty": now + IDLE_BENCH_S, "QmCut": now + SILENT_BENCH_S}
    assert mesh.receive("QmCut", _ann(), now + SILENT_BENCH_S - 1)["status"] == "full"  # benched: refused ...
    assert mesh.receive("QmCut", _ann(), now + SILENT_BENCH_S)["status"] == "ok"  # ... then back, on both sides
    assert mesh.receive("QmTalks", _ann(), now + SILENT_BENCH_S)["status"] == "full"
    assert bench_s(2, silent=True) == 2 * SILENT_BENCH_S and bench_s(20, silent=True) == MAX_IDLE_BENCH_S


def test_an_empty_neighbour_that_leaves_and_comes_back_keeps_its_idle_clock():
    """Red team 14: a neighbour that never delivered left by any door but an eviction (a `leaving` announcement,
    a bad request, a `full` answer, 3 failed pushes) just before its idle verdict, came back at once with a fresh
    clock, and held its slot for 100 % of 30 min. It now comes back with the clock it left with, and goes at the
    first verdict due; one that delivered comes back with a fresh clock (an honest peer restarting)."""
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    mesh.set_own("m", "t", 1, 1, [], ADDR)
    for peer in ("QmEmpty", "QmHonest", "QmFed"):
        assert mesh.receive(peer, _ann(), 1.0)["status"] == "ok"
    mesh.credit("QmHonest", 1.0)
    for r in range(2, 1 + IDLE_ROUNDS):  # up to one round before the empty one's verdict
        mesh.set_own("m", "t", r, 1, [], ADDR)
        mesh.credit("QmFed", float(r))
    for peer in ("QmEmpty", "QmHonest"):  # both leave, and are back at once
        mesh.receive(peer, {**_ann(), "leaving": True}, float(IDLE_ROUNDS))
        assert peer not in mesh.neighbors and mesh.receive(peer, _ann(), IDLE_ROUNDS + 0.5)["status"] == "ok"
    mesh.set_own("m", "t", 1 + IDLE_ROUNDS, 1, [], ADDR)  # the empty one's verdict is due
    mesh.credit("QmFed", 1.0 + IDLE_ROUNDS)
    assert mesh.evict(1.0 + IDLE_ROUNDS) == ["QmEmpty"] and "QmHonest" in mesh.neighbors
    # back after EMPTY_MEMORY_S, a fresh clock (and what an eviction benches it for comes first)
    later = 1.0 + IDLE_ROUNDS + IDLE_BENCH_S
    assert mesh.receive("QmEmpty", _ann(), later)["status"] == "ok" and mesh.evict(later) == []


def test_a_slot_an_idle_neighbour_vacated_stays_its_subnets_until_its_bench_ends():
    """Red team 14: ids are free, so a bench never held fresh Sybils back: each empty id evicted was replaced by a
    fresh one of the same subnets, and 2 subnets' Sybils held every inbound slot (an honest newcomer got none in
    12 of 12 phases). A slot an idle neighbour vacated now stays its subnet's until that neighbour's bench ends."""
    mesh = Mesh("QmV", "r", 1, dataclasses.replace(_params(), per_subnet=2), rng=random.Random(0))
    mesh.measuring = True
    mesh.set_own("m", "t", 1, 1, [], ADDR)
    sybil = "/ip4/11.12.0.{}/tcp/1".format
    assert mesh.receive("QmFed", _ann(), 1.0, addr="/ip4/10.0.0.2/tcp/1")["status"] == "ok"  # a LAN peer: no group
    for i in (1, 2):
        assert mesh.receive(f"QmSybil{i}", _ann(), 1.0, addr=sybil(i))["status"] == "ok"
    assert mesh.receive("QmSybil3", _ann(), 1.0, addr=sybil(3))["status"] == "full"  # the /24's share is 2
    for r in range(2, 2 + IDLE_ROUNDS):
        mesh.set_own("m", "t", r, 1, [], ADDR)
        mesh.credit("QmFed", float(r))
    now = float(1 + IDLE_ROUNDS)
    assert not mesh.starving(now) and sorted(mesh.evict(now)) == ["QmSybil1", "QmSybil2"]
    assert mesh.receive("QmSybil4", _ann(), now + 1, addr=sybil(4))["status"] == "full"  # fresh id, same /24: held
    assert mesh.receive("QmH", _ann(), now + 1, addr="/ip4/11.13.0.1/tcp/1")["status"] == "ok"  # another subnet's
    assert mesh.receive("QmSybil4", _ann(), now + IDLE_BENCH_S, addr=sybil(4))["status"] == "ok"  # after the bench


def test_an_empty_neighbour_that_leaves_holds_its_subnets_slot_and_its_clock_for_a_minute_after_leaving():
    """Red team 15: (N1) empty ids that sent `leaving` one round before each verdict were never evicted, so no
    slot was held: 2 subnets' fresh ids held every inbound slot again; (N2) the clock's memory counted from
    joining, so with 20 s rounds 5 rounds outlasted it and one id held its slot in 100 % of 30 min."""
    mesh = Mesh("QmV", "r", 1, dataclasses.replace(_params(), per_subnet=2), rng=random.Random(0))
    mesh.measuring = True
    mesh.set_own("m", "t", 1, 1, [], ADDR)
    sybil = "/ip4/11.12.0.{}/tcp/1".format
    for i in (1, 2):
        assert mesh.receive(f"QmSybil{i}", _ann(), 1.0, addr=sybil(i))["status"] == "ok"
    for r in range(2, 1 + IDLE_ROUNDS):  # 20 s rounds: the verdict is due at round 1 + IDLE_ROUNDS, 60 s on
        mesh.set_own("m", "t", r, 1, [], ADDR)
    left = 20.0 * IDLE_ROUNDS
    mesh.receive("QmSybil1", {**_ann(), "leaving": True}, left, addr=sybil(1))
    assert "QmSybil1" not in mesh.neighbors
    assert mesh.receive("QmSybil3", _ann(), left + 1, addr=sybil(3))["status"] == "full"  # its slot: held (N1)
    assert mesh.receive("QmH", _ann(), left + 1, addr="/ip4/11.13.0.1/tcp/1")["status"] == "ok"  # another subnet's
    assert mesh.receive("QmSybil1", _ann(), left + 2, addr=sybil(1))["status"] == "ok"  # it may come back itself ...
    mesh.set_own("m", "t", 1 + IDLE_ROUNDS, 1, [], ADDR)
    assert "QmSybil1" in mesh.evict(left + 20)  # ... with the clock it left with, 79 s after it joined (N2)
    # both were evicted: their slots stay their /24's for their benches, then are free
    assert mesh.receive("QmSybil3", _ann(), left + 21, addr=sybil(3))["status"] == "full"
    assert mesh.receive("QmSybil3", _ann(), left + 20 + IDLE_BENCH_S, addr=sybil(3))["status"] == "ok"


def test_an_empty_neighbour_graylisted_on_purpose_holds_its_subnets_slot_and_the_holds_stay_bounded():
    """Red team 16: an empty id that got itself graylisted (a burst of streams over its rate) left no hold, and a
    fresh id of its /24 took the slot: 2 subnets kept an honest newcomer out for 30 min at any round length.
    And the holds (and graylisted benches) were never trimmed: 1,440 an hour for good."""
    mesh = Mesh("QmV", "r", 1, dataclasses.replace(_params(), per_subnet=2), rng=random.Random(0))
    now = [10.0]
    limiter = PeerLimiter(clock=lambda: now[0], on_graylist=lambda peer, s: mesh.graylist(peer, now[0] + s, now[0]))
    sybil = "/ip4/11.12.0.{}/tcp/1".format
    for i in (1, 2):
        assert mesh.receive(f"QmSybil{i}", _ann(), now[0], addr=sybil(i))["status"] == "ok"
    while "QmSybil1" in mesh.neighbors:  # its own streams over its rate, just before its idle verdict
        limiter.allow("QmSybil1", "announce")
    assert mesh.receive("QmSybil3", _ann(), now[0], addr=sybil(3))["status"] == "full"  # fresh id, same /24: held
    assert mesh.receive("QmH", _ann(), now[0], addr="/ip4/11.13.0.1/tcp/1")["status"] == "ok"
    t = 100.0
    for i in range(3 * MAX_HOLDS):  # fresh ids of fresh /24s graylisted one after another: holds and benches bounded
        t += 1000.0
        peer = f"QmG{i}"
        mesh.learn([(peer, ADDR)])
        assert mesh.receive(peer, _ann(), t, addr=f"/ip4/12.{i // 256}.{i % 256}.1/tcp/1")["status"] == "ok"
        mesh.graylist(peer, t + 120.0, t)
        assert len(mesh.slots.vacated) <= MAX_HOLDS and len(mesh.slots.benched) <= MAX_HOLDS + 1


def test_a_relayed_newcomer_counts_with_its_relays_subnet():
    """Red team 15 (N3): `relay:50.0.1.0/24` and `50.0.1.0/24` were two groups, so one /24 held 2 slots directly
    and 3 more through a relay of its own: every inbound slot. Together they hold half the slots at most."""
    mesh = Mesh("QmV", "r", 1, dataclasses.replace(_params(), per_subnet=2), rng=random.Random(0))
    for i in (1, 2):
        assert mesh.receive(f"QmDirect{i}", _ann(), 1.0, addr=f"/ip4/50.0.1.{i}/tcp/1")["status"] == "ok"
    relayed = "/ip4/50.0.1.9/tcp/1/p2p/QmRelay/p2p-circuit"
    assert mesh.receive("QmRelayed1", _ann(), 1.0, addr=relayed)["status"] == "ok"  # half of 6 slots: 3
    assert mesh.receive("QmRelayed2", _ann(), 1.0, addr=relayed)["status"] == "full"
    assert mesh.receive("QmDirect3", _ann(), 1.0, addr="/ip4/50.0.1.3/tcp/1")["status"] == "full"
    assert mesh.receive("QmOther", _ann(), 1.0, addr="/ip4/50.0.2.1/tcp/1/p2p/QmR2/p2p-circuit")["status"] == "ok"
    # the other way round: a public node that relays for 2 of our NAT'd neighbours may still be one itself
    mesh = Mesh("QmV", "r", 1, dataclasses.replace(_params(), per_subnet=2), rng=random.Random(0))
    for i in (1, 2):
        assert mesh.receive(f"QmNat{i}", _ann(), 1.0, addr="/ip4/50.0.1.4/tcp/1/p2p/QmRelayV/p2p-circuit")["status"] == "ok"
    assert mesh.receive("QmRelayV", _ann(), 1.0, addr="/ip4/50.0.1.4/tcp/1")["status"] == "ok"
    assert mesh.receive("QmDirect", _ann(), 1.0, addr="/ip4/50.0.1.5/tcp/1")["status"] == "full"  # 3 of the /24


def test_a_starving_node_gives_a_knocking_newcomer_the_slot_of_a_neighbour_that_never_delivered():
    """Sybils that dialled first fill every inbound slot and deliver nothing; the honest peer that
    knocks next used to be answered `full` for as long as they stayed (a real node: 12 rounds at 0
    packets). Starving, the node admits it in place of the inbound neighbour that had the most
    rounds to deliver; fed (a neighbour credited lately), it keeps its neighbours."""
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    for s in SYBILS:
        mesh.receive(s, _ann(degree=0), 1.0)
    assert len(mesh.neighbors) == 4 and mesh.receive("QmH", _ann(), 1.0)["status"] == "full"
    mesh.set_own("m", "t", 1, 1, [], ADDR)
    assert not mesh.starving()
    mesh.set_own("m", "t", 3, 1, [], ADDR)  # rounds pass, nothing credited
    assert mesh.starving()
    assert mesh.receive("QmH", _ann(), 3.0)["status"] == "ok" and "QmH" in mesh.neighbors
    assert len(mesh.neighbors) == 4 and sum(t > 3.0 for t in mesh.slots.benched.values()) == 1  # one Sybil benched ...
    assert max(mesh.slots.benched.values()) == 3.0 + STARVING_BENCH_S  # ... briefly: it may be an honest peer restarting
    mesh.set_own("m", "t", 4, 1, [], ADDR)
    mesh.credit("QmH", 4.0)
    assert not mesh.starving()
    assert mesh.receive("QmLate", _ann(), 4.0)["status"] == "full"  # fed: nobody is displaced
    assert "QmH" in mesh.neighbors


def test_a_starving_node_admits_a_knocking_producer_at_once_and_keeps_it_from_liars():
    """64 live Sybils that dialled first refilled every slot the starving rule freed before the honest
    peer knocked again (a real node: none of its packets in 30 rounds). Starving, a newcomer that
    offers packets takes at once the slot of an inbound neighbour that offers none; a Sybil that
    offers what it does not serve is found out by its first failed fetch and yields like a silent
    one; a producer admitted is not displaced by later producers before it could deliver."""
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    mesh.set_own("m", "t", 3, 1, [], ADDR)  # round 3, nothing credited: starving
    for s in SYBILS:  # they knock this very round: none has been idle for STARVING_ROUNDS yet
        mesh.receive(s, _ann(3), 30.0)
    assert mesh.starving() and len(mesh.neighbors) == 4
    assert mesh.receive("QmQuiet", _ann(3), 30.0)["status"] == "full"  # offers nothing: nothing to prefer
    far = _ann(3 + mesh.params.offer_rounds + 1, offers="f")  # an offer we would never fetch proves nothing
    assert mesh.receive("QmFar", far, 30.0)["status"] == "full"
    assert mesh.receive("QmLiar", _ann(3, offers="a"), 30.0)["status"] == "ok"  # offers: a silent one yields
    mesh.fetched("QmLiar", "not_found")  # its offer came back not found
    assert mesh.receive("QmH", _ann(3, offers="b"), 30.0)["status"] == "ok"
    for i in range(6):  # more producers knock, fake or not: they take the silent and lying slots, never H's
        mesh.receive(f"QmP{i}", _ann(3, offers="c"), 30.0)
    assert "QmH" in mesh.neighbors and "QmLiar" not in mesh.neighbors and len(mesh.neighbors) == 4
    assert not any(s in mesh.neighbors for s in SYBILS)
    mesh.fetched("QmH", "not_found")  # an honest race: its packet was gone when fetched ...
    mesh.credit("QmH", 31.0)  # ... and the next one came: a producer again, and we are fed
    assert not mesh.starving() and mesh.offering("QmH")
    assert mesh.receive("QmLate", _ann(3, offers="d"), 31.0)["status"] == "full"  # a fed node keeps its neighbours


def test_a_starving_node_fetches_from_knockers_in_turn_and_dials_its_initial_peers_and_those_that_delivered():
    """64 Sybils filled the honest peer's slots too (inbound, and those it picked from their peer
    exchange), so it was never short, never dialled, and never met the victim again; and 256 Sybil ids
    that knocked offering packets and answered our dial `ok` held every rescue slot (red team,
    session 13). Starving, a node fetches from the peers that knocked offering packets while it was
    full, TRIALS at a time in the order they first knocked (knocking again does not jump the queue),
    each turn ended by one fetch, whatever its outcome, or by TRIAL_S; it dials one initial peer and
    the knockers whose packets it took, whether or not it is short, never one that only offered, and
    never more than out_quota beyond max_degree; fed, nobody."""
    mesh = Mesh("QmV", "r", 1, _params(), initial={"QmBoot": ADDR}, rng=random.Random(0))
    mesh.measuring = True
    mesh.set_own("m", "t", 1, 1, [], ADDR)
    for s in SYBILS:
        mesh.receive(s, _ann(1, peers=[f"QmX{c}" for c in "abcdefgh"]), 10.0)
    for s in SYBILS[4:]:  # and two we dialled ourselves: full
        mesh.on_reply(s, {"status": "ok", **_ann(1)}, 10.0)
    mesh.on_reply("QmBoot", {"status": "full", "peers": []}, 10.0)  # the bootstrap node was full once
    for p in ("QmH", "QmH2", "QmH3", "QmLiar", "QmH5"):  # refused (full): knockers, in this order
        mesh.receive(p, _ann(1, offers="b"), 10.0)
    mesh.receive("QmQuiet", _ann(1), 10.0)  # offers nothing: not a knocker
    mesh.receive("QmH3", _ann(1, offers="c"), 10.1)  # knocking again does not move it ahead
    assert list(mesh.knockers.queue) == ["QmH", "QmH2", "QmH3", "QmLiar", "QmH5"] and len(mesh.neighbors) == 6
    assert mesh.trials(10.0) == [] and mesh.rescue(10.0) == []  # not starving yet
    mesh.set_own("m", "t", 3, 1, [], ADDR)
    assert mesh.starving() and not mesh.short()
    assert [i.peer_id for i in mesh.trials(10.5)] == ["QmH", "QmH2", "QmH3", "QmLiar"]  # TRIALS at a time
    assert mesh.knockers.timeout("QmH2", 10.0) == TRIAL_FETCH_S and mesh.knockers.timeout(SYBILS[0], 10.0) == 10.0
    assert [p for p, _ in mesh.rescue(10.5)] == ["QmH5"]  # the first knocker not on trial (the bootstrap
    assert "QmH5" not in mesh.knockers.queue  # node's "full" retry is not due); dialled once: out of the queue
    mesh.fetched("QmLiar", "not_found")
    mesh.fetched("QmH2", "busy")
    mesh.fetched("QmH", "ok")  # its turn is over; the step takes its packet:
    mesh.credit("QmH", 11.0)
    assert mesh.starving(11.0)  # a knocker's packet proves it, and does not make the neighbours any better
    assert [i.peer_id for i in mesh.trials(11.0)] == ["QmH3"]
    assert [p for p, _ in mesh.rescue(11.0)] == ["QmH"]  # the proven knocker first; no other into the last slot
    assert mesh.trials(10.5 + TRIAL_S) == [] and not mesh.knockers.queue  # a turn without a packet: out
    assert [p for p, _ in mesh.rescue(25.0)] == ["QmBoot", "QmH"]
    for p in ("QmBoot", "QmH"):
        mesh.on_reply(p, {"status": "ok", **_ann(3, offers="c")}, 25.0)  # admitted beyond max_degree ...
    assert len(mesh.neighbors) == 8 and mesh.neighbors["QmH"].score.outbound and "QmH" not in mesh.knockers.proven
    mesh.receive("QmH4", _ann(3, offers="b"), 25.0)
    assert mesh.rescue(26.0) == []  # ... out_quota beyond it at most
    mesh.credit("QmH", 26.0)
    assert not mesh.starving() and mesh.rescue(26.0) == [] and mesh.trials(26.0) == []
    mesh.set_own("m", "t", 1 + IDLE_ROUNDS, 1, [], ADDR)
    mesh.credit("QmH", 27.0)
    mesh.prune(27.0)  # ... and the idle ones are pruned back to D: the producer that delivered stays
    assert "QmH" in mesh.neighbors and len(mesh.neighbors) == mesh.params.degree


def test_knockers_that_only_offered_are_dialled_one_at_a_time_and_never_into_the_last_extra_slot():
    """An honest peer answered `full` stops knocking, so its announcement goes stale and no turn comes:
    a starving node still dials knockers in first-knock order (a dial brings a fresh announcement), one
    at a time, but 256 Sybil ids that answer `ok` must not take every extra slot: the last is kept
    for a knocker whose packet the node took."""
    from swarm_node.net import PeerInfo

    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    for s in SYBILS:
        mesh.receive(s, _ann(1), 10.0)
    for s in SYBILS[4:]:  # and two we dialled ourselves: full
        mesh.on_reply(s, {"status": "ok", **_ann(1)}, 10.0)
    mesh.set_own("m", "t", 3, 1, [], ADDR)
    for p in ("QmK1", "QmK2", "QmP"):
        mesh.learn([(p, ADDR)])
        mesh.knockers.knocked(p, PeerInfo(peer_id=p, model_id="m", tokenizer="t", round=3, policy_version=1,
                                          offers=[], protocol=1, updated_at=0.0), 30.0)
    assert mesh.starving(30.0) and [p for p, _ in mesh.rescue(30.0)] == ["QmK1"]
    mesh.on_reply("QmK1", {"status": "ok", **_ann(3)}, 30.0)
    assert len(mesh.neighbors) == mesh.params.max_degree + 1 and mesh.rescue(30.0) == []  # QmK2 waits
    mesh.credit("QmP", 31.0)  # the step took the packet of a knocker on trial
    assert [p for p, _ in mesh.rescue(31.0)] == ["QmP"]


def test_a_node_racing_through_rounds_to_catch_up_is_not_starving_and_keeps_the_peer_that_fed_it():
    """Joining a swarm that is ahead, a node runs rounds of ~1 s without waiting (nothing of its window
    can come), so its peer delivered nothing for 2 of its rounds within 2 s: it judged itself starving
    and evicted its only honest neighbour (real processes, 64 Sybils; C1 of session 13's red team).
    Starving now also takes STARVING_S seconds without a packet."""
    from swarm_node.net.scores import STARVING_S

    mesh = Mesh("QmH", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    mesh.set_own("m", "t", 1, 1, [], ADDR)
    mesh.receive("QmV", _ann(9, offers="a"), 100.0)
    mesh.credit("QmV", 100.0)
    mesh.set_own("m", "t", 3, 1, [], ADDR)
    assert not mesh.starving(102.0) and mesh.evict(102.0) == [] and "QmV" in mesh.neighbors
    assert mesh.starving(100.0 + STARVING_S) and mesh.evict(100.0 + STARVING_S) == ["QmV"]


def test_a_starving_node_racing_through_rounds_gives_a_newcomer_idle_s_to_deliver():
    """A node that refuses every producer (a guard lockdown: it waits for nobody) runs rounds of ~0.5 s and
    starves; the honest peer that joined it, 30 rounds behind and catching up, was evicted 2 rounds and
    2 s after joining, before its first packet could come (real processes, 16 poisoning Sybils, session
    28). Starving, a neighbour is idle after 2 rounds *and* idle_s seconds."""
    params = MeshParams(4, 6, ttl_s=600.0, max_packet_bytes=1000, out_quota=2, idle_rounds=5, idle_s=5.0)
    mesh = Mesh("QmV", "r", 1, params, rng=random.Random(0))
    mesh.measuring = True
    mesh.set_own("m", "t", 31, 1, [], ADDR)  # nothing credited yet: starving
    assert mesh.receive("QmH", _ann(3), 100.0)["status"] == "ok"
    mesh.set_own("m", "t", 34, 1, [], ADDR)
    assert mesh.starving(102.0) and mesh.evict(102.0) == [] and "QmH" in mesh.neighbors  # 3 rounds, 2 s
    assert mesh.evict(105.0) == ["QmH"]  # and idle_s: it had its chance


def test_a_knocker_gets_one_turn_per_knock_only_while_its_announcement_is_fresh():
    """A Sybil serving junk fast must not take turn after turn ahead of the honest peer, and an honest
    peer must not lose its turn to its own offer gone stale: a turn ends with the first fetch, whatever
    its outcome; the knocker re-enters at the back when it knocks again; stale announcements wait."""
    from swarm_node.net import PeerInfo
    from swarm_node.net.knockers import FRESH_S, TRIALS, Knockers

    def info(p):
        return PeerInfo(peer_id=p, model_id="m", tokenizer="t", round=1, policy_version=1, offers=[], protocol=1, updated_at=0.0)

    def turn(k, now):
        return [i.peer_id for i in k.turn(now, lambda p, i: True)]

    k = Knockers()
    for i in range(TRIALS + 1):
        k.knocked(f"QmS{i}", info(f"QmS{i}"), 0.0)
    k.knocked("QmH", info("QmH"), 1.0)
    assert turn(k, 1.0) == [f"QmS{i}" for i in range(TRIALS)]
    for i in range(TRIALS):
        k.fetched(f"QmS{i}", ok=True)  # junk served fast: a packet no step takes
        k.knocked(f"QmS{i}", info(f"QmS{i}"), 1.1)  # and knocking again at once
    assert turn(k, 1.2) == [f"QmS{TRIALS}", "QmH", "QmS0", "QmS1"]  # behind the honest peer now
    k.fetched("QmH", ok=True)
    k.delivered("QmH")  # its packet taken: proven, fetched from while its announcement is fresh
    assert "QmH" not in turn(k, 1.3)  # (its announcement was read: it knocks again for a new one)
    k.knocked("QmH", info("QmH"), 2.0)
    assert "QmH" in turn(k, 2.0) and "QmH" not in turn(k, 2.0 + FRESH_S + 0.1)
    k.knocked("QmLate", info("QmLate"), 10.0)
    k.forget(f"QmS{TRIALS}")
    assert turn(k, 10.0 + FRESH_S + 0.1) == [] and "QmLate" in k.queue  # stale: waits for its next knock


def test_knockers_of_one_subnet_take_one_turn_at_a_time_and_cannot_push_another_subnets_out_of_the_queue():
    """An attacker reading knockers.py: more than MAX_KNOCKERS ids knocking after the honest peer pushed
    it out of the queue (oldest first knock first out) before its turn came. Ids of one subnet now
    take one turn at a time, and a full queue loses the oldest knocker of its largest subnet."""
    from swarm_node.net import PeerInfo
    from swarm_node.net.knockers import MAX_KNOCKERS, TRIALS, Knockers

    def info(p):
        return PeerInfo(peer_id=p, model_id="m", tokenizer="t", round=1, policy_version=1, offers=[], protocol=1,
                        updated_at=0.0)

    k = Knockers()
    k.knocked("QmS0", info("QmS0"), 0.0, "203.0.113.0/24")
    k.knocked("QmH", info("QmH"), 0.0, "198.51.100.0/24")
    for i in range(1, 2 * MAX_KNOCKERS):
        k.knocked(f"QmS{i}", info(f"QmS{i}"), 0.1, "203.0.113.0/24")
    assert "QmH" in k.queue and len(k.queue) == MAX_KNOCKERS
    assert [i.peer_id for i in k.turn(1.0, lambda p, i: True)] == ["QmH", f"QmS{MAX_KNOCKERS + 1}"]  # one a subnet
    k.knocked("QmL1", info("QmL1"), 1.0)  # loopback and private addresses: not limited
    k.knocked("QmL2", info("QmL2"), 1.0)
    assert len(k.turn(1.0, lambda p, i: True)) == TRIALS


@pytest.mark.parametrize("kind", ["busy", "stall"])
def test_hundreds_of_sybil_ids_whose_offers_no_fetch_finds_out_do_not_keep_the_honest_producer_out(kind, monkeypatch):
    """Red team, session 13: 256 Sybil ids that knocked first offering packets, answered every fetch
    `busy` (or stalled it) and answered the victim's dials `ok` held its rescue slots 2 rounds each;
    the honest producer never got in (0 of its rounds). Simulated (harness/eclipse_sim.py: a real
    Mesh, the driver's tick, an adaptive attacker) with 128 ids for 300 s: with knockers fetched from
    in turn, the victim takes H's packets in nearly every round once H exists; without, in none."""
    from swarm_node.harness.eclipse_sim import run

    res = run(kind, "ok", n_sybils=128, seconds=300.0, h_start=60.0, seed=0)
    assert res["rounds_with_H"] >= 0.9 * res["rounds"] and res["max_neighbours"] <= res["max_degree"] + 2
    monkeypatch.setattr(Mesh, "trials", lambda self, now: [])
    assert run(kind, "ok", n_sybils=128, seconds=300.0, h_start=60.0, seed=0)["rounds_with_H"] == 0


def test_an_offer_not_made_good_within_a_round_protects_nobody():
    """A Sybil can offer what is never fetched (answering `busy`, stalling, or naming a packet the node
    holds already), so no fetch ever fails (red team, session 13). A neighbour that joined before this
    round and never delivered counts as offering nothing, whatever it announces; nor does a copy of the
    node's own offer (never fetched)."""
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    mesh.set_own("m", "t", 3, 1, [], ADDR)
    for s in SYBILS[:4]:
        mesh.receive(s, _ann(3, offers="a"), 30.0)
    assert all(mesh.offering(s) for s in SYBILS[:4])
    assert mesh.receive("QmH", _ann(3, offers="b"), 30.0)["status"] == "full"  # all offer, all joined this round
    mesh.set_own("m", "t", 4, 1, [], ADDR)
    assert not any(mesh.offering(s) for s in SYBILS[:4])
    assert mesh.receive("QmH", _ann(4, offers="b"), 31.0)["status"] == "ok"
    mesh.credit("QmH", 32.0)
    ours = [5, f"sha256:{'e' * 64}", 100]
    mesh.set_own("m", "t", 5, 1, [ours], ADDR)
    assert mesh.offering("QmH", [[5, "x", 1]]) and not mesh.offering("QmNew", [ours])  # a copy of ours proves nothing


def test_the_answer_to_a_push_sent_before_a_neighbour_was_benched_does_not_bring_it_back():
    """A push to a neighbour was in flight when the node evicted it as idle; its `ok` answer re-admitted
    it as an outbound neighbour in the same second (a real node: one empty Sybil held a slot for 19
    consecutive rounds, evicted every 5). A benched peer's answer now changes nothing."""
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    mesh.on_reply("QmSybiA1", {"status": "ok", **_ann(1)}, 1.0)
    mesh.credit("QmOther", 1.0)
    assert mesh.neighbors["QmSybiA1"].score.outbound
    mesh.set_own("m", "t", 1 + IDLE_ROUNDS, 1, [], ADDR)
    assert mesh.evict(2.0) == ["QmSybiA1"]
    assert mesh.on_reply("QmSybiA1", {"status": "ok", **_ann(4)}, 2.0) == "refused"
    assert "QmSybiA1" not in mesh.neighbors and mesh.slots.benched["QmSybiA1"] > 2.0


def test_a_starving_node_asks_an_unreachable_configured_peer_again_at_once_and_a_full_one_after_its_backoff():
    mesh = Mesh("QmV", "r", 1, _params(), initial={"QmBoot": ADDR, "QmDown": ADDR}, rng=random.Random(0))
    mesh.measuring = True
    mesh.on_reply("QmBoot", {"status": "full", "peers": []}, 10.0)  # asked again after 10 s
    for _ in range(4):
        mesh.on_failure("QmDown", 10.0)  # unreachable 4 times: backoff 16 s
    mesh.set_own("m", "t", 3, 1, [], ADDR)
    assert mesh.starving() and mesh.rescue(11.0) == []
    mesh.evict(11.0)
    assert [p for p, _ in mesh.rescue(11.0)] == ["QmDown"]  # eclipsed: tried again now
    assert [p for p, _ in mesh.rescue(20.0)] == ["QmBoot"]  # not every second: a node answering full; and one
    # configured peer a tick, so that unreachable ones cannot take every dial from the producers


def test_candidates_forgotten_leave_no_retry_or_failure_entries_behind():
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    for i in range(3000):  # ids learned, dialled and failed in turn, as a stream of Sybils would have it
        peer = "QmS" + "".join("123456789ABCDEFGH"[int(c, 16) % 17] for c in f"{i:05x}")
        mesh.learn([(peer, ADDR)])
        mesh.on_failure(peer, 1.0)
        mesh.on_reply(peer, {"status": "full", "peers": []}, 1.0)
    assert len(mesh.known) <= 256 and max(len(mesh.retry_at), len(mesh.failures), len(mesh.fulls)) <= 256


def test_a_fed_node_gives_a_newcomer_the_slot_of_a_neighbour_whose_groups_never_taught():
    """6 Sybils sending valid all-wrong groups (no training signal) were credited and kept every
    slot (red team 2). Credited but useless for USELESS_ROUNDS, the oldest such inbound neighbour
    yields its slot to a knocking newcomer; a useful one never does, and nobody is displaced early."""
    from swarm_node.net.scores import USELESS_ROUNDS

    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    for s in SYBILS:
        mesh.receive(s, _ann(degree=0), 1.0)
    inbound = sorted(mesh.neighbors)
    mesh.set_own("m", "t", 1, 1, [], ADDR)
    for r in range(1, USELESS_ROUNDS + 1):
        mesh.set_own("m", "t", r, 1, [], ADDR)
        for q in inbound:  # every round each delivers a valid packet the step takes: credited, not useful
            mesh.credit(q, float(r), useful=q == inbound[0])
        if r < USELESS_ROUNDS:
            assert mesh.receive("QmH", _ann(), float(r))["status"] == "full"
    assert not mesh.starving()
    assert mesh.receive("QmH", _ann(), 9.0)["status"] == "ok"
    assert "QmH" in mesh.neighbors and inbound[0] in mesh.neighbors and len(mesh.neighbors) == 4
    assert mesh.scores()[inbound[0]]["rounds_useless"] == 0


def test_subnet_of_groups_by_24_or_32_relay_or_unreadable_and_exempts_private_addresses():
    assert subnet_of("/ip4/11.12.0.7/tcp/4001") == subnet_of("/ip4/11.12.0.200/udp/1/quic") == "11.12.0.0/24"
    assert subnet_of("/ip4/11.12.1.7/tcp/4001") == "11.12.1.0/24"
    assert subnet_of("/ip6/2a00:4860:1:2::5/tcp/1") == subnet_of("/ip6/2a00:4860:ffff::1/tcp/1") == "2a00:4860::/32"
    # IPv4 inside IPv6 (red team, session 9): mapped, 6to4, NAT64, Teredo count as their IPv4 /24
    for wrapped in ("/ip6/::ffff:11.12.0.7/tcp/1", "/ip6/2002:b0c:7::1/tcp/1", "/ip6/64:ff9b::b0c:7/tcp/1"):
        assert subnet_of(wrapped) == "11.12.0.0/24", wrapped
    assert subnet_of("/ip6/2001:0:4136:e378:8000:63bf:f4f3:fff8/udp/1") == "11.12.0.0/24"  # Teredo, client 11.12.0.7
    # relayed: the relay's /24 (relay ids are free: 100 relay ids on one host made 100 groups), else the relay's id
    assert subnet_of("/ip4/11.12.0.7/tcp/1/p2p/QmRelay/p2p-circuit") == "relay:11.12.0.0/24"
    assert subnet_of("/ip4/11.12.0.9/tcp/2/p2p/QmRelay2/p2p-circuit") == "relay:11.12.0.0/24"
    assert subnet_of("/ip4/10.1.0.2/tcp/1/p2p/QmRelay/p2p-circuit") == subnet_of("/p2p/QmRelay/p2p-circuit") == "relay:QmRelay"
    assert subnet_of("/dns4/a.example/tcp/1/p2p/QmRelay/p2p-circuit") == "relay:QmRelay"  # by name: not one `relay:?`
    assert subnet_of("/ip4/not-an-ip/tcp/1") == subnet_of("/dns4/example.org/tcp/1") == "?"  # unreadable: limited
    for exempt in ("/ip4/127.0.0.1/tcp/1", "/ip4/10.1.0.2/tcp/1", "/ip4/192.168.1.4/tcp/1", "/ip4/172.17.0.3/tcp/1",
                   "/ip4/100.64.0.9/tcp/1", "/ip6/::1/tcp/1", "/ip6/fd00::1/tcp/1", "/ip6/::ffff:10.0.0.1/tcp/1",
                   "", None):
        assert subnet_of(exempt) is None, exempt


def _per_subnet_params(limit=2):
    return MeshParams(4, 6, ttl_s=600.0, max_packet_bytes=1000, out_quota=2, idle_rounds=IDLE_ROUNDS, idle_s=0.0,
                      per_subnet=limit)


def test_at_most_per_subnet_neighbours_share_one_public_subnet_either_direction():
    """k Sybils on one machine (one /24) knock and answer: they get at most `per_subnet` slots, while
    peers from other subnets, loopback ones and configured peers are taken as before."""
    mesh = Mesh("QmV", "r", 1, _per_subnet_params(), initial={"QmBoot": ADDR}, rng=random.Random(0))
    for i, s in enumerate(SYBILS):
        mesh.receive(s, _ann(), 1.0, f"/ip4/11.12.0.{i + 2}/tcp/4001")
    assert sorted(mesh.neighbors) == SYBILS[:2] and mesh.refused["subnet"] == 4
    assert mesh.receive("QmBoot", _ann(), 1.0, "/ip4/11.12.0.99/tcp/4001")["status"] == "ok"  # configured: never refused
    assert mesh.receive("QmH", _ann(), 1.0, "/ip4/11.13.0.5/tcp/4001")["status"] == "ok"
    # one we dialled, answering from the crowded subnet: treated as full, asked again later
    assert mesh.on_reply("QmOut", {"status": "ok", **_ann()}, 1.0, "/ip4/11.12.0.50/tcp/4001") == "full"
    assert "QmOut" not in mesh.neighbors and mesh.retry_at["QmOut"] > 1.0
    assert mesh.scores()["QmH"]["addr"] == "/ip4/11.13.0.5/tcp/4001"
    local = Mesh("QmV", "r", 1, _per_subnet_params(), rng=random.Random(0))  # loopback (a LAN, compose): no limit
    unlimited = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))  # per_subnet 0: the old behaviour
    for i, s in enumerate(SYBILS):
        local.receive(s, _ann(), 1.0, "/ip4/127.0.0.1/tcp/9")
        unlimited.receive(s, _ann(), 1.0, f"/ip4/11.12.0.{i + 2}/tcp/4001")
    assert len(local.neighbors) == len(unlimited.neighbors) == 4


def test_a_neighbours_group_is_fixed_when_it_is_admitted():
    """Red team (session 9): the group was read from a shared table of each peer's latest connection,
    so 1,024 refused ids flushed it (or a neighbour streamed once through a relay) and more Sybils of
    the full subnet got in. Now it is the address of the stream that admitted it, kept on the neighbour."""
    mesh = Mesh("QmV", "r", 1, _per_subnet_params(), rng=random.Random(0))
    for s in SYBILS[:2]:
        mesh.receive(s, _ann(), 1.0, "/ip4/11.12.0.7/tcp/1")
    for i in range(1024):  # each refused, from the same /24
        mesh.receive(f"QmFlood{i}", _ann(), 1.0, "/ip4/11.12.0.8/tcp/1")
    for s in SYBILS[:2]:  # the admitted neighbours announce again from elsewhere (a relay)
        mesh.receive(s, _ann(), 2.0, "/ip4/11.99.0.1/tcp/1/p2p/QmRelay/p2p-circuit")
    assert mesh.receive(SYBILS[2], _ann(), 3.0, "/ip4/11.12.0.9/tcp/1")["status"] == "full"
    assert sorted(mesh.neighbors) == SYBILS[:2]


def test_sybils_through_one_relay_hold_at_most_half_the_slots():
    mesh = Mesh("QmV", "r", 1, _per_subnet_params(), rng=random.Random(0))
    for s in SYBILS:
        mesh.receive(s, _ann(), 1.0, "/ip4/11.99.0.1/tcp/1/p2p/QmRelay/p2p-circuit")
    assert len(mesh.neighbors) == 3  # max_degree 6 // 2
    assert mesh.receive("QmH", _ann(), 1.0, "/ip4/11.13.0.5/tcp/4001")["status"] == "ok"


def test_an_anchors_address_survives_peer_exchange_that_names_it_elsewhere():
    mesh = Mesh("QmV", "r", 1, _params(), anchors={"QmA1": ["/ip4/11.1.0.1/tcp/4001"]}, rng=random.Random(0))
    mesh.learn([("QmA1", ["/ip4/11.12.0.99/tcp/1"])])
    assert mesh.candidates(1, 0.0) == [("QmA1", ["/ip4/11.1.0.1/tcp/4001", "/ip4/11.12.0.99/tcp/1"])]


def test_anchors_are_dialled_first_once_and_the_best_outbound_neighbours_become_the_next_anchors(tmp_path, caplog):
    """Bitcoin Core's anchors: the outbound neighbours that delivered most are saved, and after a
    restart dialled before any candidate (however many Sybils peer exchange named); an anchor that
    fails is a candidate like others afterwards. A broken file is ignored with a warning."""
    from swarm_node.net.scores import anchor_lanes, load_anchors, save_anchors

    anchors = {"QmA1": ["/ip4/11.1.0.1/tcp/1"], "QmA2": ["/ip4/11.2.0.1/tcp/1"]}
    mesh = Mesh("QmV", "r", 1, _params(), anchors=anchors, rng=random.Random(0))
    mesh.learn([(s, ADDR) for s in SYBILS] * 40)
    for trial in range(5):
        assert sorted(p for p, _ in mesh.candidates(2, 0.0)) == ["QmA1", "QmA2"]
    mesh.on_failure("QmA1", 0.0)
    mesh.on_reply("QmA2", {"status": "ok", **_ann()}, 0.0)
    assert mesh.anchors == {} and "QmA2" in mesh.neighbors and mesh.neighbors["QmA2"].score.outbound
    assert "QmA1" in mesh.known  # still a candidate

    mesh.on_reply("QmB", {"status": "ok", **_ann()}, 0.0)  # a second outbound neighbour, and an inbound one
    mesh.receive("QmIn", _ann(), 0.0)
    assert best_outbound(mesh.neighbors, mesh.params.out_quota) == {}  # nobody delivered yet
    for _ in range(3):
        mesh.credit("QmB", 1.0)
        mesh.credit("QmIn", 1.0)
    mesh.credit("QmA2", 1.0)
    assert list(best_outbound(mesh.neighbors, mesh.params.out_quota)) == ["QmB", "QmA2"]  # outbound only, most credits first

    path = tmp_path / "id.key.anchors"
    save_anchors(path, best_outbound(mesh.neighbors, mesh.params.out_quota), lanes={"QmB": "ab" * 16})
    assert load_anchors(path) == best_outbound(mesh.neighbors, mesh.params.out_quota)
    assert anchor_lanes(path) == {"QmB": "ab" * 16}  # the lane QmB gave us, for a restart within its linger
    for broken in ("{not json", "[" * 100_000, '{"peer": 1}', '[{"peer": "QmX", "addrs": "x"}]'):
        path.write_text(broken)
        assert load_anchors(path) == {}, broken[:20]
    assert "ignoring the anchor file" in caplog.text
    assert load_anchors(None) == load_anchors(tmp_path / "absent") == anchor_lanes(None) == {}


NETNS = unavailable()


@pytest.mark.slow
@pytest.mark.skipif(NETNS is not None, reason=f"network namespaces unavailable: {NETNS}")
def test_live_sybils_from_one_public_subnet_hold_at_most_two_slots_and_the_honest_peer_gets_in(tmp_path, procs):
    """Six live Sybils (harness/sybils.py: degree 0, accept everyone, dial every peer they learn) from
    one machine in 11.11.2.0/24 knock on V first; H comes from 11.11.1.0/24. V is a relay (no
    training, so no delivery credit would evict the idle Sybils: only the subnet limit acts). V keeps
    at most 2 of them, at every look, and takes H. Without the limit (per_subnet 0, tried once) the
    Sybils held all 6 of V's slots (4 inbound, and V's 2 outbound dials went to Sybils it learned
    from them) at every look for 60 s, and H never got in."""
    prefix = f"ssub{os.getpid() % 1000}"
    relay = [sys.executable, "-m", "swarm_node", "relay", "--run-id", "subnets", "--seconds", "150"]
    with Internet(prefix) as net:
        v_host, h_host, s_host = net.host("v"), net.host("h", subnet=1), net.host("s", subnet=2)
        v = procs(NodeProcess(v_host.cmd([*relay, "--out", str(tmp_path / "v")]), tmp_path / "v"))
        v_addr = next(a for a in v.status(lambda st: bool(st.get("join_addrs")), 60, "V up")["join_addrs"]
                      if a.startswith("/ip4/11.11.0."))
        sybils = subprocess.Popen(s_host.cmd([sys.executable, "-m", "swarm_node.harness.sybils", "--k", "6", "--peers",
                                              v_addr, "--run-id", "subnets", "--host", s_host.ip, "--seconds", "120"]),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            line = sybils.stdout.readline()
            assert line.startswith("SYBILS "), line
            ids = set(line.split()[1:])
            time.sleep(5.0)  # the Sybils dial V first
            h = procs(NodeProcess(h_host.cmd([*relay, "--out", str(tmp_path / "h"), "--peers", v_addr]), tmp_path / "h"))
            h_id = h.status(lambda st: bool(st.get("peer_id")), 60, "H up")["peer_id"]
            looks, deadline = [], time.monotonic() + 60
            while time.monotonic() < deadline:
                neighbours = (read_status(tmp_path / "v") or {}).get("neighbours") or {}
                looks.append(({p for p in neighbours if p in ids}, h_id in neighbours,
                              {subnet_of(n["addr"]) for p, n in neighbours.items() if p in ids}))
                if len(looks) > 20 and looks[-1][1]:
                    break
                time.sleep(0.5)
            print(f"\nV's Sybil neighbours per look: {[len(s) for s, _, _ in looks]}; H taken: {looks[-1][1]}")
            assert max(len(s) for s, _, _ in looks) <= 2 and len(looks[-1][0]) == 2
            assert all(nets <= {"11.11.2.0/24"} for _, _, nets in looks)  # the connection's address, as seen
            assert looks[-1][1], "H never became V's neighbour"
        finally:
            sybils.terminate()
            sybils.wait(30)
    assert leftover_namespaces(prefix) == []



def test_dht_requests_are_refused_unparsed_over_size_per_peer_rate_and_total_rate():
    """The verify bomb sent 3.8 MB StoreRequests of 2,400 records, 8 at once; every record's owner key
    was parsed on the event loop. A DHT request is now judged on its length and sender first."""
    from swarm_node.net.scores import PeerLimiter, RateLimits

    now = [0.0]
    lim = RateLimits(dht_rate=1.0, dht_burst=4.0, dht_total_rate=1.0, dht_total_burst=6.0, graylist_after=3)
    limiter = PeerLimiter(lim, clock=lambda: now[0])
    assert [limiter.allow_dht("QmA", 1_000) for _ in range(5)] == [True] * 4 + [False]  # its burst, then its rate
    assert [limiter.allow_dht("QmB", 1_000) for _ in range(3)] == [True, True, False]  # everyone's burst is spent
    now[0] += 10.0
    assert not limiter.allow_dht("QmC", lim.dht_max_bytes + 1)  # oversized: refused and counted
    assert limiter.allow_dht("QmC", lim.dht_max_bytes)
    assert not limiter.allow_dht("QmC", 10**7) and not limiter.allow_dht("QmC", 10**7)
    assert limiter.graylisted("QmC") and not limiter.allow_dht("QmC", 100)  # 3 misbehaviours: ignored


def test_announcements_from_non_neighbours_share_one_budget():
    """64 ids x 4 loops, each id within its own announce rate, got 2,910 announcements fully answered in
    30 s. Peers that are not neighbours now share one budget; neighbours do not spend it."""
    from swarm_node.net.scores import PeerLimiter, RateLimits

    now = [0.0]
    limiter = PeerLimiter(RateLimits(newcomer_rate=2.0, newcomer_burst=5.0), clock=lambda: now[0])
    assert [limiter.allow_newcomer() for _ in range(7)] == [True] * 5 + [False] * 2
    assert limiter.over_rate == 2 and not limiter.graylisted("anyone")
    now[0] += 1.0
    assert [limiter.allow_newcomer() for _ in range(3)] == [True, True, False]


def test_one_subnets_ids_take_only_their_share_of_the_newcomer_budget():
    """About 10 ids, each within its own rate, kept the shared newcomer budget empty and every honest
    stranger's announcement was closed unread (red team 7). The ids of one public /24 (or one relay's)
    now take at most a quarter of it; LAN and loopback ids share the whole of it, as before."""
    from swarm_node.net.scores import PeerLimiter, RateLimits

    now = [0.0]
    limiter = PeerLimiter(RateLimits(newcomer_rate=8.0, newcomer_burst=16.0), clock=lambda: now[0])
    sybils = [f"/ip4/1.2.3.{i}/tcp/4001" for i in range(1, 33)]
    relayed = "/ip4/1.2.3.200/tcp/4001/p2p/QmRelay/p2p-circuit"  # through a relay in the same /24
    assert sum(limiter.allow_newcomer(a) for a in sybils) == 4  # a quarter of the burst
    assert not limiter.allow_newcomer(relayed)
    assert [limiter.allow_newcomer(f"/ip4/5.6.7.{i}/tcp/4001") for i in range(3)] == [True] * 3
    now[0] += 1.0  # a second later: the subnet has earned 2 more, everyone else 8 together
    assert sum(limiter.allow_newcomer(a) for a in sybils) == 2
    assert limiter.allow_newcomer("/ip6/2a00:1450::1/tcp/4001")
    lan = PeerLimiter(RateLimits(newcomer_rate=8.0, newcomer_burst=16.0), clock=lambda: now[0])
    assert sum(lan.allow_newcomer(f"/ip4/127.0.0.1/tcp/{4000 + i}") for i in range(20)) == 16
    assert sum(lan.allow_newcomer(f"/ip4/192.168.1.{i}/tcp/4001") for i in range(5)) == 0  # the whole budget spent


def test_many_subnets_asking_share_the_newcomer_budget_equally():
    """Red team 11: with a fixed quarter per subnet, 4 attacker /24s emptied the budget (5 of 300 honest
    strangers' announcements answered). The subnets asking now share it equally: an honest stranger's
    subnet gets at least budget / (subnets asking), however many an attacker holds."""
    from swarm_node.net.scores import PeerLimiter, RateLimits

    for attacker_subnets in (1, 4, 8):
        now = [0.0]
        limiter = PeerLimiter(RateLimits(newcomer_rate=20.0, newcomer_burst=40.0), clock=lambda: now[0])
        answered = asked = 0
        for tick in range(60 * 40):  # 60 s; each attacker subnet asks 40 times a second
            now[0] = tick / 40
            for k in range(attacker_subnets):
                limiter.allow_newcomer(f"/ip4/45.{k}.0.7/tcp/4001")
            if tick % 40 == 0:  # 5 honest strangers on their own subnets, once a second each
                for h in range(5):
                    asked += 1
                    answered += limiter.allow_newcomer(f"/ip4/77.{h}.1.9/tcp/4001")
        assert answered >= 0.9 * asked, (attacker_subnets, answered, asked)


def test_fresh_ids_graylisted_one_after_another_cannot_grow_the_log_or_the_mesh(caplog):
    """Red team 12: each fresh id pushed over its rate wrote one log line (9 KB/s at 100 ids a second), a
    retry time the mesh never forgot, and a rebuild of the whole graylist. Now the first 20 a window are
    logged one by one and the rest counted in one line, and ids we never knew leave no retry time."""
    import logging

    from swarm_node.net.scores import GRAYLIST_LINES, PeerLimiter, RateLimits

    now = [0.0]
    mesh = Mesh("QmV", "r", 1, _params())
    mesh.learn([("QmKnown", ADDR)])
    limiter = PeerLimiter(RateLimits(graylist_after=1), clock=lambda: now[0],
                          on_graylist=lambda peer, s: mesh.graylist(peer, now[0] + s, now[0]))
    caplog.set_level(logging.INFO, logger="swarm_node.net.scores")
    for i in range(2000):
        now[0] = i * 0.01  # 100 fresh ids a second
        limiter.misbehaved(f"QmFresh{i}")
    limiter.misbehaved("QmKnown")
    lines = [m for m in caplog.messages if "graylisted" in m or "over its rate" in m]
    assert GRAYLIST_LINES <= len(lines) <= 3 * (GRAYLIST_LINES + 1)
    assert any("more peers were graylisted" in m for m in lines) and limiter.graylisted_total == 2001
    assert set(mesh.retry_at) == set(mesh.slots.benched) == {"QmKnown"}
    assert limiter.graylisted("QmFresh1999") and limiter.graylisted("QmKnown")


def test_a_neighbour_whose_teaching_packet_found_no_room_is_alive_not_credited():
    """Three honest producers for two peer slots: the one left out of a step is alive (Mesh.credit
    taken=False) and not idle, while one that delivers nothing is; being alive earns no credit, no
    usefulness and no starving relief (an eclipsed node still counts only what its steps took)."""
    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    for peer in ("QmLeftOut", "QmSilent", "QmTaken"):
        assert mesh.receive(peer, _ann(degree=1), 0.0)["status"] == "ok"
    for r in range(1, 3 * IDLE_ROUNDS):
        mesh.set_own("m", "t", r, 1, [], ADDR)
        mesh.credit("QmTaken", float(r))
        mesh.credit("QmLeftOut", float(r), useful=True, taken=False)
    assert mesh.evict(float(3 * IDLE_ROUNDS)) == ["QmSilent"]
    left_out = mesh.scores()["QmLeftOut"]
    assert left_out["rounds_idle"] == 0 and left_out["credits"] == 0 and left_out["rounds_useless"] > IDLE_ROUNDS
    for r in range(3 * IDLE_ROUNDS, 3 * IDLE_ROUNDS + 2):  # nothing taken for 2 rounds: starving, alive or not
        mesh.set_own("m", "t", r, 1, [], ADDR)
        mesh.credit("QmLeftOut", float(r), taken=False)
    assert mesh.starving()


@pytest.mark.parametrize("fed", [False, True])
def test_a_neighbour_a_lockdown_refuses_keeps_its_slot_against_knocking_newcomers(fed):
    """A guard's lockdown refuses H's valid packets (marked alive, never credited). Knocking Sybils used
    to take H's slot as soon as H counted as stale: 2 rounds in if the node starved (every producer
    refused), USELESS_ROUNDS if some vouched id still fed it (red team, session 29); when the lockdown
    ended, Sybils held the slots. Alive is fed: H keeps its slot, in both cases."""
    from swarm_node.net.scores import USELESS_ROUNDS

    mesh = Mesh("QmV", "r", 1, _params(), rng=random.Random(0))
    mesh.measuring = True
    for peer in ("QmH", *SYBILS[:3]):  # H joined first: the oldest inbound neighbour; each offers its packets
        assert mesh.receive(peer, _ann(degree=1, offers="a"), 0.0)["status"] == "ok"
    for r in range(1, 4):
        mesh.set_own("m", "t", r, 1, [], ADDR)
        for peer in mesh.neighbors:
            mesh.credit(peer, 10.0 * r)
    for r in range(4, 5 + USELESS_ROUNDS):  # the lockdown: H (not vouched) refused; the Sybils vouched (fed) or not
        t = 10.0 * r
        mesh.set_own("m", "t", r, 1, [], ADDR)
        mesh.credit("QmH", t, useful=False, taken=False)
        for s in SYBILS[:3]:
            mesh.credit(s, t, taken=fed)
        assert mesh.starving() != fed or r < 6  # starving: nothing credited for 2 rounds
        assert mesh.receive(f"QmKnocker{r}", _ann(r, offers="e"), t)["status"] == "full", r
        assert "QmH" in mesh.neighbors, r

"""exchange.py: echoes of our own packets are rejected (`echo`) and never end the wait for a real peer."""
from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

from swarm_node.config import RolloutConfig, load_config
from swarm_node.net import Collected, PeerInfo, Received
from swarm_node.net.memory import MemoryNetwork, MemoryTransport
from swarm_node.swarm import Rejected
from swarm_node.swarm.admit import Admission, Expectations
from swarm_node.swarm.exchange import Exchange
from swarm_node.train.rollout import generate_groups, round_examples
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.wire.codec import Group, Packet, decode
from swarm_node.wire.codec import digest as packet_digest
from swarm_node.wire.codec import encode, tokenizer_fingerprint


class AdmitAll:
    """A gate that admits every packet (the exchange's waiting is what these tests look at)."""

    def check(self, item, round_index):
        return SimpleNamespace(groups=[])

    def take_stats(self):
        return {}

    def refuses(self, peer, round_index):
        return None


def _resigned(data: bytes, sender: str, **changes) -> bytes:
    """Our packet as an echoing peer re-serves it: its own id as sender, rewards claimed 1, re-stamped."""
    packet = decode(data)
    for g in packet.groups:
        for c in g.completions:
            c.reward = 1.0
    return encode(dataclasses.replace(packet, sender=sender, created_at=packet.created_at + 1, **changes))


class ScriptedTransport:
    """A `Transport` whose successive `collect` calls deliver the batches the test scripted."""

    peer_id = "QmMe"

    def __init__(self):
        self.offered: list[bytes] = []
        self.batches: list[list[Received]] = []
        self.calls: list[int] = []  # min_peers asked for, per collect call
        self.credited: list[str] = []
        self.alive: list[str] = []  # credit(taken=False): a teaching packet the step had no room for

    def offer(self, round, policy_version, data):
        self.offered.append(data)
        return packet_digest(data)

    def collect(self, oldest, newest, min_peers, deadline_s):
        self.calls.append(min_peers)
        return Collected(self.batches.pop(0) if self.batches else [], peers=2)

    def distrust(self, peer, digest):
        pass

    def credit(self, peer, useful=True, taken=True):
        (self.credited if taken else self.alive).append(peer)

    def measure(self):
        pass

    def stats(self):
        return {}

    def peers(self):
        return []

    def neighbours(self):
        return {}


def test_echoes_of_our_packet_are_rejected_and_do_not_end_the_wait(tiny_policy, arith):
    """QmEvil re-signs our packet (whole; and one of our groups beside one of its own); both pass every
    other check. They are counted as `echo`, and the exchange keeps waiting for QmHonest's packet."""
    rollout = RolloutConfig(group_size=3, max_new_tokens=6)

    def groups(key: str, r: int) -> list[Group]:
        return generate_groups(HFSampler(tiny_policy), tiny_policy, arith, round_examples(arith, r, 2, key), rollout,
                               seed=len(key) + r)

    def wire(sender: str, r: int, gs: list[Group]) -> bytes:
        return encode(Packet(run_id="run", sender=sender, model_id="tiny-s", tokenizer=tokenizer, policy_version=1,
                             round=r, mode="vertical", groups=gs))

    cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=1", "swarm.deadline_s=20", "swarm.staleness=2"])
    tokenizer = tokenizer_fingerprint(tiny_policy.tokenizer)
    transport = ScriptedTransport()
    exchange = Exchange(transport, cfg.swarm, "tiny-s", tokenizer)
    admission = Admission(Expectations("run", tokenizer, staleness=2, max_tokens=6), tiny_policy.scorer(arith))
    own = groups("me", 5)
    exchange.offer(5, 1, own)
    ours = transport.offered[0]
    whole = _resigned(ours, "QmEvil")
    partial = wire("QmEvil", 4, [decode(ours).groups[0], *groups("evil", 4)[:1]])
    honest = wire("QmHonest", 5, groups("honest", 5))
    transport.batches = [[Received("QmEvil", 5, packet_digest(whole), whole)],
                         [Received("QmEvil", 4, packet_digest(partial), partial)],
                         [Received("QmHonest", 5, packet_digest(honest), honest)]]
    admission.check(transport.batches[0][0], 5)  # before it remembers our groups, QmEvil's copy is admissible
    admission.remember_own(own)
    accepted, stats = exchange.collect(5, admission)
    assert [peer for peer, _ in accepted] == ["QmHonest"]
    assert transport.calls == [1, 1, 1]  # each echo left the wait open: the exchange asked again
    assert stats["swarm/rejected/echo"] == 2 and stats["swarm/packets_received"] == 3
    assert stats["swarm/packets_accepted"] == 1


class PacedTransport(ScriptedTransport):
    """Scripted batches, then waits out each call's deadline like a real transport with nothing to
    deliver. Neighbours named in `credited` delivered last round; the others never did."""

    def __init__(self, neighbours: list[str], credited: set[str], refusing: frozenset = frozenset()):
        super().__init__()
        self.names, self.credited_lately, self.refusing = neighbours, credited, refusing

    def collect(self, oldest, newest, min_peers, deadline_s):  # `refusing` answer every fetch busy
        self.calls.append(min_peers)
        if self.batches:
            return Collected(self.batches.pop(0), peers=len(self.names), failed=set(self.refusing))
        time.sleep(deadline_s)
        return Collected([], peers=len(self.names), failed=set(self.refusing))

    def peers(self):  # QmNew... offer a packet of round 5; QmSilentNew... offer nothing
        return [PeerInfo(p, "m", "t", 2, 5, 1, [(5, f"sha256:{p}", 9)] if p.startswith("QmNew") else [], 0.0)
                for p in self.names]

    def neighbours(self):
        return {p: {"outbound": False, "credits": 3 if p in self.credited_lately else int(p == "QmLaggard"),
                    "rounds_idle": 1 if p in self.credited_lately else 0 if "New" in p else 3} for p in self.names}


def test_fair_arrival_a_peer_that_always_comes_first_does_not_crowd_out_the_others():
    """min_peers = 1: QmFast's packet ends the wait as before, but QmSlow, a neighbour that delivered
    lately and not yet this round, still gets fair_wait_s; one that delivered lately and goes silent
    costs at most fair_wait_s; one that never delivered (a free Sybil id) costs nothing, in its first
    rounds too unless it offers a packet of the wanted rounds."""
    def run(fair_wait_s: float, neighbours: list[str], batches: list[list[str]], credited=("QmSlow", "QmSilent")):
        cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=1", "swarm.deadline_s=20",
                                 f"swarm.fair_wait_s={fair_wait_s}"])
        transport = PacedTransport(neighbours, set(credited))
        transport.batches = [[Received(p, 5, f"sha256:{p}", p.encode()) for p in batch] for batch in batches]
        exchange = Exchange(transport, cfg.swarm, "m", "t")
        t0 = time.monotonic()
        accepted, _ = exchange.collect(5, AdmitAll())
        return [peer for peer, _ in accepted], transport.calls, time.monotonic() - t0

    assert run(2.0, ["QmFast", "QmSlow"], [["QmFast"], ["QmSlow"]])[:2] == (["QmFast", "QmSlow"], [1, 1])
    assert run(0.0, ["QmFast", "QmSlow"], [["QmFast"], ["QmSlow"]])[:2] == (["QmFast"], [1])  # the old behaviour
    accepted, calls, seconds = run(0.5, ["QmFast", "QmSilent"], [["QmFast"]])
    assert accepted == ["QmFast"] and 0.45 <= seconds < 2.0, seconds
    accepted, calls, seconds = run(2.0, ["QmFast"], [["QmFast"]])  # everyone heard from: no extra wait
    assert accepted == ["QmFast"] and calls == [1] and seconds < 0.5
    sybils = [f"QmSybil{i}" for i in range(16)]  # never delivered: not waited for, however many
    accepted, calls, seconds = run(2.0, ["QmFast", *sybils], [["QmFast"]])
    assert accepted == ["QmFast"] and calls == [1] and seconds < 0.5
    accepted, _, seconds = run(0.5, ["QmFast", "QmSilent"], [["QmFast"]], credited=())  # silent for 3 rounds
    assert seconds < 0.45
    accepted, _, seconds = run(2.0, ["QmFast", "QmLaggard"], [["QmFast"]])  # delivered 3 rounds ago: no wait
    assert seconds < 0.5
    accepted, _, _ = run(2.0, ["QmFast", "QmNew"], [["QmFast"], ["QmNew"]])  # a new neighbour's first rounds
    assert accepted == ["QmFast", "QmNew"]
    silent_new = [f"QmSilentNew{i}" for i in range(16)]  # new neighbours offering nothing: not waited for
    accepted, calls, seconds = run(2.0, ["QmFast", *silent_new], [["QmFast"]])
    assert accepted == ["QmFast"] and calls == [1] and seconds < 0.5


def test_a_new_neighbour_that_refuses_a_fetch_or_lets_a_fair_wait_run_out_is_not_waited_for_again():
    """New neighbours offering a packet of the wanted rounds: 16 that answer every fetch `busy` (a
    packet nobody can fetch) cost no wait; one that holds its fetch open costs one fair wait, in its
    first round only, not again in its second."""
    cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=1", "swarm.deadline_s=20", "swarm.fair_wait_s=1.0"])
    busy = [f"QmNewBusy{i}" for i in range(16)]
    transport = PacedTransport(["QmFast", *busy], set(), refusing=frozenset(busy))
    exchange = Exchange(transport, cfg.swarm, "m", "t")
    for r in (5, 6):
        transport.batches = [[Received("QmFast", r, f"sha256:fast{r}", b"fast")]]
        t0 = time.monotonic()
        accepted, _ = exchange.collect(r, AdmitAll())
        assert [p for p, _ in accepted] == ["QmFast"] and time.monotonic() - t0 < 0.5, r
    transport = PacedTransport(["QmFast", "QmNewStalling"], set())
    exchange = Exchange(transport, cfg.swarm, "m", "t")
    seconds = []
    for r in (5, 6):
        transport.batches = [[Received("QmFast", r, f"sha256:fast{r}", b"fast")]]
        t0 = time.monotonic()
        exchange.collect(r, AdmitAll())
        seconds.append(time.monotonic() - t0)
    assert 0.9 <= seconds[0] < 1.5 and seconds[1] < 0.5, seconds


class RefuseDistrusted(AdmitAll):
    """Admits every packet but those of the peers it distrusts (as Admission does after the guard's verdict)."""

    def __init__(self, distrusted, refused=(), reason="distrusted", valid=True):
        self.distrusted, self.refused, self.reason = set(distrusted), set(distrusted) | set(refused), reason
        self.valid = valid  # a lockdown's refusal: the packet passed every check

    def refuses(self, peer, round_index):
        return self.reason if peer in self.distrusted else None

    def check(self, item, round_index):
        if item.peer_id in self.refused:
            raise Rejected(self.reason, item.peer_id, valid=self.reason == "lockdown" and self.valid)
        return super().check(item, round_index)


def test_nobody_waits_for_a_distrusted_peer_but_another_producer_is_still_waited_for():
    """The guard distrusts QmNewBanned (train/guard.py): its packets are refused, and while every
    producer we know is distrusted the round does not wait out its deadline for packets it would
    refuse; with an honest producer beside it, the wait for that one goes on as before."""
    cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=1", "swarm.deadline_s=3", "swarm.fair_wait_s=2"])

    def run(neighbours, batches, distrusted, refused=()):
        transport = PacedTransport(neighbours, {"QmSlow"})
        transport.batches = [[Received(p, 5, f"sha256:{p}", p.encode()) for p in batch] for batch in batches]
        t0 = time.monotonic()
        accepted, stats = Exchange(transport, cfg.swarm, "m", "t").collect(5, RefuseDistrusted(distrusted, refused))
        return [peer for peer, _ in accepted], stats.get("swarm/rejected/distrusted", 0), time.monotonic() - t0

    accepted, refused, seconds = run(["QmNewBanned"], [["QmNewBanned"]], distrusted={"QmNewBanned"})
    assert accepted == [] and refused == 1 and seconds < 0.5, seconds
    # the same refusals from a peer that is not distrusted: the round waits for its next packet, as before
    accepted, _, seconds = run(["QmNewBanned"], [["QmNewBanned"]], distrusted=set(), refused={"QmNewBanned"})
    assert accepted == [] and seconds >= 2.9, seconds
    accepted, refused, seconds = run(["QmNewBanned", "QmSlow"], [["QmNewBanned"], ["QmSlow"]], distrusted={"QmNewBanned"})
    assert accepted == ["QmSlow"] and refused == 1


def test_a_packet_refused_for_the_peer_that_served_it_can_still_come_from_its_sender():
    """Red team 9: a banned (or, in a private swarm, untrusted) id that re-served an honest peer's packet
    first was refused before the sender check, the digest stayed delivered, and the genuine copy was
    never fetched. Every refusal about the serving peer now un-sees the digest for it; a refusal of
    the bytes themselves does not (any copy is the same bytes)."""
    cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=1", "swarm.deadline_s=0.3"])

    class Refuse(AdmitAll):
        def __init__(self, reason):
            self.reason = reason

        def check(self, item, round_index):
            raise Rejected(self.reason, item.peer_id)

    for reason, distrusted in (("distrusted", True), ("untrusted_peer", True), ("sender_mismatch", True),
                               ("codec_bad_type", False), ("prompt_mismatch", False)):
        transport = PacedTransport(["QmA"], set())
        transport.distrusted = []
        transport.distrust = lambda peer, digest: transport.distrusted.append((peer, digest))
        transport.batches = [[Received("QmA", 5, "sha256:h", b"h")]]
        Exchange(transport, cfg.swarm, "m", "t").collect(5, Refuse(reason))
        assert transport.distrusted == ([("QmA", "sha256:h")] if distrusted else []), reason


def test_a_peer_refused_by_a_lockdown_keeps_its_link_and_a_distrusted_one_does_not():
    """A lockdown's refusal of a packet that passed every check marks its sender alive; a refusal before
    the checks passed (any bytes kept a slot through a lockdown, red team, session 29) does not, nor a
    refusal of a peer the guard banned."""
    cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=1", "swarm.deadline_s=1"])
    for reason, valid, alive in (("lockdown", True, ["QmPeer"]), ("lockdown", False, []), ("distrusted", True, [])):
        transport = PacedTransport(["QmPeer"], set())
        transport.batches = [[Received("QmPeer", 5, "sha256:p", b"p")]]
        exchange = Exchange(transport, cfg.swarm, "m", "t")
        exchange.collect(5, RefuseDistrusted({"QmPeer"}, reason=reason, valid=valid))
        assert transport.alive == alive and transport.credited == [], (reason, valid)
        assert exchange.standing_by == set(alive)


def test_in_a_lockdown_a_vouched_producer_that_offers_late_costs_a_round_at_most_fair_wait_s():
    """A lockdown refuses QmHonest (not vouched for) and admits QmVouched, which earned tenure and now
    delivers each round's packet just before the deadline (red team, session 29): the round used to
    wait the whole deadline (20 s) every round of the lockdown. QmHonest's valid packet, refused, now
    ends the wait as an accepted one would, and QmVouched gets the fair wait, as any slower neighbour
    does; a banned peer's packet ends nothing, as before."""
    cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=1", "swarm.deadline_s=3", "swarm.fair_wait_s=0.5"])

    def seconds(reason: str) -> float:
        transport = PacedTransport(["QmHonest", "QmVouched"], {"QmHonest", "QmVouched"})
        transport.batches = [[Received("QmHonest", 5, "sha256:h", b"h")]]  # QmVouched: nothing before the deadline
        t0 = time.monotonic()
        accepted, _ = Exchange(transport, cfg.swarm, "m", "t").collect(5, RefuseDistrusted({"QmHonest"}, reason=reason))
        assert accepted == []
        return time.monotonic() - t0

    assert seconds("lockdown") < 1.0
    assert seconds("distrusted") >= 2.9  # a ban alone: the other producer is waited for, as before


def test_a_node_that_refuses_every_producer_still_fetches_their_offers_once_and_waits_for_nothing_more():
    """In a lockdown that refuses every producer the round waits for nobody, but what they offer is still
    fetched in one pass, so each refused neighbour shows it is alive. A pass of 0 s started no fetch: a
    starving node in a lockdown evicted its honest peer 2 rounds after it joined (real processes, session
    28). Real in-process transports (net/memory.py), whose collect starts fetches as libp2p's does."""
    cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=1", "swarm.deadline_s=20", "swarm.fair_wait_s=2"])
    network = MemoryNetwork()
    a, b = (MemoryTransport(network, peer, cfg=cfg.swarm) for peer in ("QmA", "QmB"))
    for transport in (a, b):
        transport.start()
    try:
        a.offer(5, 1, b"A's packet of round 5")
        t0 = time.monotonic()
        accepted, stats = Exchange(b, cfg.swarm, "m", "t").collect(5, RefuseDistrusted({"QmA"}, reason="lockdown"))
        assert accepted == [] and stats["swarm/rejected/lockdown"] == 1 and stats["swarm/packets_received"] == 1
        assert time.monotonic() - t0 < 2.0  # one pass: nothing is waited for
        assert b.neighbours()["QmA"]["rounds_idle"] == 0  # alive: it keeps its link
    finally:
        a.close()
        b.close()


def test_a_neighbour_earns_credit_unless_every_positive_it_sent_was_implausible():
    """Admitted packets earn the slot, wrong answers included (a weak honest peer keeps the link it
    learns through); a peer all of whose positives the step dropped as implausible earns nothing."""
    cfg = load_config(None, ["swarm.run_id=run"])
    transport = ScriptedTransport()
    exchange = Exchange(transport, cfg.swarm, "m", "t")
    accepted = [("QmHonest", None), ("QmWeak", None), ("QmImplausible", None), ("QmHonest", None), ("QmNotTaken", None)]
    taken = {"QmHonest", "QmWeak", "QmImplausible"}  # QmNotTaken's groups were not in the step: nothing measured
    assert exchange.credit(accepted, taken, implausible={"QmImplausible"}) == ["QmHonest", "QmWeak"]
    assert transport.credited == ["QmHonest", "QmWeak"] and transport.alive == []


def test_an_untaken_neighbour_that_could_teach_is_alive_unless_it_was_found_implausible():
    """More teaching peers than peer slots: the one the step had no room for is alive (not idle, not
    credited); one whose packet could not teach is not; and a peer whose positives a step found
    implausible gets no such pass for IMPLAUSIBLE_ROUNDS rounds, whatever its untaken packets say."""
    from swarm_node.swarm.exchange import IMPLAUSIBLE_ROUNDS

    cfg = load_config(None, ["swarm.run_id=run"])
    transport = ScriptedTransport()
    exchange = Exchange(transport, cfg.swarm, "m", "t")
    accepted = [(p, None) for p in ("QmTaken", "QmUntaken", "QmNoSignal", "QmPoisoner")]
    teaching = {"QmTaken", "QmUntaken", "QmPoisoner"}
    exchange.credit(accepted, {"QmTaken", "QmPoisoner"}, {"QmPoisoner"}, teaching=teaching, round_index=10)
    assert transport.credited == ["QmTaken"] and transport.alive == ["QmUntaken"]
    for r, alive in ((11, ["QmUntaken"]), (9 + IMPLAUSIBLE_ROUNDS, ["QmUntaken"]),
                     (10 + IMPLAUSIBLE_ROUNDS, ["QmPoisoner", "QmUntaken"])):
        transport.alive = []
        exchange.credit(accepted, {"QmTaken"}, set(), teaching=teaching, round_index=r)
        assert transport.alive == alive, (r, transport.alive)


def test_implausible_only_names_the_peers_whose_every_taken_positive_was_dropped():
    import torch

    from swarm_node.node import implausible_only
    from swarm_node.train.rollout import OWN

    sources = [OWN, OWN, "QmA", "QmA", "QmB", "QmB", "QmC"]
    positive = torch.tensor([True, False, True, True, True, True, False])
    dropped = torch.tensor([True, False, True, True, True, False, False])  # an own row never counts
    assert implausible_only(sources, positive, dropped) == {"QmA"}  # QmB kept one positive; QmC had none


def test_min_peers_does_not_wait_for_a_producer_that_left_or_ran_away():
    """min_peers = 2: a producer that offered packets of our rounds before and offers none now (it left,
    or a lockdown let it run 35 rounds ahead, as in session 25's demo) no longer keeps every round
    waiting the whole deadline; it counts again once it offers near our round."""
    cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=2", "swarm.deadline_s=20"])
    offers = {"QmA": [(5, "sha256:a", 9)], "QmB": [(5, "sha256:b", 9)]}
    transport = ScriptedTransport()
    transport.peers = lambda: [PeerInfo(p, "m", "t", 2, 5, 1, o, 0.0) for p, o in offers.items()]
    exchange = Exchange(transport, cfg.swarm, "m", "t")
    assert exchange._wanted(3, 7) == 2
    offers["QmB"] = [(50, "sha256:b50", 9)]  # far ahead
    assert exchange._wanted(3, 7) == 1
    del offers["QmB"]  # gone
    assert exchange._wanted(3, 7) == 1
    offers["QmB"] = [(6, "sha256:b6", 9)]  # back near our round
    assert exchange._wanted(3, 7) == 2
    offers["QmC"] = []  # a new producer that offers nothing yet: min_peers holds
    assert exchange._wanted(3, 7) == 2


def test_a_rounds_counters_include_what_happened_between_collects():
    """The mesh evicts while the node generates and trains (`MeshDriver.tick`), between collects; a round's
    swarm/neighbors_evicted counted only the collect's own seconds and missed most (red team 7: an eclipse
    trial recorded 1 eviction where 6 had happened)."""
    cfg = load_config(None, ["swarm.run_id=run", "swarm.min_peers=0", "swarm.deadline_s=1"])
    counters = {"neighbors_evicted": 0, "bytes_out": 0}

    class Counting(ScriptedTransport):
        def stats(self):
            return dict(counters)

    exchange = Exchange(Counting(), cfg.swarm, "tiny-s", "tok")
    _, stats = exchange.collect(1, AdmitAll())
    assert stats["swarm/neighbors_evicted"] == 0
    counters.update(neighbors_evicted=6, bytes_out=1000)  # between the collects: 6 evicted, a packet served
    _, stats = exchange.collect(2, AdmitAll())
    assert stats["swarm/neighbors_evicted"] == 6 and stats["swarm/bytes_out"] == 1000
    _, stats = exchange.collect(3, AdmitAll())
    assert stats["swarm/neighbors_evicted"] == 0 and stats["swarm/bytes_out"] == 0

"""Discovery v2: a bounded-degree mesh of peers that push their offers to each other.

Each node keeps a few *neighbors* (D = ceil(k + 3 sqrt(k)), k = the packets it waits for per
round) and tells them what it serves, in the spirit of gossipsub's IHAVE: when it offers a packet
it sends every neighbor one *announcement* {run, seq, degree, protocol, round, offers [round,
digest, size], its addresses, a few peers it knows}; the neighbor answers with its own, and
pulls packets by digest over the fetch protocol (IWANT). So a node's discovery cost per round is
about 4 D small frames whatever the size of the swarm, and its collect loop reads the neighbors'
latest announcements from memory instead of polling the DHT.

    Mesh         the state: neighbors, candidates (initial peers, peer exchange, DHT membership),
                 retry times, cheap rejection of junk; pure and synchronous (memory transport,
                 simulation and libp2p transport share it)
    MeshDriver   (driver.py) the libp2p side's background work: push on offer, keepalive, dial
                 candidates while short of neighbors, read DHT membership when out of candidates

Who may be a neighbor: a peer whose announcement passes `Mesh.judge` (same run and packet
protocol; if it offers anything, at least one offer we would fetch), while we have fewer than
D + 2 neighbors of which at most D + 2 - out_quota dialled us; otherwise we answer "full" with a
sample of our peers (peer exchange). What a peer says of itself (its degree) never keeps or costs
it a slot: over D, and whenever a candidate waits, the neighbors that delivered no accepted packet
for a few of our rounds go first, never the out_quota outbound ones we picked (`scores.py`). No
hivemind here (protocol/SPEC.md section 11).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from swarm_node.net import PeerInfo
from swarm_node.net.records import (MAX_PX, STATUS_FULL, STATUS_OK, STATUS_REFUSED, Announcement, RecordError,
                                    make_announcement, parse_announcement, parse_peer_exchange)
from swarm_node.net.scores import IDLE_BENCH_S, MAX_IDLE_BENCH_S, Score, subnet_of

logger = logging.getLogger(__name__)

MAX_KNOWN = 256  # candidate peers remembered (initial peers are never forgotten)
RETRY_S, MAX_RETRY_S = 2.0, 120.0  # a candidate that failed is retried after 2, 4, 8 ... 120 s
FULL_RETRY_S = 10.0  # a candidate that answered "full" is asked again after 10, 20, 40 ... 120 s
STARVING_ROUNDS = 2  # measuring, and no neighbour delivered a packet we took for this many rounds: starving
STARVING_BENCH_S = 10.0  # what a starving node evicts is refused this long only: it may be an honest peer restarting
USELESS_ROUNDS = 5  # a neighbour none of whose groups carried a training signal for this many rounds yields its slot to a newcomer
ISOLATED_RETRY_S = 4.0  # with no neighbor at all, no candidate waits longer than this for its retry
MAX_COUNTED = 65536  # (peer, digest) pairs remembered as already counted


def fanout(k: int) -> int:
    """Neighbors a node keeps to get k packets per round with margin: ceil(k + 3 sqrt(k)), k >= 1."""
    k = max(1, int(k))
    return math.ceil(k + 3 * math.sqrt(k))


@dataclass(frozen=True)
class MeshParams:
    degree: int  # D: dial candidates until we have this many neighbors
    max_degree: int  # a newcomer that is short of neighbors itself is still taken up to this many
    ttl_s: float  # a neighbor not heard from for this long is dropped; keepalive every ttl_s / 3
    max_packet_bytes: int  # offers declaring more are stripped (we would never fetch them)
    out_quota: int = 0  # neighbors we dialled ourselves kept at least this many: inbound fill max_degree - out_quota
    idle_rounds: int = 0  # a neighbor that delivered nothing for this many of our rounds is idle (0: never)
    idle_s: float = 0.0  # ... and for this many seconds (a node racing through rounds to catch up idles nobody)
    per_subnet: int = 0  # neighbours whose connections came from one public /24 (/32) at most, through one relay
    # max(per_subnet, max_degree // 2) (0: no limit)

    @classmethod
    def for_peers(cls, k: int, ttl_s: float, max_packet_bytes: int) -> MeshParams:
        d = fanout(k)
        return cls(d, d + 2, ttl_s, max_packet_bytes, out_quota=2, idle_rounds=5, idle_s=5.0, per_subnet=2)


@dataclass
class Neighbor:
    addrs: list[str]
    heard_at: float  # last announcement from it (request or reply)
    sent_at: float = 0.0  # last announcement we sent it
    info: PeerInfo | None = None
    seq: int = -1  # of `info`: a reply overtaken by a newer push must not replace it
    degree: int = 0  # its neighbor count, as it last announced: only sizes our peer-exchange sample
    score: Score | None = None  # what we measured of it (set when it is admitted)
    addr: str | None = None  # the remote address of its connection when it was admitted, as our transport saw it
    group: str | None = None  # what it counts in for the per-subnet limit (scores.subnet_of of addr; None: nothing)


class Mesh:
    """One node's view of its neighbors and candidates. Not thread-safe: callers serialize."""

    def __init__(self, own_id: str, run_id: str, protocol: int, params: MeshParams,
                 initial: dict[str, list[str]] | None = None, rng: random.Random | None = None,
                 manifest: str | None = None, anchors: dict[str, list[str]] | None = None):
        self.own_id, self.run_id, self.protocol, self.params = own_id, run_id, protocol, params
        self.manifest = manifest  # digest of our run manifest: peers announcing another are refused
        self.require_manifest = False  # also refuse peers that announce none (prompts by reference)
        self.rng = rng or random.Random()
        self.seq = 0
        self.own = make_announcement(run_id, 0, "", "", protocol, 0, 0, [], [], [])
        self.neighbors: dict[str, Neighbor] = {}
        self.initial = dict(initial or {})
        self.anchors = {p: a for p, a in (anchors or {}).items() if p != own_id}  # dialled first, once each
        self.known: OrderedDict[str, list[str]] = OrderedDict({**self.anchors, **self.initial})
        self.retry_at: dict[str, float] = {}
        self.failures: Counter[str] = Counter()  # consecutive failures per candidate
        self.fulls: Counter[str] = Counter()  # consecutive "full" answers per candidate
        self.dropped: Counter[str] = Counter()  # offers stripped at receipt, for the next collect's `dropped`
        self.refused: Counter[str] = Counter()  # announcements refused, by reason
        self.old_version: set[str] = set()  # peers that do not speak discovery v2
        self.round = 0  # our newest round (set_own): the clock of neighbor scores
        self.measuring = False  # packets are credited (an exchange runs): only then is a neighbor ever idle
        self.benched: dict[str, float] = {}  # peer -> refused until (evicted idle, or graylisted)
        self.evictions: Counter[str] = Counter()  # idle evictions per peer (the bench doubles)
        self.evicted_total = 0  # neighbors that lost their slot (idle or graylisted), for stats
        self._counted: set[tuple[str, str]] = set()

    # ---- our side ---------------------------------------------------------------------------------------
    def set_own(self, model_id: str, tokenizer: str, round: int, policy_version: int,
                offers: list[tuple[int, str, int]], addrs: list[str], produces: bool = True) -> None:
        self.seq = max(self.seq + 1, time.time_ns() // 1000)  # increasing, also across restarts
        self.round = max(self.round, round)
        self.own = make_announcement(self.run_id, self.seq, model_id, tokenizer, self.protocol, round, policy_version,
                                     offers, addrs, [], produces=produces, manifest=self.manifest)

    def announcement(self, to: str) -> dict:
        """Our announcement for peer `to`. It carries a peer-exchange sample (leaving `to` out) only
        when `to` may need candidates: not yet our neighbor, or short of neighbors when last heard.
        So steady-state announcements stay the same size whatever the swarm's size."""
        n = self.neighbors.get(to)
        wants_peers = n is None or n.degree < self.params.degree
        return {**self.own, "degree": len(self.neighbors), "peers": self.sample(exclude=to) if wants_peers else []}

    def sample(self, exclude: str) -> list[list]:
        """Up to MAX_PX peers others may dial: neighbors first (they are live), then other known peers."""
        live = [p for p, n in self.neighbors.items() if p != exclude and n.addrs]
        others = [p for p, a in self.known.items() if p != exclude and p not in self.neighbors and a]
        picked = self.rng.sample(live, min(MAX_PX, len(live)))
        picked += self.rng.sample(others, min(MAX_PX - len(picked), len(others)))
        return [[p, self.neighbors[p].addrs if p in self.neighbors else self.known[p]] for p in picked]

    # ---- judging and admitting peers ----------------------------------------------------------------------
    def judge(self, ann: Announcement) -> str | None:
        """Why this announcement is junk (None: keep it). Strips offers we would never fetch, counting
        each (peer, digest) once as `oversize`; an announcement that offered something but nothing
        fetchable is junk. Costs a few comparisons: no signature, no network."""
        if ann.run_id != self.run_id:
            return "wrong_run"
        if ann.info.protocol != self.protocol:
            return "wrong_protocol"
        if self.manifest is not None and (ann.manifest != self.manifest if ann.manifest is not None
                                          else self.require_manifest):
            return "wrong_manifest"  # its groups would fail our prompt or reward checks: fetch nothing
        offers = ann.info.offers
        kept = [o for o in offers if o[2] <= self.params.max_packet_bytes]
        for _, d, _ in offers:
            if (ann.info.peer_id, d) not in self._counted and all(d != k[1] for k in kept):
                if len(self._counted) >= MAX_COUNTED:
                    self._counted.clear()
                self._counted.add((ann.info.peer_id, d))
                self.dropped["oversize"] += 1
        ann.info.offers = kept
        return "unfetchable" if offers and not kept else None

    def _admit(self, ann: Announcement, now: float, outbound: bool = False, addr: str | None = None,
               group: str | None = None) -> None:
        peer = ann.info.peer_id
        n = self.neighbors.get(peer)
        if n is None:  # its group is fixed now: a neighbour that later connects from elsewhere still counts here
            n = self.neighbors[peer] = Neighbor(ann.addrs, now, score=Score(outbound, self.round, now), addr=addr,
                                                group=group)
        n.addrs, n.heard_at, n.degree = ann.addrs or n.addrs, now, ann.degree
        if ann.seq >= n.seq:
            n.info, n.seq = ann.info, ann.seq
        self.failures.pop(peer, None)
        self.fulls.pop(peer, None)
        self.retry_at.pop(peer, None)
        self.learn([(peer, n.addrs)])
        self.learn(ann.peers)

    def drop(self, peer: str) -> None:
        self.neighbors.pop(peer, None)

    def learn(self, peers: list[tuple[str, list[str]]]) -> None:
        """Remember candidates (peer exchange, membership records, initial peers), newest last. The
        addresses we were given for an initial peer or an anchor stay first: others can only add to them
        (peer exchange naming an anchor at a dead address must not make its one first dial fail)."""
        for peer, addrs in peers:
            if peer == self.own_id:
                continue
            pinned = self.initial.get(peer) or self.anchors.get(peer)
            if pinned:
                addrs = pinned + [a for a in addrs if a not in pinned][:MAX_PX]
            self.known[peer] = list(addrs) or self.known.get(peer, [])
            self.known.move_to_end(peer)
        while len(self.known) > MAX_KNOWN:
            victim = next((p for p in self.known if p not in self.initial and p not in self.neighbors
                           and p not in self.anchors), None)
            if victim is None:
                break
            del self.known[victim]

    def leaving(self, to: str) -> dict:
        """Our last announcement, saying we leave: `to` drops us at once instead of after ttl_s."""
        return {**self.announcement(to), "offers": [], "peers": [], "leaving": True}

    # ---- server: an announcement arrived --------------------------------------------------------------
    def receive(self, peer: str, obj: object, now: float, addr: str | None = None) -> dict:
        """The reply to an announcement from the authenticated `peer`, whose stream came from `addr`."""
        try:
            ann = parse_announcement(obj, peer, now)
        except RecordError:
            return self._refuse(peer, "bad_request")
        reason = self.judge(ann)
        if reason is not None:
            return self._refuse(peer, reason)
        if obj.get("leaving") is True:  # optional (2026-11): the peer goes; neither neighbor nor candidate
            self.drop(peer)
            if peer not in self.initial:
                self.known.pop(peer, None)
            return {"status": STATUS_OK, **self.announcement(to=peer)}
        group = self.group_of(peer, addr)
        if self._room_for(peer, now, group):
            self._admit(ann, now, addr=addr, group=group)
            self.neighbors[peer].sent_at = now
            return {"status": STATUS_OK, **self.announcement(to=peer)}
        self.learn([(peer, ann.addrs)] + ann.peers)  # a candidate: it may take an idle neighbor's slot
        self.refused["full"] += 1
        return {"status": STATUS_FULL, "peers": self.sample(exclude=peer)}

    def _room_for(self, peer: str, now: float, group: str | None = None) -> bool:
        """A neighbor stays; a new peer that dialled us is taken while we have fewer than `max_degree`
        neighbors and fewer than `max_degree - out_quota` that dialled us, unless it is benched; when
        full, in place of an inbound neighbour that fed us nothing (see below). Its announced
        degree plays no part (a liar says 0)."""
        if peer in self.neighbors:
            return True
        if self.benched.get(peer, 0.0) > now:
            return False
        if self.crowded(group):
            self.refused["subnet"] += 1
            return False
        inbound = [q for q, n in self.neighbors.items() if not n.score.outbound]
        if len(self.neighbors) < self.params.max_degree and len(inbound) < self.params.max_degree - self.params.out_quota:
            return True
        # Full: a newcomer takes the slot of the inbound neighbour that has fed us least, if that one
        # had its chance. Starving, any that delivered nothing for STARVING_ROUNDS (16 live Sybils
        # that dialled first kept a node at 0 packets for 12 rounds of 20 s); fed, one whose packets
        # we took (credited) but whose groups carried no training signal for USELESS_ROUNDS (6
        # Sybils sending valid all-wrong groups kept every slot: the honest peer got none in 60
        # rounds). A neighbour not credited yet (a newcomer still catching up) is only ever idle.
        starving = self.starving()
        def last_fed(q: str) -> int:
            s = self.neighbors[q].score
            return max(s.since_round, s.credited_round if starving else s.useful_round)
        stale = [q for q in inbound if self.round - last_fed(q) >= (STARVING_ROUNDS if starving else USELESS_ROUNDS)
                 and (starving or self.neighbors[q].score.credits > 0)]
        if not self.measuring or not stale:
            return False
        self._bench(min(stale, key=last_fed), now)
        return True

    def group_of(self, peer: str, addr: str | None) -> str | None:
        """What `peer`, connected from `addr` (the transport's view, never a claim), counts in for the
        per-subnet limit; None: not limited (no limit set, a configured peer, a private address)."""
        return subnet_of(addr) if self.params.per_subnet > 0 and peer not in self.initial else None

    def crowded(self, group: str | None) -> bool:
        """A newcomer of `group` would exceed its share: per_subnet neighbours per public /24 (/32), half
        the slots per relay. One machine's Sybils hold at most that many of our slots."""
        if group is None:
            return False
        limit = max(self.params.per_subnet, self.params.max_degree // 2) if group.startswith("relay:") \
            else self.params.per_subnet
        return sum(n.group == group for n in self.neighbors.values()) >= limit

    def best_outbound(self) -> dict[str, list[str]]:
        """The anchors to save: up to out_quota neighbours we dialled that delivered, most credits first."""
        delivered = [(n.score.credits, p) for p, n in self.neighbors.items()
                     if n.score.outbound and n.score.credits > 0 and n.addrs]
        return {p: self.neighbors[p].addrs for _, p in sorted(delivered, reverse=True)[:max(1, self.params.out_quota)]}

    def starving(self) -> bool:
        """We credit packets (an exchange runs) and no neighbour delivered a packet we took in the
        last STARVING_ROUNDS rounds (from round 2 on if none ever did)."""
        last = max((n.score.credited_round for n in self.neighbors.values()), default=0)
        return self.measuring and self.round - max(last, 0) >= STARVING_ROUNDS

    def _refuse(self, peer: str, reason: str) -> dict:
        self.refused[reason] += 1
        self.drop(peer)
        return {"status": STATUS_REFUSED, "reason": reason}

    # ---- client: the answer to our announcement ----------------------------------------------------------
    def on_reply(self, peer: str, obj: object, now: float, addr: str | None = None) -> str:
        """Apply `peer`'s answer (its stream came from `addr`); returns ok | full | refused | bad_reply."""
        self.anchors.pop(peer, None)  # an anchor is dialled first once; afterwards it is a candidate like others
        status = obj.get("status") if isinstance(obj, dict) else None
        if status == STATUS_OK:
            try:
                ann = parse_announcement(obj, peer, now)
            except RecordError:
                status = "bad_reply"
            else:
                reason = self.judge(ann)
                group = self.group_of(peer, addr)
                if reason is None and peer not in self.neighbors and self.crowded(group):
                    self.refused["subnet"] += 1
                    status = STATUS_FULL  # its subnet holds its share of our slots: asked again later
                elif reason is None:  # a reply from a peer not yet our neighbor: we dialled it, a candidate we picked
                    self._admit(ann, now, outbound=peer not in self.neighbors, addr=addr, group=group)
                    self.neighbors[peer].sent_at = now
                    return STATUS_OK
                else:
                    self.refused[reason] += 1
                    status = STATUS_REFUSED
        if status == STATUS_FULL:
            try:
                self.learn(parse_peer_exchange(obj.get("peers", [])))
            except RecordError:
                pass
            self.drop(peer)
            self.fulls[peer] += 1
            self.retry_at[peer] = now + min(MAX_RETRY_S, FULL_RETRY_S * 2 ** (self.fulls[peer] - 1))
            return STATUS_FULL
        elif status != STATUS_REFUSED:
            status = "bad_reply"
        self.on_failure(peer, now)
        return status

    def on_failure(self, peer: str, now: float, old_version: bool = False) -> None:
        """`peer` did not answer (or refused us): drop it, retry later with exponential backoff."""
        self.drop(peer)
        self.anchors.pop(peer, None)
        self.failures[peer] += 1
        self.retry_at[peer] = now + min(MAX_RETRY_S, RETRY_S * 2 ** (self.failures[peer] - 1))
        if old_version:
            self.old_version.add(peer)

    # ---- maintenance ----------------------------------------------------------------------------------
    def expire(self, now: float) -> list[str]:
        """Drop neighbors not heard from for ttl_s; returns them."""
        gone = [p for p, n in self.neighbors.items() if n.heard_at < now - self.params.ttl_s]
        for p in gone:
            self.drop(p)
        return gone

    def short(self) -> bool:
        """Fewer than `degree` neighbors, or fewer than out_quota we dialled ourselves (room permitting)."""
        n = len(self.neighbors)
        return n < self.params.degree or (n < self.params.max_degree and self.outbound() < self.params.out_quota)

    def dials_wanted(self) -> int:
        n, p = len(self.neighbors), self.params
        return max(p.degree - n, min(p.max_degree - n, p.out_quota - self.outbound()))

    def credit(self, peer: str, now: float, useful: bool = True, taken: bool = True) -> None:
        """`peer` delivered a packet first that the node accepted (not an echo): its slot is earned;
        `useful`: one of its groups carried a training signal (its rewards differ). `taken=False`: a
        packet that could teach, accepted, that the step had no room for (more teaching peers than
        peer slots): the neighbour is not idle (`Score.alive`), and earns nothing else."""
        self.measuring = True
        n = self.neighbors.get(peer)
        if n is not None and not taken:
            n.score.alive_round, n.score.alive_t = self.round, now
        elif n is not None:
            n.score.credits += 1
            n.score.credited_round, n.score.credited_t = self.round, now
            if useful:
                n.score.useful_round = self.round

    def idle(self, now: float) -> list[str]:
        """Neighbors that delivered nothing for idle_rounds of our rounds (and idle_s), the longest idle
        first; while starving, for STARVING_ROUNDS rounds (an eclipsed node must not sit out 5 full waits)."""
        p = self.params
        if not self.measuring:
            return []
        rounds, seconds = (STARVING_ROUNDS, 0.0) if self.starving() else (p.idle_rounds, p.idle_s)
        idle = [q for q, n in self.neighbors.items() if n.score.idle(self.round, now, rounds, seconds)]
        return sorted(idle, key=lambda q: (self.neighbors[q].score.last_round(), self.neighbors[q].score.credits))

    def outbound(self) -> int:
        return sum(1 for n in self.neighbors.values() if n.score.outbound)

    def prune(self, now: float | None = None) -> list[str]:
        """Over `degree`, drop idle neighbors (longest idle first) down to `degree`, keeping out_quota
        outbound ones; returns them. Announced degrees play no part: a neighbor that delivers keeps its
        slot. The dropped peer learns it at its next announcement, answered `full`."""
        now = time.time() if now is None else now
        dropped, spare_out = [], self.outbound() - self.params.out_quota
        for p in self.idle(now):
            if len(self.neighbors) <= self.params.degree:
                break
            if self.neighbors[p].score.outbound:
                if spare_out <= 0:
                    continue
                spare_out -= 1
            self._bench(p, now)
            dropped.append(p)
        return dropped

    def evict(self, now: float) -> list[str]:
        """Idle neighbors lose their slot even below `degree`: those that dialled us and those we dialled
        that never delivered at once, the other ones we dialled to a waiting candidate (one each). A
        node whose neighbors deliver nothing while others could is treated as eclipsed and dials out;
        the evicted are benched (refused, not dialled)."""
        if self.starving():  # eclipsed: the peers we were told to join through are tried again now
            for p in self.initial:
                if p not in self.neighbors and self.benched.get(p, 0.0) <= now:
                    self.retry_at[p] = min(self.retry_at.get(p, now), now)
        waiting = sum(1 for p in self.known if p not in self.neighbors and p != self.own_id
                      and self.retry_at.get(p, 0.0) <= now and self.benched.get(p, 0.0) <= now)
        idle = self.idle(now)
        gone = [p for p in idle if not self.neighbors[p].score.outbound or self._never_delivered(p)]
        gone += [p for p in idle if p not in gone][:waiting]
        starving = self.starving()
        for p in gone:  # what the verdict read, so that an eviction can be explained from the log alone
            sc = self.neighbors[p].score
            logger.info("idle neighbor %s: our round %d; joined %d, last credited %d, last alive %d; %.0f s since; "
                        "%d credits; %s%s", p, self.round, sc.since_round, sc.credited_round, sc.alive_round,
                        now - max(sc.since_t, sc.credited_t, sc.alive_t), sc.credits,
                        "outbound" if sc.outbound else "inbound", "; starving" if starving else "")
            self._bench(p, now)
        if gone:
            logger.info("%d idle neighbor(s) lost their slot: %s", len(gone), ", ".join(gone))
        return gone

    def _never_delivered(self, peer: str) -> bool:
        """A neighbour we dialled that has not delivered one packet since, and that the user did not name
        (a bootstrap node or relay delivers none): an empty Sybil we picked loses its slot like one
        that dialled us, within idle_rounds, even with no candidate waiting for the slot."""
        return self.neighbors[peer].score.credits == 0 and peer not in self.initial

    def _bench(self, peer: str, now: float) -> None:
        """Drop `peer` and refuse it for IDLE_BENCH_S, doubling with each eviction up to MAX_IDLE_BENCH_S;
        while starving, for STARVING_BENCH_S (the starving rules act after 2 rounds: an honest peer
        that stalled and restarts must get back; the stall/kill/resume test's B was benched 60 s)."""
        self.drop(peer)
        self.evicted_total += 1
        if self.starving():
            self.benched[peer] = now + STARVING_BENCH_S
        else:
            self.evictions[peer] += 1
            self.benched[peer] = now + min(MAX_IDLE_BENCH_S, IDLE_BENCH_S * 2 ** (self.evictions[peer] - 1))
        self.retry_at[peer] = max(self.retry_at.get(peer, 0.0), self.benched[peer])
        if len(self.benched) > MAX_KNOWN:
            self.benched = {p: t for p, t in self.benched.items() if t > now}
        if len(self.evictions) > 4 * MAX_KNOWN:
            self.evictions.clear()

    def graylist(self, peer: str, until: float) -> None:
        """`peer` misbehaved (streams over its rate): drop it, refuse it and do not dial it until `until`."""
        self.evicted_total += peer in self.neighbors
        self.drop(peer)
        self.benched[peer] = max(self.benched.get(peer, 0.0), until)
        self.retry_at[peer] = max(self.retry_at.get(peer, 0.0), until)

    def scores(self) -> dict[str, dict]:
        """What we measured of each neighbor: outbound, credits, rounds_idle, rounds_useless, and the address
        its connection came from (status.json, `swarm-node peers --scores`)."""
        return {p: {**n.score.as_dict(self.round), "addr": n.addr} for p, n in list(self.neighbors.items())}

    def candidates(self, n: int, now: float, busy: set[str] = frozenset()) -> list[tuple[str, list[str]]]:
        """Up to n peers to dial, at random among those known; first the anchors (the best outbound
        neighbours of our last run) while we have fewer than out_quota outbound, then initial peers
        while we have no neighbor at all (afterwards they are peers like others: a bootstrap node
        everyone names in `--peers` must not be dialled by every node that runs short). A node with no neighbor at all
        (cut off) retries every candidate within ISOLATED_RETRY_S, so it finds its way back soon
        after a partition heals, however long the backoff grew during the cut."""
        if not self.neighbors:
            soon = now + ISOLATED_RETRY_S
            for p, t in self.retry_at.items():
                if t > soon:
                    self.retry_at[p] = soon
        ok = [p for p in self.known if p not in self.neighbors and p not in busy and p != self.own_id
              and self.retry_at.get(p, 0.0) <= now and self.benched.get(p, 0.0) <= now]
        first = [p for p in ok if p in self.anchors] if self.outbound() < self.params.out_quota else []
        first += [p for p in ok if p in self.initial and p not in first] if not self.neighbors else []
        rest = [p for p in ok if p not in first]
        picked = first[:n] + self.rng.sample(rest, max(0, min(n - len(first[:n]), len(rest))))
        return [(p, self.known[p]) for p in picked]

    def keepalive_due(self, now: float) -> list[str]:
        return [p for p, n in self.neighbors.items() if n.sent_at < now - self.params.ttl_s / 3]

    def infos(self) -> list[PeerInfo]:
        """The neighbors' latest announcements (what the collect loop considers: at most max_degree)."""
        return [self.neighbors[p].info for p in sorted(self.neighbors) if self.neighbors[p].info is not None]

    def take_dropped(self) -> Counter:
        out, self.dropped = self.dropped, Counter()
        return out

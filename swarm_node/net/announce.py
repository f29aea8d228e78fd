"""Discovery v2: a bounded-degree mesh of peers that push their offers to each other.

Each node keeps a few *neighbors* (D = ceil(k + 3 sqrt(k)), k = the packets it waits for per round)
and, when it offers a packet, sends each one *announcement* {run, seq, degree, protocol, round, offers
[round, digest, size], its addresses, a few peers it knows} (gossipsub's IHAVE); the neighbor answers
with its own and pulls packets by digest (IWANT): about 4 D small frames a round whatever the swarm's size.
Mesh (the state, pure and synchronous, shared by every transport), MeshDriver (driver.py: push, keepalive,
dial, read members), Knockers (knockers.py: peers answered "full" that offered packets).

Who may be a neighbor: a peer whose announcement passes `Mesh.judge`, while we have fewer than D + 2 of which
at most D + 2 - out_quota dialled us; else we answer "full" with a sample of our peers (peer exchange). What a
peer says of itself never keeps or costs it a slot: idle neighbours go first, never the out_quota outbound ones
we picked (`scores.py`). No hivemind here (protocol/SPEC.md section 11).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, OrderedDict

from swarm_node.net import PeerInfo
from swarm_node.net.fetch import MISMATCH, OVERSIZE
from swarm_node.net.knockers import Knockers
from swarm_node.net.records import (MAX_ADDRS, MAX_PX, STATUS_FULL, STATUS_NOT_FOUND, STATUS_OK, STATUS_REFUSED,
                                    Announcement, RecordError, make_announcement, parse_announcement, parse_peer_exchange)
from swarm_node.net.scores import (STARVING_ROUNDS, STARVING_S, MeshParams, Neighbor, Score, crowded, subnet_of,
                                   yielding)
from swarm_node.net.slots import SlotMemory

logger = logging.getLogger(__name__)

MAX_KNOWN = 256  # candidate peers remembered (initial peers are never forgotten)
RETRY_S, MAX_RETRY_S = 2.0, 120.0  # a candidate that failed is retried after 2, 4, 8 ... 120 s
NEIGHBOR_FAILURES = 3  # announcement exchanges in a row a neighbour may fail before it loses its slot
FULL_RETRY_S = 10.0  # a candidate that answered "full" is asked again after 10, 20, 40 ... 120 s
ISOLATED_RETRY_S = 4.0  # with no neighbor at all, no candidate waits longer than this for its retry
MAX_COUNTED = 65536  # (peer, digest) pairs remembered as already counted
FALSE_OFFER = (STATUS_NOT_FOUND, MISMATCH, OVERSIZE)  # fetch outcomes that show an offer was not what it said


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
        self.heard: set[str] = set()  # the known that spoke for themselves (announcement, signed record), not hearsay
        self.retry_at: dict[str, float] = {}
        self.failures: Counter[str] = Counter()  # consecutive failures per candidate
        self.fulls: Counter[str] = Counter()  # consecutive "full" answers per candidate
        self.dropped: Counter[str] = Counter()  # offers stripped at receipt, for the next collect's `dropped`
        self.refused: Counter[str] = Counter()  # announcements refused, by reason
        self.round = 0  # our newest round (set_own): the clock of neighbor scores
        self.measuring = False  # packets are credited (an exchange runs): only then is a neighbor ever idle
        self.slots = SlotMemory()  # the bench, empty neighbours' idle clocks, slots held for their groups (slots.py)
        self.evicted_total = 0  # neighbors that lost their slot (idle or graylisted), for stats
        self.knockers = Knockers()  # refused peers whose announcement offered packets: tried by fetch while starving
        self.false_offers: OrderedDict[str, None] = OrderedDict()  # peers an offer of which we failed to fetch
        self._counted: set[tuple[str, str]] = set()

    # ---- our side ---------------------------------------------------------------------------------------
    def set_own(self, model_id: str, tokenizer: str, round: int, policy_version: int,
                offers: list[tuple[int, str, int]], addrs: list[str], produces: bool = True) -> None:
        self.seq = max(self.seq + 1, time.time_ns() // 1000)  # increasing, also across restarts
        self.round = max(self.round, round)
        self.own = make_announcement(self.run_id, self.seq, model_id, tokenizer, self.protocol, round, policy_version,
                                     offers, addrs, [], produces=produces, manifest=self.manifest)

    def announcement(self, to: str) -> dict:
        """Our announcement for peer `to`, with a peer-exchange sample (leaving `to` out) only when `to` may need
        candidates (not our neighbor, or short when last heard): the same size whatever the swarm's size."""
        n = self.neighbors.get(to)  # peers: only to one that may need candidates
        return {**self.own, "degree": len(self.neighbors),
                "peers": self.sample(exclude=to) if n is None or n.degree < self.params.degree else []}

    def sample(self, exclude: str) -> list[list]:
        """Up to MAX_PX peers others may dial: neighbors first (they are live), then other known peers."""
        live = [p for p, n in self.neighbors.items() if p != exclude and n.addrs]
        others = [p for p, a in self.known.items() if p != exclude and p not in self.neighbors and a]
        picked = self.rng.sample(live, min(MAX_PX, len(live)))
        picked += self.rng.sample(others, min(MAX_PX - len(picked), len(others)))
        return [[p, self.neighbors[p].addrs if p in self.neighbors else self.known[p]] for p in picked]

    # ---- judging and admitting peers ----------------------------------------------------------------------
    def judge(self, ann: Announcement) -> str | None:
        """Why this announcement is junk (None: keep it). Strips offers we would never fetch, counting each (peer,
        digest) once as `oversize`; offering only such is junk. A few comparisons: no signature, no network."""
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
            since = self.slots.returning(peer, now) or (self.round, now)  # empty and back soon: the same clock
            n = self.neighbors[peer] = Neighbor(ann.addrs, now, score=Score(outbound, *since), addr=addr, group=group)
        n.addrs, n.heard_at, n.degree = ann.addrs or n.addrs, now, ann.degree
        if ann.seq >= n.seq:
            n.info, n.seq = ann.info, ann.seq
        for table in (self.failures, self.fulls, self.retry_at):
            table.pop(peer, None)
        self.knockers.forget(peer)
        self.learn([(peer, n.addrs)])
        self.learn(ann.peers, hearsay=True)

    def drop(self, peer: str, now: float | None = None) -> None:
        """`peer` is no neighbour now. One that never delivered, gone at `now`, keeps its idle clock if back within
        EMPTY_MEMORY_S (`_admit`; red team 14), and its slot stays its group's till then (`scores.crowded`; 15)."""
        n = self.neighbors.pop(peer, None)
        if n is not None and now is not None and n.score is not None and not n.score.delivered():
            self.slots.left_empty(peer, (n.score.since_round, n.score.since_t), n.group, now)

    def learn(self, peers: list[tuple[str, list[str]]], hearsay: bool = False) -> None:
        """Remember candidates, newest last. Addresses given for an initial peer, an anchor, or by a peer (or its
        record) for itself stay first; `hearsay` (peer exchange) only adds (to MAX_ADDRS), and goes first when full:
        a neighbour's hearsay replaced honest candidates' addresses and flushed 200 of them (red team 9)."""
        for peer, addrs in (x for x in peers if x[0] != self.own_id):
            given = self.initial.get(peer) or self.anchors.get(peer)
            pinned = given or (hearsay and self.known.get(peer))
            if pinned:
                addrs = pinned + [a for a in addrs if a not in pinned][:MAX_PX if given else MAX_ADDRS - len(pinned)]
            self.known[peer] = list(addrs) or self.known.get(peer, [])
            self.known.move_to_end(peer)
            if not hearsay:
                self.heard.add(peer)
        while len(self.known) > MAX_KNOWN:
            free = [p for p in self.known if p not in self.initial and p not in self.neighbors and p not in self.anchors]
            victim = next((p for p in free if p not in self.heard), free[0] if free else None)
            if victim is None:
                break
            del self.known[victim]
            self.heard.discard(victim)
            for table in (self.retry_at, self.failures, self.fulls):  # a forgotten candidate leaves no trace
                table.pop(victim, None)  # (256 Sybil ids dialled in turn grew these without bound)

    def leaving(self, to: str) -> dict:
        """Our last announcement, saying we leave: `to` drops us at once instead of after ttl_s."""
        return {**self.announcement(to), "offers": [], "peers": [], "leaving": True}

    # ---- server: an announcement arrived --------------------------------------------------------------
    def receive(self, peer: str, obj: object, now: float, addr: str | None = None) -> dict:
        """The reply to an announcement from the authenticated `peer`, whose stream came from `addr`."""
        try:
            ann = parse_announcement(obj, peer, now)
        except RecordError:
            return self._refuse(peer, "bad_request", now)
        reason = self.judge(ann)
        if reason is not None:
            return self._refuse(peer, reason, now)
        if obj.get("leaving") is True:  # optional (2026-11): the peer goes; neither neighbor nor candidate
            self.drop(peer, now)
            if peer not in self.initial:
                self.known.pop(peer, None)
                self.heard.discard(peer)
            return {"status": STATUS_OK, **self.announcement(to=peer)}
        group = self.group_of(peer, addr)
        if self._room_for(peer, now, group, self.offering(peer, ann.info.offers)):
            self._admit(ann, now, addr=addr, group=group)
            self.neighbors[peer].sent_at = now
            return {"status": STATUS_OK, **self.announcement(to=peer)}
        self.learn([(peer, ann.addrs)])  # a candidate: it may take an idle neighbor's slot
        self.learn(ann.peers, hearsay=True)
        if self.offering(peer, ann.info.offers):  # a starving node fetches from them (oldest first knock first)
            self.knockers.knocked(peer, ann.info, now, group)
        self.refused["full"] += 1
        return {"status": STATUS_FULL, "peers": self.sample(exclude=peer)}

    def _room_for(self, peer: str, now: float, group: str | None = None, offering: bool = False) -> bool:
        """A neighbor stays; a new peer that dialled us is taken while we have fewer than `max_degree`
        neighbors and fewer than `max_degree - out_quota` that dialled us, unless it is benched; when
        full, in place of an inbound neighbour that fed us nothing (`scores.yielding`). Its announced
        degree plays no part (a liar says 0); whether it offers packets (`offering`) does."""
        if peer in self.neighbors:
            return True
        if self.slots.is_benched(peer, now):
            return False
        if crowded(self.neighbors, self.params, group, self.slots.vacated, now, peer):
            self.refused["subnet"] += 1
            return False
        inbound = [q for q, n in self.neighbors.items() if not n.score.outbound]
        if len(self.neighbors) < self.params.max_degree and len(inbound) < self.params.max_degree - self.params.out_quota:
            return True
        scores = {q: self.neighbors[q].score for q in inbound}
        gone = yielding(scores, self.round, self.starving(now), offering, self.offering) if self.measuring else None
        if gone is not None:
            self._bench(gone, now)
        return gone is not None

    def offering(self, peer: str, offers: list | None = None) -> bool:
        """`peer` announces (in `offers`, else its latest announcement) a packet for a round we would fetch, none of
        its offers failed to fetch since it last delivered, and, a neighbour, it delivered or joined in this round:
        a producer, as far as we can tell without fetching (one offering what it does not serve is found out by a
        fetch, or by a round without a delivery: an offer answered `busy` or stalled is never fetched)."""
        n = self.neighbors.get(peer)
        if n is not None and n.score.since_round < self.round and not n.score.delivered():
            return False
        offers = offers if offers is not None else n.info.offers if n is not None and n.info is not None else []
        ours = {o[1] for o in self.own["offers"]}  # a copy of our own offer is never fetched, so never found out
        return peer not in self.false_offers and any(abs(o[0] - self.round) <= self.params.offer_rounds
                                                     and o[1] not in ours for o in offers)

    def fetched(self, peer: str, reason: str) -> None:
        """A fetch from `peer` ended with `reason` ("ok", or why not). A neighbour's offer that came back not found,
        mismatched or oversize: it offers nothing until it delivers; a knocker's turn is over (`Knockers.fetched`)."""
        if peer not in self.neighbors:
            self.knockers.fetched(peer, ok=reason == "ok")
        elif reason in FALSE_OFFER:
            self.false_offers[peer] = self.false_offers.pop(peer, None)  # newest last, MAX_KNOWN at most
            while len(self.false_offers) > MAX_KNOWN:
                self.false_offers.popitem(last=False)

    def trials(self, now: float) -> list[PeerInfo]:
        """Starving, the knockers to fetch from as if they were neighbours (`Knockers.turn`): a packet proves a producer."""
        if not self.starving(now):
            self.knockers.pause()
            return []
        return self.knockers.turn(now, lambda p, info: p not in self.neighbors and not self.slots.is_benched(p, now)
                                  and self.offering(p, info.offers))

    def group_of(self, peer: str, addr: str | None) -> str | None:
        """What `peer`, connected from `addr` (the transport's view, never a claim), counts in for the
        per-subnet limit; None: not limited (no limit set, a configured peer, a private address)."""
        return subnet_of(addr) if self.params.per_subnet > 0 and peer not in self.initial else None

    def starving(self, now: float | None = None) -> bool:
        """We credit packets (an exchange runs) and no neighbour delivered a packet we took in the
        last STARVING_ROUNDS rounds (from round 2 on if none ever did) and STARVING_S seconds."""
        last = max((n.score.credited_round for n in self.neighbors.values()), default=0)
        last_t = max((n.score.credited_t for n in self.neighbors.values()), default=0.0)
        now = time.time() if now is None else now
        return self.measuring and self.round - max(last, 0) >= STARVING_ROUNDS and now - last_t >= STARVING_S

    def _refuse(self, peer: str, reason: str, now: float) -> dict:
        self.refused[reason] += 1
        self.drop(peer, now)
        return {"status": STATUS_REFUSED, "reason": reason}

    # ---- client: the answer to our announcement ----------------------------------------------------------
    def on_reply(self, peer: str, obj: object, now: float, addr: str | None = None) -> str:
        """Apply `peer`'s answer (its stream came from `addr`); returns ok | full | refused | bad_reply."""
        self.anchors.pop(peer, None)  # an anchor is dialled first once; afterwards it is a candidate like others
        if peer not in self.neighbors and self.slots.is_benched(peer, now):
            return STATUS_REFUSED  # a push sent before we benched it: it stays out (a Sybil held a slot 19 rounds so)
        status = obj.get("status") if isinstance(obj, dict) else None
        if status == STATUS_OK:
            try:
                ann = parse_announcement(obj, peer, now)
            except RecordError:
                status = "bad_reply"
            else:
                reason = self.judge(ann)
                group = self.group_of(peer, addr)
                new = reason is None and peer not in self.neighbors
                if new and crowded(self.neighbors, self.params, group, self.slots.vacated, now, peer):
                    self.refused["subnet"] += 1
                    status = STATUS_FULL  # its subnet holds its share of our slots: asked again later
                elif new and len(self.neighbors) >= self.params.max_degree + self.params.out_quota:
                    status = STATUS_FULL  # a starving node's rescue dials go this far past its slots (`rescue`), no
                    # further: dials all out at once, or answers never asked for, made 14 of 6 (red team 17)
                elif reason is None:  # a reply from a peer not yet our neighbor: we dialled it, a candidate we picked
                    self._admit(ann, now, outbound=peer not in self.neighbors, addr=addr, group=group)
                    self.neighbors[peer].sent_at = now
                    return STATUS_OK
                else:
                    self.refused[reason] += 1
                    status = STATUS_REFUSED
        if status == STATUS_FULL:
            try:
                self.learn(parse_peer_exchange(obj.get("peers", [])), hearsay=True)
            except RecordError:
                pass
            self.drop(peer, now)
            self.fulls[peer] += 1
            self.retry_at[peer] = now + min(MAX_RETRY_S, FULL_RETRY_S * 2 ** (self.fulls[peer] - 1))
            return STATUS_FULL
        elif status != STATUS_REFUSED:
            status = "bad_reply"
        self.drop(peer, now)  # it answered: a refusal is not a lost push
        self.on_failure(peer, now)
        return status

    def on_failure(self, peer: str, now: float, old_version: bool = False) -> None:
        """`peer` did not answer: retry later with exponential backoff; a neighbour keeps its slot until
        NEIGHBOR_FAILURES in a row (or ttl_s of silence): one push lost to a stream slot an attacker held
        must not cut a delivering link (red team 7). A peer that does not speak v2 is dropped at once."""
        self.anchors.pop(peer, None)
        self.failures[peer] += 1
        if not old_version and peer in self.neighbors and self.failures[peer] < NEIGHBOR_FAILURES:
            return
        self.drop(peer, now)
        self.retry_at[peer] = now + min(MAX_RETRY_S, RETRY_S * 2 ** (self.failures[peer] - 1))

    # ---- maintenance ----------------------------------------------------------------------------------
    def expire(self, now: float) -> list[str]:
        """Drop neighbors not heard from for ttl_s; returns them."""
        gone = [p for p, n in self.neighbors.items() if n.heard_at < now - self.params.ttl_s]
        for p in gone:
            self.drop(p, now)
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
        self.false_offers.pop(peer, None)
        n = self.neighbors.get(peer)
        if n is None and taken:
            self.knockers.delivered(peer)  # a knocker on trial: proven, dialled first
        elif n is not None and not taken:
            n.score.alive_round, n.score.alive_t = self.round, now
        elif n is not None:
            n.score.credits += 1
            n.score.credited_round, n.score.credited_t = self.round, now
            if useful:
                n.score.useful_round = self.round

    def idle(self, now: float) -> list[str]:
        """Neighbors that delivered nothing for idle_rounds of our rounds (and idle_s), the longest idle
        first; while starving, for STARVING_ROUNDS rounds (an eclipsed node must not sit out 5 full waits) and
        idle_s (in a guard's lockdown, rounds of 0.5 s evicted an honest newcomer 2 s after it joined)."""
        p = self.params
        if not self.measuring:
            return []
        rounds = STARVING_ROUNDS if self.starving(now) else p.idle_rounds
        idle = [q for q, n in self.neighbors.items() if n.score.idle(self.round, now, rounds, p.idle_s)]
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
        if self.starving(now):  # eclipsed: the peers we were told to join through are tried again now (one that
            for p in self.initial:  # answered "full" after its backoff: `rescue` would otherwise ask it every second)
                if p not in self.neighbors and not self.slots.is_benched(p, now) and not self.fulls[p]:
                    self.retry_at[p] = min(self.retry_at.get(p, now), now)
        waiting = sum(1 for p in self.known if self._dialable(p, now))
        idle = self.idle(now)
        # those that dialled us, and those we dialled that never delivered unless the user named them (a bootstrap)
        gone = [p for p in idle if not self.neighbors[p].score.outbound or
                (self.neighbors[p].score.credits == 0 and p not in self.initial)]
        gone += [p for p in idle if p not in gone][:waiting]
        starving = "; starving" if self.starving(now) else ""
        for p in gone:  # what the verdict read, so that an eviction can be explained from the log alone
            logger.info("idle neighbor %s: %s%s", p, self.neighbors[p].score.explain(self.round, now), starving)
            self._bench(p, now)
        if gone:
            logger.info("%d idle neighbor(s) lost their slot: %s", len(gone), ", ".join(gone))
        return gone

    def _bench(self, peer: str, now: float) -> None:
        """Drop `peer`, refuse it for `slots.bench_s` (60 s, 10 s if it delivered, then went silent; doubling per
        eviction); starving, STARVING_BENCH_S (an honest peer that stalled and restarts must get back)."""
        n = self.neighbors.get(peer)
        silent = n is not None and n.silent(now, self.params.idle_s)
        self.drop(peer)
        self.evicted_total += 1
        until = self.slots.evicted(peer, n and n.group, now, silent, self.starving(now))  # its slot: its group's till then
        self.retry_at[peer] = max(self.retry_at.get(peer, 0.0), until)

    def graylist(self, peer: str, until: float, now: float) -> None:
        """`peer` misbehaved (streams over its rate): drop it, refuse it and do not dial it until `until`; its slot
        stays its group's till then (an empty id that got itself graylisted left no hold: red team 16)."""
        n = self.neighbors.get(peer)
        self.evicted_total += n is not None
        self.drop(peer, now)
        if peer in self.known:  # (a neighbour always is) fresh ids graylisted one after another grew the bench without
            self.slots.bench(peer, n and n.group, until, now)  # bound (red teams 12-13): the limiter refuses them meanwhile
            self.retry_at[peer] = max(self.retry_at.get(peer, 0.0), until)

    def scores(self) -> dict[str, dict]:
        """What we measured of each neighbor: outbound, credits, rounds_idle, rounds_useless, whether it offers
        (`offering`), and the address its connection came from (status.json, `swarm-node peers --scores`)."""
        return {p: {**n.score.as_dict(self.round), "offers": self.offering(p), "addr": n.addr}
                for p, n in list(self.neighbors.items())}

    def credited(self) -> set[str]:
        """The neighbors whose packets our steps took (credits > 0): fetched first, from slots of their own."""
        return {p for p, n in self.neighbors.items() if n.score.credits}

    def candidates(self, n: int, now: float, busy: set[str] = frozenset()) -> list[tuple[str, list[str]]]:
        """Up to n peers to dial, at random among those known; first the anchors (our last run's best outbound) while
        we have fewer than out_quota outbound, then initial peers while we have no neighbor at all (not whenever
        short: everyone names the bootstrap node; a starving node, see `rescue`). Cut off (no neighbor), every
        candidate is retried within ISOLATED_RETRY_S: a node finds its way back soon after a partition heals."""
        if not self.neighbors:
            soon = now + ISOLATED_RETRY_S
            for p, t in self.retry_at.items():
                if t > soon:
                    self.retry_at[p] = soon
        ok = [p for p in self.known if self._dialable(p, now, busy)]
        first = [p for p in ok if p in self.anchors] if self.outbound() < self.params.out_quota else []
        first += [p for p in ok if p in self.initial and p not in first] if not self.neighbors else []
        rest = [p for p in ok if p not in first]
        picked = first[:n] + self.rng.sample(rest, max(0, min(n - len(first[:n]), len(rest))))
        return [(p, self.known[p]) for p in picked]

    def rescue(self, now: float, busy: set[str] = frozenset()) -> list[tuple[str, list[str]]]:
        """Starving, the peers to dial even while our slots are full (of Sybils): one initial peer, the knockers whose
        packets we took without a slot (`trials`), newest first, then the others in the order they first knocked,
        each once; out_quota at a time, none while out_quota beyond max_degree are ours, and knockers that only
        offered while none is (256 Sybil ids held every extra slot; one is now kept for the proven)."""
        cap = self.params.max_degree + self.params.out_quota
        if not self.starving(now) or len(self.neighbors) >= cap:
            return []
        picked = [p for p in self.initial if self._dialable(p, now, busy)][:1]  # unreachable ones: not every dial
        picked += [p for p in reversed(self.knockers.proven) if self._dialable(p, now, busy) and p not in picked]
        if len(self.neighbors) + len(picked) < cap - 1:
            picked += [p for p in self.knockers.queue if self._dialable(p, now, busy) and p not in picked
                       and not self.knockers.on_trial(p)][:1]
        for p in picked[:self.params.out_quota]:
            if p not in self.knockers.proven:
                self.knockers.forget(p)
        return [(p, self.known[p]) for p in picked[:self.params.out_quota]]

    def _dialable(self, peer: str, now: float, busy: set[str] = frozenset()) -> bool:
        """A known candidate we may dial now: not us, not a neighbour, not being dialled, retry due, not benched."""
        return peer in self.known and peer != self.own_id and peer not in self.neighbors and peer not in busy \
            and self.retry_at.get(peer, 0.0) <= now and not self.slots.is_benched(peer, now)

    def infos(self) -> list[PeerInfo]:
        """The neighbors' latest announcements (what the collect loop considers: at most max_degree)."""
        return [self.neighbors[p].info for p in sorted(self.neighbors) if self.neighbors[p].info is not None]

    def take_dropped(self) -> Counter:
        out, self.dropped = self.dropped, Counter()
        return out

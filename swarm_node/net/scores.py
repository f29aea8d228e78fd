"""What a node measured about its neighbours, never what they claim (issue 27; protocol/SPEC.md section 11).

A peer's announcement says how many neighbours it has (`degree`); a liar says 0 and was kept while
honest neighbours, truthfully above D, pruned each other (6 live Sybils eclipsed a node in ~5 s).
So a neighbour's slot now rests on what this node saw itself:

    credits     accepted, non-echo packets it delivered first (the exchange tells the transport,
                `Transport.credit`), and our round and time of the last one
    outbound    whether we dialled it, to a candidate we picked: inbound peers fill at most
                max_degree - out_quota slots, and pruning never goes below out_quota outbound
    idle        a neighbour that delivered nothing for idle_rounds of our rounds (and idle_s
                seconds) is pruned first when over D, and loses its slot to a candidate even below
                D; it is then benched (refused) for a while, so it cannot take the slot straight back
                (`slots.py`: the bench, and the slot held for its group)
    group       the /24 (IPv4) or /32 (IPv6) of the address its connection came from when it became a
                neighbour, or the relay it came through (`subnet_of`): at most `per_subnet`
                neighbours share a subnet and half the slots a relay, so one machine's k Sybils
                hold at most that many; private and loopback addresses and configured peers excepted
    anchors     the outbound neighbours that delivered most, kept beside the identity file with the lane
                each gave us, and dialled first after a restart (Bitcoin Core's anchor connections)

Rates (`PeerLimiter`): a token bucket per peer for incoming announcement and fetch streams; a
stream over the rate is closed before anything is read and counts as misbehaviour; a peer with
`graylist_after` of those within `misbehaviour_window_s` is ignored (every stream closed at once)
for `graylist_s`.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swarm_node.config import SwarmConfig
from swarm_node.fsutil import write_json_atomic
from swarm_node.net import PeerInfo
from swarm_node.net.reach import observed_ip

logger = logging.getLogger(__name__)

STARVING_ROUNDS = 2  # measuring, and no neighbour delivered a packet we took for this many rounds: starving
STARVING_S = 10.0  # ... and seconds (a node racing through rounds to catch up evicted its honest peer after 2 s)
USELESS_ROUNDS = 5  # a neighbour none of whose groups carried a training signal for this many rounds yields its slot to a newcomer


MAX_ANCHOR_ADDRS = 8  # addresses kept per anchor


NAT64 = ipaddress.ip_network("64:ff9b::/96")  # IPv4 addresses as a v6-only network's NAT64 gateway shows them


def subnet_of(addr: str | None) -> str | None:
    """The group a connection's remote multiaddr counts in for the per-subnet neighbour limit: the
    /24 of an IPv4 address (also one carried inside IPv6: mapped, 6to4, Teredo, NAT64), the /32 of
    an IPv6 one (a /48 is one free tunnel account), `relay:<its /24, else its id>` for a relayed (p2p-circuit)
    connection, `?` for an address it cannot read. None (no limit) only for no address at all and
    for non-global ones (loopback, RFC 1918, CGNAT, ULA, link-local: a LAN or docker-compose swarm,
    where every honest node shares one subnet)."""
    if not addr:
        return None
    parts = addr.split("/")
    if "p2p-circuit" in parts:  # the relay's own /24 where the address shows one: relay ids are free, and 100 ids on
        i = parts.index("p2p-circuit")  # one host made 100 groups (session 32); else (a private or named relay) its id
        if i < 2:
            return "relay:?"
        inner = subnet_of("/".join(parts[:i - 2]))
        return f"relay:{inner if inner not in (None, '?') else parts[i - 1]}"
    try:
        ip = ipaddress.ip_address(observed_ip(addr) or "")
    except ValueError:
        return "?"
    if ip.version == 6:
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None) or \
            (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in NAT64 else None)
        ip = inner or ip
    if not ip.is_global:
        return None
    return str(ipaddress.ip_network(f"{ip}/{24 if ip.version == 4 else 32}", strict=False))


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
    offer_rounds: int = 64  # an offer this many rounds from ours or closer is one we fetch (max(staleness, max_lag))

    @classmethod
    def for_peers(cls, k: int, ttl_s: float, max_packet_bytes: int, offer_rounds: int = 64) -> MeshParams:
        d = fanout(k)
        return cls(d, d + 2, ttl_s, max_packet_bytes, out_quota=2, idle_rounds=5, idle_s=5.0, per_subnet=2,
                   offer_rounds=offer_rounds)

    @classmethod
    def for_config(cls, k: int, cfg: SwarmConfig) -> MeshParams:
        """A node's mesh for k packets a round under `cfg`: its record ttl, packet size limit and fetch window."""
        return cls.for_peers(k, cfg.record_ttl_s, cfg.max_packet_bytes, max(cfg.staleness, cfg.max_lag))


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

    def silent(self, now: float, idle_s: float) -> bool:
        """It delivered since it joined, then nothing was heard from it for idle_s: its link is down (`slots.bench_s`)."""
        return self.score is not None and self.score.delivered() and self.heard_at < now - idle_s


def _anchor_rows(path: Path | None) -> list[dict]:
    """The rows `save_anchors` wrote ([] if none, or unreadable: a warning, never an error)."""
    if path is None or not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())
        return [r for r in rows if isinstance(r, dict) and isinstance(r.get("peer"), str) and isinstance(r.get("addrs"), list)]
    except (OSError, ValueError, TypeError, RecursionError) as e:
        logger.warning("ignoring the anchor file %s (%s); it is rewritten once neighbours deliver", path, e)
        return []


def load_anchors(path: Path | None) -> dict[str, list[str]]:
    """The anchors saved by `save_anchors` ({} if none, or unreadable)."""
    anchors = {r["peer"]: [a for a in r["addrs"] if isinstance(a, str)][:MAX_ANCHOR_ADDRS] for r in _anchor_rows(path)}
    if anchors:
        logger.info("dialling first the %d neighbour(s) that delivered most in our last run (%s)", len(anchors), path)
    return anchors


def anchor_lanes(path: Path | None) -> dict[str, object]:
    """The lanes the anchors had given us, as saved (unchecked: `Lanes.remember` checks them)."""
    return {r["peer"]: r["lane"] for r in _anchor_rows(path) if "lane" in r}


def crowded(neighbors: dict[str, Neighbor], params: MeshParams, group: str | None,
            vacated: dict[str, tuple[str, float]] | None = None, now: float = 0.0, newcomer: str = "") -> bool:
    """A newcomer of `group` would exceed its share of `neighbors`: per_subnet per public /24 (/32), half the
    slots when it comes through a relay, counting the relay's /24 and that /24's own connections together (else
    one /24 held 2 slots directly and 3 more through a relay on it: red team 15). One machine's Sybils hold at
    most that many of a node's slots. `vacated`: ex-neighbours -> (group, until): a slot an idle one was evicted
    from, or an empty one left, stays its group's until then, but for its own return (ids are free: with a
    fresh id after each eviction, 2 subnets' empty Sybils held every inbound slot; red teams 14-15)."""
    if group is None:
        return False
    base = group.removeprefix("relay:")

    def count(same) -> int:  # neighbours, and live holds but the newcomer's own, of groups `same` accepts
        held = sum(same(g) and t > now for p, (g, t) in (vacated or {}).items() if p != newcomer)
        return sum(same(n.group or "") for n in neighbors.values()) + held

    # direct and relayed together: half the slots; direct alone: per_subnet (a public node that relays for
    # our NAT'd neighbours is still one we may take)
    return count(lambda g: g.removeprefix("relay:") == base) >= max(params.per_subnet, params.max_degree // 2) or \
        (group == base and count(lambda g: g == base) >= params.per_subnet)


def best_outbound(neighbors: dict[str, Neighbor], out_quota: int) -> dict[str, list[str]]:
    """The anchors to save: up to out_quota neighbours we dialled that delivered, most credits first."""
    delivered = [(n.score.credits, p) for p, n in neighbors.items() if n.score.outbound and n.score.credits > 0 and n.addrs]
    return {p: neighbors[p].addrs for _, p in sorted(delivered, reverse=True)[:max(1, out_quota)]}


def save_anchors(path: Path, anchors: dict[str, list[str]], lanes: dict[str, str] | None = None) -> None:
    """Write the anchors, with the lane each gave us (`lanes`), atomically (a crash leaves the old file or the new
    one, never half of one). A node restarted within a lane's linger reaches the anchor on it, shielded or not."""
    write_json_atomic(path, [{"peer": p, "addrs": a[:MAX_ANCHOR_ADDRS], **({"lane": lanes[p]} if p in (lanes or {}) else {})}
                             for p, a in anchors.items()])


@dataclass
class Score:
    """One neighbour's record, as this node measured it."""

    outbound: bool  # we dialled it, to a candidate we picked
    since_round: int  # our round when it became a neighbour
    since_t: float  # our clock then
    credits: int = 0  # accepted, non-echo packets it delivered first
    credited_round: int = -1  # our round at its last credit
    credited_t: float = float("-inf")  # our clock at its last credit
    useful_round: int = -1  # our round when a group of it last carried a training signal (mixed rewards)
    alive_round: int = -1  # our round when it last delivered a packet that could teach and the step had no room for
    alive_t: float = float("-inf")  # our clock then

    def idle(self, round: int, now: float, idle_rounds: int, idle_s: float) -> bool:
        """Delivered nothing for idle_rounds of our rounds and idle_s seconds (since it joined, its last
        credit, or its last packet that could teach and found no room in our step)."""
        if idle_rounds <= 0:
            return False
        last_t = max(self.since_t, self.credited_t, self.alive_t)
        return round - self.last_round() >= idle_rounds and now - last_t >= idle_s

    def delivered(self) -> bool:
        """Credited, or alive, since it joined."""
        return self.credits > 0 or self.alive_round >= self.since_round

    def last_round(self) -> int:
        """Our round when it joined, or last delivered (credited, or alive)."""
        return max(self.since_round, self.credited_round, self.alive_round)

    def explain(self, round: int, now: float) -> str:
        """What an eviction verdict read, for the log: an eviction can be explained from the log alone."""
        return (f"our round {round}; joined {self.since_round}, last credited {self.credited_round}, last alive "
                f"{self.alive_round}; {now - max(self.since_t, self.credited_t, self.alive_t):.0f} s since; "
                f"{self.credits} credits; {'outbound' if self.outbound else 'inbound'}")

    def as_dict(self, round: int) -> dict:
        return {"outbound": self.outbound, "credits": self.credits, "rounds_idle": max(0, round - self.last_round()),
                "rounds_useless": max(0, round - max(self.since_round, self.useful_round))}


def yielding(inbound: dict[str, Score], round: int, starving: bool, newcomer_offers: bool,
             offers: Callable[[str], bool]) -> str | None:
    """When a node is full, the inbound neighbour whose slot a knocking newcomer takes (None: nobody).
    Starving, one that delivered nothing for STARVING_ROUNDS (16 live Sybils that dialled first kept a
    node at 0 packets for 12 rounds of 20 s), and at once one that offers nothing (`offers`) if the
    newcomer offers packets (64 Sybils that dialled first refilled each freed slot before the honest
    peer knocked again: none of its packets in 30 rounds). Fed, one whose packets we took (credited)
    but whose groups carried no training signal for USELESS_ROUNDS (6 Sybils sending valid all-wrong
    groups kept every slot: the honest peer got none in 60 rounds). A neighbour not credited yet (a
    newcomer still catching up) is otherwise only ever idle. One alive (a valid packet refused by a
    guard's lockdown, or one that could teach and found no room in our step) is fed: knocking Sybils took the slot of
    the honest peer a lockdown refused (red team, session 29). The one that fed us least goes first."""
    def last_fed(q: str) -> int:
        s = inbound[q]
        return max(s.since_round, s.alive_round, s.credited_round if starving else s.useful_round)
    stale = [q for q, s in inbound.items() if round - last_fed(q) >= (STARVING_ROUNDS if starving else USELESS_ROUNDS)
             and (starving or s.credits > 0)]
    if starving and newcomer_offers and not stale:
        stale = [q for q in inbound if not offers(q)]
    return min(stale, key=lambda q: (last_fed(q), inbound[q].since_t), default=None)


class TokenBucket:
    """`rate` tokens a second up to `burst`; `take()` spends one if there is one."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] | None = None):
        self.rate, self.burst, self.clock = rate, burst, clock  # clock: time.monotonic, looked up at each call
        self.tokens, self.t = burst, self.now()

    def now(self) -> float:
        return self.clock() if self.clock is not None else time.monotonic()

    def take(self) -> bool:
        now = self.now()
        self.tokens, self.t = min(self.burst, self.tokens + (now - self.t) * self.rate), now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(frozen=True)
class RateLimits:
    """Per-peer rates of incoming streams (issue 27: one id opened 1,427 announce streams a second)."""

    announce_rate: float = 4.0  # announcement streams a peer may open per second (an honest one pushes <= 2/s)
    announce_burst: float = 16.0  # ... and at once
    newcomer_rate: float = 20.0  # announcement streams per second from peers that are not our neighbours, all
    # together (64 ids x 4 loops each stayed within its own rate: 2,910 announcements answered in 30 s)
    newcomer_burst: float = 40.0  # ... and at once
    newcomer_subnet_share: float = 0.25  # of that budget, the most the ids of one public /24 (/32; a relay's) may
    # take, and less while more subnets ask: an equal share each (about 10 ids within their own rates emptied it,
    # shutting every honest stranger out, red team 7; 4 subnets at a quarter each did the same, red team 11)
    fetch_rate: float = 20.0  # fetch streams a peer may open per second (one packet per round, resumes)
    fetch_burst: float = 64.0  # ... and at once
    dialback_rate: float = 1.0  # dial-back streams a peer may open per second (an honest one asks once at start)
    dialback_burst: float = 4.0  # ... and at once
    dht_rate: float = 10.0  # DHT requests (store, find, ping) a peer may send per second (an honest one: a few a minute)
    dht_burst: float = 32.0  # ... and at once
    dht_total_rate: float = 100.0  # DHT requests from all peers together per second (many cheap ids share this)
    dht_total_burst: float = 200.0  # ... and at once
    dht_max_bytes: int = 64 * 1024  # a larger DHT request is refused unparsed (an honest store: one ~1.5 KB record)
    graylist_after: int = 32  # streams over the rate within misbehaviour_window_s that get the peer ignored
    misbehaviour_window_s: float = 10.0  # misbehaviour older than this is forgotten
    graylist_s: float = 120.0  # how long a graylisted peer is ignored (every stream closed unread)


MAX_LIMITED_PEERS = 4096  # peers whose buckets are remembered (the most recent)
GRAYLIST_LINES = 20  # graylistings logged one by one per misbehaviour window; the rest are counted in one line


class PeerLimiter:
    """A token bucket per (peer, stream kind); a stream over the rate is misbehaviour; a peer with
    `graylist_after` misbehaviours within the window is graylisted for `graylist_s`. `on_graylist(peer,
    seconds)` is called once per graylisting (the mesh drops and benches it). Not thread-safe."""

    def __init__(self, limits: RateLimits = RateLimits(), clock: Callable[[], float] | None = None,
                 on_graylist: Callable[[str, float], None] | None = None):
        self.limits, self.clock, self.on_graylist = limits, clock, on_graylist
        self.buckets: OrderedDict[tuple[str, str], TokenBucket] = OrderedDict()
        self.strikes: OrderedDict[str, list[float]] = OrderedDict()  # peer -> times of its recent misbehaviour
        self.gray_until: OrderedDict[str, float] = OrderedDict()  # peer -> ignored until, soonest first
        self.logged_at, self.lines, self.unlogged = float("-inf"), 0, 0  # graylistings logged in this window, and not
        self.dht_total = TokenBucket(limits.dht_total_rate, limits.dht_total_burst, clock)
        self.newcomers = TokenBucket(limits.newcomer_rate, limits.newcomer_burst, clock)
        self.newcomer_groups: OrderedDict[str, TokenBucket] = OrderedDict()  # subnet -> its share of the budget
        self.newcomer_asked: OrderedDict[str, float] = OrderedDict()  # subnet -> when it last asked, oldest first
        self.over_rate = self.graylisted_total = 0  # counters: streams closed over the rate, graylistings

    def now(self) -> float:
        return self.clock() if self.clock is not None else time.monotonic()

    def graylisted(self, peer: str) -> bool:
        return self.gray_until.get(peer, float("-inf")) > self.now()

    def allow(self, peer: str, kind: str) -> bool:
        """Whether `peer` may open a stream of `kind` ("announce" | "fetch") now; False: close it unread."""
        now = self.now()
        if self.gray_until.get(peer, float("-inf")) > now:
            return False
        bucket = self.buckets.pop((peer, kind), None)
        if bucket is None:
            lim = self.limits
            rate, burst = {"announce": (lim.announce_rate, lim.announce_burst), "fetch": (lim.fetch_rate, lim.fetch_burst),
                           "dht": (lim.dht_rate, lim.dht_burst), "dialback": (lim.dialback_rate, lim.dialback_burst)}[kind]
            bucket = TokenBucket(rate, burst, self.clock)
        self.buckets[(peer, kind)] = bucket
        while len(self.buckets) > MAX_LIMITED_PEERS:
            self.buckets.popitem(last=False)
        if bucket.take():
            return True
        self.over_rate += 1
        self.misbehaved(peer, now)
        return False

    def allow_newcomer(self, addr: str | None = None) -> bool:
        """Whether to read an announcement from a peer that is not our neighbour now (a budget shared by all
        of them: many cheap ids each within its own rate must not add up), from `addr` (the stream's remote
        multiaddr): the public subnets that asked within misbehaviour_window_s share it equally (at most
        newcomer_subnet_share each), so a stranger's subnet gets at least budget / (subnets asking) however
        many subnets an attacker holds (a relayed one counts in its relay's subnet; LAN and loopback ids share
        the whole budget). Not misbehaviour: it may be honest and is asked to come back (its dial backs off)."""
        group = subnet_of(addr.split("/p2p-circuit")[0] if addr else None)
        bucket = None
        if group is not None:
            lim, now = self.limits, self.now()
            self.newcomer_asked.pop(group, None)
            self.newcomer_asked[group] = now
            while self.newcomer_asked and (next(iter(self.newcomer_asked.values())) < now - lim.misbehaviour_window_s
                                           or len(self.newcomer_asked) > MAX_LIMITED_PEERS):
                self.newcomer_asked.popitem(last=False)
            share = min(lim.newcomer_subnet_share, 1 / len(self.newcomer_asked))
            bucket = self.newcomer_groups.pop(group, None) or TokenBucket(lim.newcomer_rate, lim.newcomer_burst, self.clock)
            bucket.rate, bucket.burst = lim.newcomer_rate * share, max(1.0, lim.newcomer_burst * share)
            self.newcomer_groups[group] = bucket
            while len(self.newcomer_groups) > MAX_LIMITED_PEERS:
                self.newcomer_groups.popitem(last=False)
        if bucket is None or bucket.take():
            if self.newcomers.take():
                return True
            if bucket is not None:
                bucket.tokens += 1  # the shared budget refused: its subnet's token is not spent
        self.over_rate += 1
        return False

    def allow_dht(self, peer: str, size: int) -> bool:
        """Whether to serve a DHT request of `size` bytes from `peer`: not graylisted, within its rate
        and everyone's, at most dht_max_bytes (a larger one is misbehaviour). False: refuse it unparsed."""
        if size > self.limits.dht_max_bytes:
            self.over_rate += 1
            self.misbehaved(peer)
            return False
        if not self.allow(peer, "dht"):
            return False
        if not self.dht_total.take():
            self.over_rate += 1
            return False
        return True

    def misbehaved(self, peer: str, now: float | None = None) -> None:
        """Count one misbehaviour of `peer`; graylist it at `graylist_after` within the window."""
        now = self.now() if now is None else now
        lim = self.limits
        strikes = [t for t in self.strikes.pop(peer, []) if t > now - lim.misbehaviour_window_s] + [now]
        self.strikes[peer] = strikes
        while len(self.strikes) > MAX_LIMITED_PEERS:
            self.strikes.popitem(last=False)
        if len(strikes) < lim.graylist_after:
            return
        del self.strikes[peer]
        self.gray_until.pop(peer, None)
        self.gray_until[peer] = now + lim.graylist_s  # one duration for all: ordered by expiry, the expired go first
        while self.gray_until and next(iter(self.gray_until.values())) <= now:
            self.gray_until.popitem(last=False)
        self.graylisted_total += 1
        # INFO (logutil never rate-limits it) for the first GRAYLIST_LINES a window; beyond, one line counts the rest,
        # written at the next graylisting of a later window (fresh ids wrote 9 KB/s, red team 12)
        if now - self.logged_at >= lim.misbehaviour_window_s:
            if self.unlogged:
                logger.info("%d more peers were graylisted in the last %.0f s", self.unlogged, now - self.logged_at)
            self.logged_at, self.lines, self.unlogged = now, 0, 0
        if self.lines < GRAYLIST_LINES:
            self.lines += 1
            logger.info("peer %s opened streams over its rate %d times in %.0f s: ignored for %.0f s", peer,
                        len(strikes), lim.misbehaviour_window_s, lim.graylist_s)
        else:
            self.unlogged += 1
        if self.on_graylist is not None:
            self.on_graylist(peer, lim.graylist_s)

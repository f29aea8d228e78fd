"""The collect loop: which of the peers' offers to fetch, under per-peer limits, until enough arrived.

Transport-independent and without hivemind: a transport supplies two coroutines,
`list_peers(timeout) -> [PeerInfo]` and `fetch(peer, digest, timeout, declared_size) -> (bytes | None,
reason)`, plus its long-lived `Delivery` memory; `collect_offers` runs both until packets of
`min_count` distinct peers arrived or the deadline passed.

No pass waits for a slow peer (docs/RELIABILITY.md, issue 18 point 3): the peer listing is re-read
every `poll_s` *while* fetches are pending, and every event (a fetch done, a listing done) starts
whatever became fetchable, concurrently across peers. So a packet published after the call began
is fetched about one poll interval (plus one lookup) later, whatever else is in flight, and a
stalling peer costs one fetch slot for at most `fetch_timeout_s`, then rests that long.

Per-peer limits (a hostile peer gets no more than an honest one):

* one fetch in flight per peer, so a stalling peer holds at most one of the `max_parallel` slots;
  after a timed-out fetch the peer gets no new fetch for `fetch_timeout_s` (after a broken one for
  `REST_S`) and is fetched after the others of its pool for `FAILED_LAST_S` or until it delivers; a
  refused offer is not asked again for `BACKOFF_S`, and a `busy` peer nothing for as long (all kept
  in `Delivery`, across calls: the exchange's fair wait calls every 0.25 s);
* the peers the transport names `first` (those whose packets our steps took) have `max_parallel`
  slots of their own: stalling ids that fill every other slot hold up only newcomers, by one fetch
  timeout at most (16 stalling Sybils: the victim's exchange took up to 5.3 s a round, session 17);
* one packet per (peer, round), ever: `Delivery.taken` maps (peer, round) to the digest fetched
  for it; another digest offered by that peer for that round is never fetched (`duplicate_round`);
* within one round (one window, over all of its calls: the exchange makes up to 256 a round, and a
  budget per call let one id that re-announced a newer round every 0.25 s be fetched 11 times and 88 MiB in
  a 4 s round, red team 9) at most `max_peer_packets` packets and `max_peer_bytes` declared bytes per peer
  (`flood` / `too_many_bytes`); an attempt counts unless the peer refused it (not_found, busy) or
  it failed in transit (timeout, error);
* offers declaring more than `max_packet_bytes` are never fetched (`oversize`); a peer that serves
  bytes not matching the digest or more than it declared is counted (`digest_mismatch`,
  `oversize`) and its transport distrusts that (peer, digest), so it is never asked again.

Each digest is fetched at most once (protocol/SPEC.md section 12; the one exception: a credited
peer's offer of a digest that only newcomers' fetches hold, see `start_fetches`): a fetch still in flight when a
call ends (its round ended on a faster packet, or at the deadline) is not cancelled but handed
over (`Delivery.pending`) to the next call on the same event loop, which adopts it instead of
asking again; it stays bounded by `fetch_timeout_s`. (Before, each round that ended first cancelled
it and the next asked again: 4 requests for one digest in 1.3 s, issue 28.)

Pacing a neighbour cannot steer (issue 28): a call ends early only on what nearby producers say.
A *producer* is a neighbour that does not announce `produces: false` and is not at round 0 with
no offers (a relay, a light client); its announced round is a claim, believed only within
`MAX_ROUND_GAP` rounds of the wanted window. When every believed producer is past the window
with nothing wanted left, the call returns at once (a node that fell behind catches up); when no
neighbour is a believed producer (none at all, only non-producers, or only claims far away either
way) the call waits `idle_wait_s`, the node's own pace, as if alone. So a neighbour announcing
round 0 with no offers no longer holds every round for the full deadline, and one announcing round
1,000,000 no longer lets the node race through rounds without waiting.

A node of another speed (vertical mode, `swarm.max_lag`): a peer whose newest offer lies outside
the window, but within `max_lag` rounds of it, has that newest offer wanted too; one packet per
(peer, round) as always, so a slow peer delivers each packet it makes once and a slow node takes
its faster neighbours' latest instead of none. Nobody waits for such an offer: the window alone
decides when a call may end early.

Dropped offers are counted by reason: one left unfetched at the end of a call for a budget reason
once per call, the others once per (peer, digest, reason) (`Delivery.counted`). Offers of rounds
older than `oldest` are never fetched and counted once as `stale`.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from swarm_node.config import SwarmConfig
from swarm_node.net import Collected, PeerInfo, Received
from swarm_node.net.fetch import ERROR, MISMATCH, OVERSIZE
from swarm_node.net.records import STATUS_BUSY, STATUS_NOT_FOUND

ListPeers = Callable[[float], Awaitable[list[PeerInfo]]]
Fetch = Callable[[str, str, float, int], Awaitable[tuple[bytes | None, str]]]  # (peer, digest, timeout, declared size)

MAX_REMEMBERED = 65536  # entries of each per-(peer, digest | round) memory at most
FORGET_ROUNDS = 8  # delivered digests of rounds before oldest - FORGET_ROUNDS are forgotten (stale anyway)
BACKOFF_S = {STATUS_BUSY: 0.5, STATUS_NOT_FOUND: 2.0}  # an offer refused so is not asked again this long
REST_S = {STATUS_BUSY: 0.5, ERROR: 2.0, STATUS_NOT_FOUND: 0.0}  # then the peer gets no fetch at all this long;
#   after a timeout (or a bad request) both are the fetch timeout. A broken fetch (reset, refused dial) held no slot
FAILED_LAST_S = 60.0  # a peer whose fetch timed out or broke is fetched after the others of its pool this long
BUDGET_REASONS = ("flood", "too_many_bytes")  # offers deferred by the per-round budget, counted at a call's end
MAX_ROUND_GAP = 64  # a neighbour's announced round farther than this from the wanted window is not believed


@dataclass(frozen=True)
class CollectLimits:
    fetch_timeout_s: float  # one fetch at most
    max_packet_bytes: int  # offers declaring more are never fetched
    max_peer_packets: int  # per call and peer
    max_peer_bytes: int  # declared bytes per call and peer
    max_parallel: int = 8  # fetches in flight at once (from distinct peers), per pool (`first` or not)
    lookup_timeout_s: float = 10.0  # one peer listing at most (clamped to the deadline)
    poll_s: float = 0.25  # the peer listing is re-read this often, fetches pending or not
    idle_wait_s: float | None = None  # wait when no believed producer is near (None: the whole deadline)
    max_lag: int = 0  # a peer's newest offer outside the window is wanted up to this far from it (vertical mode)

    @classmethod
    def from_config(cls, cfg: SwarmConfig) -> CollectLimits:
        return cls(cfg.fetch_timeout_s, cfg.max_packet_bytes, cfg.max_peer_packets, cfg.max_peer_bytes,
                   idle_wait_s=cfg.alone_wait_s, max_lag=min(cfg.max_lag, MAX_ROUND_GAP) if cfg.mode == "vertical" else 0)


@dataclass
class Delivery:
    """What a transport remembers across collect calls, bounded whatever peers offer. Not
    thread-safe: each transport mutates it from one thread only (see its docstring)."""

    delivered: dict[str, int] = field(default_factory=dict)  # digest -> round: delivered, ours or stale
    taken: dict[tuple[str, int], str] = field(default_factory=OrderedDict)  # (peer, round) -> digest fetched
    counted: set[tuple[str, str, str]] = field(default_factory=set)  # (peer, digest, reason) counted as dropped
    distrusted: dict[tuple[str, str], None] = field(default_factory=dict)  # (peer, digest) never to fetch again
    pending: dict[asyncio.Task, tuple[str, int, str, int]] = field(default_factory=dict)  # fetches a call left
    #   running, (peer, round, digest, size): the next call adopts them (each digest fetched at most once)
    retry_at: dict[tuple[str, str], float] = field(default_factory=dict)  # (peer, digest) -> not asked before
    rest_until: dict[str, float] = field(default_factory=dict)  # peer -> no new fetch before (busy, timeout, error)
    window: tuple[int | None, int | None] | None = None  # the (oldest, newest) the per-peer budget is spent in
    spent: Counter[str] = field(default_factory=Counter)  # packets per peer fetched in that window by ended calls
    spent_bytes: Counter[str] = field(default_factory=Counter)  # ... their declared bytes
    failed_at: dict[str, float] = field(default_factory=dict)  # peer -> its latest timed-out or broken fetch, until
    #   it delivers or FAILED_LAST_S passed. Times are the loop's clock (monotonic on every loop these transports
    #   run), kept across calls: a call every 0.25 s (the exchange's fair wait) asked a peer that answered
    #   `busy` or timed out again at once, each call (session 18)

    def own(self, digest: str, round: int) -> None:
        """Our own packet: never delivered back to us."""
        self.delivered[digest] = round

    def distrust(self, peer: str, digest: str) -> None:
        """Never fetch `digest` from `peer` again; another peer may still deliver it."""
        self.distrusted.pop((peer, digest), None)
        self.distrusted[(peer, digest)] = None  # newest last: the oldest go first (`bound`), never the new ones
        self.delivered.pop(digest, None)

    def forget_before(self, round: int) -> None:
        for digest in [d for d, r in self.delivered.items() if r < round]:
            del self.delivered[digest]

    def bound(self, now: float) -> None:
        """Expired waits go; then the oldest entries first."""
        self.retry_at = {key: t for key, t in self.retry_at.items() if t > now}
        self.rest_until = {peer: t for peer, t in self.rest_until.items() if t > now}
        self.failed_at = {peer: t for peer, t in self.failed_at.items() if t > now - FAILED_LAST_S}
        for memory in (self.delivered, self.taken, self.retry_at, self.rest_until, self.failed_at, self.distrusted,
                       self.spent, self.spent_bytes):
            while len(memory) > MAX_REMEMBERED:
                del memory[next(iter(memory))]
        if len(self.counted) > MAX_REMEMBERED:
            self.counted.clear()


async def collect_offers(list_peers: ListPeers, fetch: Fetch, limits: CollectLimits, state: Delivery, *,
                         wanted: Callable[[int], bool], min_count: int, deadline_s: float, oldest: int | None = None,
                         newest: int | None = None, keep: Callable[[PeerInfo], bool] | None = None,
                         first: Callable[[str], bool] | None = None, count_peers: bool = True) -> Collected:
    """Fetch offered packets of `wanted` rounds not yet delivered until `min_count` distinct peers'
    packets (packets, without `count_peers`) arrived (one pass if <= 0) or `deadline_s` passed.
    `newest`: the newest round wanted; when every peer is already past it with nothing wanted left,
    nothing useful can come and the call returns early (a node that fell behind catches up instead
    of waiting every round). `keep` filters peers (e.g. same protocol version); `first` names the
    peers fetched first, from slots of their own (see the module docstring)."""
    state.bound(asyncio.get_running_loop().time())
    if oldest is not None:
        state.forget_before(oldest - FORGET_ROUNDS)
    collector = Collector(list_peers, fetch, limits, state, wanted, keep or (lambda p: True), oldest, newest,
                          first or (lambda peer: False))
    return await collector.run(min_count, deadline_s, count_peers)


class Collector:
    """The state of one `collect_offers` call: an event loop over fetch tasks and peer listings."""

    def __init__(self, list_peers: ListPeers, fetch: Fetch, limits: CollectLimits, state: Delivery,
                 wanted: Callable[[int], bool], keep: Callable[[PeerInfo], bool], oldest: int | None,
                 newest: int | None, first: Callable[[str], bool]):
        self.list_peers, self.fetch, self.limits, self.state = list_peers, fetch, limits, state
        self.wanted, self.keep, self.oldest, self.newest, self.first = wanted, keep, oldest, newest, first
        self.result = Collected()
        self.peers: list[PeerInfo] = []  # the latest listing (kept peers only)
        self.peers_seen: set[str] = set()
        self.in_flight: dict[asyncio.Task, tuple[str, int, str, int]] = {}  # fetch -> (peer, round, digest, size)
        self.deferred: dict[tuple[str, str], str] = {}  # (peer, digest) -> budget reason, if unfetched at the end
        if state.window != (oldest, newest):  # a new round: a new budget (a round makes up to 256 calls)
            state.window, state.spent, state.spent_bytes = (oldest, newest), Counter(), Counter()
        self.used = Counter(state.spent)  # packets per peer in this round (in flight or counted)
        self.used_bytes = Counter(state.spent_bytes)  # declared bytes per peer in this round
        self.tries: Counter[tuple[str, str]] = Counter()  # fetches started per (peer, digest) in this call
        self.newest_offer: dict[str, int] = {}  # peer -> the newest round it offers (latest listing)

    async def run(self, min_count: int, deadline_s: float, count_peers: bool) -> Collected:
        self.loop = asyncio.get_running_loop()
        self.t_end = self.loop.time() + max(0.0, deadline_s)
        idle = self.limits.idle_wait_s
        self.t_idle = self.loop.time() + idle if idle is not None else float("inf")
        self.min_count, self.count_peers = min_count, count_peers
        one_pass = min_count <= 0  # one listing, the fetches it allows, then return
        self.adopt()
        self.on_listing(await self.list_peers(self.lookup_timeout()))  # always looks: stale offers count at deadline 0
        listing: asyncio.Task | None = None
        next_listing = self.loop.time() + self.limits.poll_s
        try:
            while self.time_left() > 0 and not (min_count > 0 and self.enough()):
                self.start_fetches()
                if not self.in_flight and (one_pass or self.nothing_can_come()):
                    break  # one pass, or every believed producer is past the window: catch up
                if listing is None and not one_pass and self.loop.time() >= next_listing:
                    listing = self.loop.create_task(self.list_peers(self.lookup_timeout()))
                wake = next_listing - self.loop.time() if listing is None and not one_pass else self.time_left()
                for task in await self.next_events(listing, min(wake, self.time_left())):
                    if task is listing:
                        listing, next_listing = None, self.loop.time() + self.limits.poll_s
                        self.on_listing(task.result() if task.exception() is None else [])
                    else:
                        self.on_result(*self.in_flight.pop(task), *task.result())
        finally:
            if listing is not None:
                listing.cancel()
            # a pending fetch is not cancelled (it would be asked for again): the next call adopts it;
            # it held one of this peer's slots, never the call
            self.state.pending.update(self.in_flight)
            for peer, _, _, size in self.in_flight.values():  # the call that adopts it counts it
                self.use(peer, size, -1)
            self.in_flight.clear()
            self.state.spent, self.state.spent_bytes = +self.used, +self.used_bytes
        return self.finish()

    def adopt(self) -> None:
        """Take over the fetches a previous call left running on this loop; those already done count
        now. A result of a round no longer wanted marks its digest delivered, counted `stale`."""
        pending, self.state.pending = self.state.pending, {}
        for task, (peer, r, d, size) in pending.items():
            if task.get_loop() is not self.loop or task.cancelled():
                continue  # another call's loop (a transport that runs one loop per call) ended it
            self.use(peer, size, +1)
            self.tries[(peer, d)] += 1
            if not task.done():
                self.in_flight[task] = (peer, r, d, size)
            elif task.exception() is None:
                self.on_result(peer, r, d, size, *task.result())

    async def next_events(self, listing: asyncio.Task | None, timeout: float) -> set[asyncio.Task]:
        """The fetches (and listing) that finished within `timeout` seconds; waits for the first one."""
        waits = set(self.in_flight) | ({listing} if listing is not None else set())
        if not waits:
            await asyncio.sleep(max(0.0, timeout))
            return set()
        done, _ = await asyncio.wait(waits, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
        return done

    def finish(self) -> Collected:
        got = {item.digest for item in self.result.packets}
        self.result.dropped.update(reason for (_, d), reason in self.deferred.items() if d not in got)
        self.result.peers = len(self.peers_seen)
        return self.result

    def time_left(self) -> float:
        return self.t_end - self.loop.time()

    def lookup_timeout(self) -> float:
        return min(self.limits.lookup_timeout_s, max(0.05, self.time_left()))

    def enough(self) -> bool:
        packets = self.result.packets
        return (len({x.peer_id for x in packets}) if self.count_peers else len(packets)) >= self.min_count

    def on_listing(self, peers: list[PeerInfo]) -> None:
        """Count the peers, and each offer older than `oldest` once as stale (it is never fetched)."""
        self.peers_seen.update(info.peer_id for info in peers)
        self.peers = [info for info in peers if self.keep(info)]
        self.newest_offer.update({info.peer_id: max(r for r, _, _ in info.offers) for info in peers if info.offers})
        if self.oldest is None:
            return
        in_flight = {d for _, _, d, _ in self.in_flight.values()}  # fetched as a lagging newest: on_result decides
        for info in peers:  # counted per (peer, digest), never marked delivered: whoever offers a digest as stale
            for r, d, _ in info.offers:  # (a neighbour that learnt an honest peer's digest) must not block its sender's offer
                if (r < self.oldest and d not in self.state.delivered and d not in in_flight
                        and not self.lagging(info.peer_id, r)):
                    self.drop(info.peer_id, d, "stale")

    def wants(self, peer: str, r: int) -> bool:
        """Whether `peer`'s offer of round `r` is wanted: a round of the window, or its newest one (lagging)."""
        return self.wanted(r) or self.lagging(peer, r)

    def lagging(self, peer: str, r: int) -> bool:
        """`r` is the newest round `peer` offers, outside the window but within `max_lag` of it: a slower
        (or faster) node's latest packet, taken once (`Delivery.taken`), never waited for. Without it
        a node 4x slower than its neighbours fell out of their window for good and they of its."""
        return r == self.newest_offer.get(peer) and self.within_lag(r)

    def within_lag(self, r: int) -> bool:
        """`r` lies within `max_lag` of the window (a lagging fetch that completes after the peer
        offered a newer round is still delivered: at 3 rounds apart, on 200-ms links, every one was
        dropped as stale before)."""
        lag = self.limits.max_lag
        return lag > 0 and self.oldest is not None and self.newest is not None and self.oldest - lag <= r <= self.newest + lag

    def ignored(self, peer: str, r: int, d: str, now: float) -> bool:
        """Offers not to consider now (not counted as dropped)."""
        return (d in self.state.delivered or self.state.taken.get((peer, r)) == d or not self.wants(peer, r)
                or (peer, d) in self.state.distrusted or self.state.retry_at.get((peer, d), 0.0) > now)

    def refusal(self, peer: str, r: int, d: str, size: int) -> str | None:
        """Why a fetchable offer may not be fetched now (None: fetch it)."""
        if size > self.limits.max_packet_bytes:
            return OVERSIZE
        if self.state.taken.get((peer, r), d) != d:
            return "duplicate_round"
        if self.used[peer] >= self.limits.max_peer_packets:
            return "flood"
        if self.used_bytes[peer] + size > self.limits.max_peer_bytes:
            return "too_many_bytes"
        return None

    def start_fetches(self) -> None:
        """Start one fetch for each idle peer with a fetchable offer (its least-tried one), while its
        pool (`first` or not) has free slots: the `first` ones, then peers whose fetches failed lately
        last, then the least served; count the offers that may not be fetched. A digest in flight is
        not asked of another peer, except of a `first` one while only others fetch it: a Sybil that
        re-offers a credited peer's digest and stalls its fetch holds up no credited peer."""
        now = self.loop.time()
        busy = {peer for peer, _, _, _ in self.in_flight.values()}
        in_flight: dict[str, bool] = {}  # digest -> whether a `first` peer's fetch of it is in flight
        for peer, _, d, _ in self.in_flight.values():
            in_flight[d] = in_flight.get(d, False) or self.first(peer)
        slots_used = Counter(self.first(peer) for peer in busy)  # fetches in flight per pool
        failed_lately = {peer for peer, t in self.state.failed_at.items() if t > now - FAILED_LAST_S}
        for info in sorted(self.peers, key=lambda p: (not self.first(p.peer_id), p.peer_id in failed_lately,
                                                      self.used[p.peer_id])):
            peer, fetchable, pool = info.peer_id, [], self.first(info.peer_id)
            for r, d, size in info.offers:
                if (d in in_flight and (in_flight[d] or not pool)) or self.ignored(peer, r, d, now):
                    continue
                reason = self.refusal(peer, r, d, size)
                if reason in BUDGET_REASONS:
                    self.deferred[(peer, d)] = reason
                elif reason is not None:
                    self.drop(peer, d, reason)
                else:
                    fetchable.append((self.tries[(peer, d)], r, d, size))
            if not fetchable or peer in busy or self.state.rest_until.get(peer, 0.0) > now:
                continue
            if slots_used[pool] >= self.limits.max_parallel:
                continue  # keep classifying the others' offers; no slot for them now
            slots_used[pool] += 1
            _, r, d, size = min(fetchable, key=lambda x: x[0])  # a failing offer does not block the peer's others
            self.deferred.pop((peer, d), None)
            self.use(peer, size, +1)
            self.tries[(peer, d)] += 1
            timeout = self.limits.fetch_timeout_s  # not the call's time left: a fetch outlives the call (adopt)
            self.in_flight[self.loop.create_task(self.fetch(peer, d, timeout, size))] = (peer, r, d, size)
            in_flight[d] = in_flight.get(d, False) or pool

    def use(self, peer: str, size: int, sign: int) -> None:
        self.used[peer] += sign
        self.used_bytes[peer] += sign * size

    def drop(self, peer: str, digest: str, reason: str) -> None:
        self.deferred.pop((peer, digest), None)
        if (peer, digest, reason) not in self.state.counted:
            self.state.counted.add((peer, digest, reason))
            self.result.dropped[reason] += 1

    def on_result(self, peer: str, r: int, d: str, size: int, data: bytes | None, reason: str) -> None:
        if data is not None:
            self.state.failed_at.pop(peer, None)
            if d in self.state.delivered:  # another peer's copy came first: nothing taken from this one (if that copy
                return  # is refused for its server, the digest is un-seen and this peer's offer fetched again; red team 11)
            self.state.taken.setdefault((peer, r), d)
            if not (self.wanted(r) or self.within_lag(r)):  # adopted; its round passed:
                self.drop(peer, d, "stale")  # not marked delivered (unchecked, maybe another's copy), never fetched again (taken)
            else:
                self.state.delivered[d] = r
                self.result.packets.append(Received(peer_id=peer, round=r, digest=d, data=data))
            return
        now = self.loop.time()
        self.result.failed.add(peer)
        if reason in (MISMATCH, OVERSIZE):  # not what it offered: never ask that peer for it again
            self.drop(peer, d, "digest_mismatch" if reason == MISMATCH else OVERSIZE)
            self.state.distrust(peer, d)
            return
        self.use(peer, size, -1)  # refused or failed in transit: does not use up the peer's budget
        if reason not in BACKOFF_S:  # timed out or broke: fetched after the others of its pool for a while
            self.state.failed_at[peer] = now
        rest = REST_S.get(reason, self.limits.fetch_timeout_s)
        self.state.rest_until[peer] = max(self.state.rest_until.get(peer, 0.0), now + rest)
        self.state.retry_at[(peer, d)] = now + BACKOFF_S.get(reason, rest)

    def producers(self) -> list[PeerInfo]:
        """Kept neighbours whose claims pace this call: producers (not `produces: false`, not the
        legacy convention round 0 with no offers) announcing a round within MAX_ROUND_GAP of the
        window. Farther claims, either way, neither hold the call nor end it early."""
        lo = (self.oldest if self.oldest is not None else self.newest) - MAX_ROUND_GAP
        hi = self.newest + MAX_ROUND_GAP
        return [info for info in self.peers if info.produces and (info.offers or info.round > 0)
                and lo <= info.round <= hi]

    def nothing_can_come(self) -> bool:
        """Whether the call may end before its deadline: every believed producer is past `newest`
        and offers nothing of the window that is still undelivered (return at once: a node that fell
        behind catches up, also beside a relay, found by bench/chaos.py; a lagging peer's newest offer
        holds nothing), or there is no believed producer at all and the idle wait is over (the
        node's own pace, as if alone)."""
        if self.newest is None:
            return False
        producers = self.producers()
        if not producers:
            return self.loop.time() >= self.t_idle
        return not any(info.round <= self.newest or any(
            self.wanted(r) and d not in self.state.delivered and (info.peer_id, d) not in self.state.distrusted
            for r, d, _ in info.offers) for info in producers)

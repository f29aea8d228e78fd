"""Producers we had no slot for: peers that knocked while we were full, offering packets (issue 27).

A node whose slots are full of Sybils that deliver nothing is *starving* (`Mesh.starving`). The
honest producer that knocks is answered `full` like any other newcomer. Dialling the knockers in
the order they first knocked (session 13's rescue) let 256 Sybil ids that knocked first, and
answered our dial `ok`, hold the extra slots 2 rounds each: the honest peer never came in
(harness/eclipse_sim.py, `busy`/`ok`).

So a starving node tries knockers by *fetching* from them, without a slot, as if they were
neighbours: a packet proves a producer, an offer does not. `Mesh.rescue` dials the proven first;
the others still one at a time in first-knock order (a dial brings a fresh announcement: an
honest peer answered `full` stops knocking), but never into the last extra slot.

    queue    knockers that offered a packet we would fetch, in the order they first knocked, each
             with its latest announcement; knocking again updates the announcement, not the place
    trying   at most TRIALS knockers at a time are listed to the collect loop; a turn lasts until
             a fetch from it ends, whatever its outcome, or TRIAL_S (its fetch times out after
             TRIAL_FETCH_S); then the knocker leaves the queue, and re-enters at the back when it
             knocks again (one fetch per knock: a Sybil serving junk fast gets no more turns)
    proven   knockers whose packet a step took (`Mesh.credit`): fetched from whenever their latest
             announcement is fresh, until a fetch fails, and the first peers a starving node dials
             (`Mesh.rescue`)

Only announcements younger than FRESH_S are tried: an older offer may be gone, and an honest
peer must not lose its turn to its own stale offer.

Subnets (`Mesh.group_of`: the /24 or /32 the knock came from; None on loopback and private
networks): at most one knocker per subnet is on trial at a time, and when the queue is full the
oldest knocker of the subnet with most entries leaves it. So ids from one machine take one of the
TRIALS turns, and more of them cannot push an honest peer of another subnet out of the queue.

The bound, in plain words: a starving node takes an honest producer's packet after trying at most
the knockers that first knocked before it, TRIALS at a time, each for at most TRIAL_S (k such ids
delay it by about k * TRIAL_S / TRIALS seconds, ~380 s for 256 ids that all stall; ids of one
subnet, one turn at a time), then dials it first. Each Sybil id costs the node one fetch per knock,
never a slot. Not bounded: more than MAX_KNOCKERS ids that share the honest peer's group (all of
loopback or one private network) knocking after it push it out of the queue before its turn; it
re-enters at the back with its next knock.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable

from swarm_node.net import PeerInfo

TRIALS = 4  # knockers fetched from at once while starving
TRIAL_S = 6.0  # a knocker's turn: listed this long without delivering, it leaves the queue
TRIAL_FETCH_S = 5.0  # a fetch from a knocker times out after this (a stalling one holds a slot no longer; an
#   honest 26-KB packet took over 2 s beside 64 Sybil daemons on 2 cores)
FRESH_S = 5.0  # an announcement older than this is not tried (its offers may be gone)
MAX_KNOCKERS = 256  # remembered at most; the oldest first knocks go first


class Knockers:
    """The queue of knockers, their turns, and the proven ones. Pure and synchronous (the mesh's lock)."""

    def __init__(self) -> None:
        self.queue: OrderedDict[str, tuple[PeerInfo, float]] = OrderedDict()  # peer -> (announcement, when)
        self.trying: dict[str, float] = {}  # peer -> its turn ends
        self.proven: OrderedDict[str, None] = OrderedDict()  # delivered without a slot, newest last
        self.groups: dict[str, str | None] = {}  # peer -> the subnet its knock came from (None: not limited)
        self.tried = self.delivered_total = 0  # turns given, and turns that delivered (stats)

    def knocked(self, peer: str, info: PeerInfo, now: float, group: str | None = None) -> None:
        """`peer` knocked from subnet `group`, offering a packet we would fetch, and found us full."""
        self.queue[peer] = (info, now)  # an existing key keeps its place
        self.groups[peer] = group
        if len(self.queue) > MAX_KNOCKERS:  # the oldest of the largest subnet goes
            sizes = Counter(self.groups[p] for p in self.queue)
            largest = max(sizes.values())
            self.forget(next(p for p in self.queue if sizes[self.groups[p]] == largest))

    def turn(self, now: float, eligible: Callable[[str, PeerInfo], bool]) -> list[PeerInfo]:
        """The announcements to fetch from now: the proven knockers' fresh ones, and up to TRIALS on
        trial (turns that ended without a packet first send their knockers out of the queue)."""
        for peer in [p for p, end in self.trying.items() if end <= now]:
            self.forget(peer)
        busy = {self.groups[p] for p in self.trying} - {None}  # one knocker of a subnet on trial at a time
        for peer, (info, at) in self.queue.items():
            if len(self.trying) >= TRIALS:
                break
            if (peer not in self.trying and peer not in self.proven and self.groups[peer] not in busy
                    and at >= now - FRESH_S and eligible(peer, info)):
                self.trying[peer] = now + TRIAL_S
                self.tried += 1
                busy |= {self.groups[peer]} - {None}
        listed = [p for p in self.queue if p in self.trying or (p in self.proven and self.queue[p][1] >= now - FRESH_S)]
        return [self.queue[p][0] for p in listed]

    def on_trial(self, peer: str) -> bool:
        """Fetched from without a slot (its fetches get TRIAL_FETCH_S)."""
        return peer in self.trying or peer in self.proven

    def timeout(self, peer: str, timeout: float) -> float:
        """A fetch from a knocker on trial times out sooner: a stalling Sybil holds a fetch slot no longer."""
        return min(timeout, TRIAL_FETCH_S) if self.on_trial(peer) else timeout

    def fetched(self, peer: str, ok: bool) -> None:
        """A fetch from `peer` ended: its turn is over (a proven knocker stays proven while fetches succeed)."""
        if not ok or peer not in self.proven:
            self.forget(peer)

    def delivered(self, peer: str) -> None:
        """A packet of `peer` (not a neighbour) was taken by a step: proven."""
        self.delivered_total += peer not in self.proven
        self.proven[peer] = None
        self.proven.move_to_end(peer)
        while len(self.proven) > MAX_KNOCKERS:
            self.proven.popitem(last=False)

    def forget(self, peer: str) -> None:
        """Out of the queue, its turn and the proven (it became a neighbour, or was benched)."""
        self.queue.pop(peer, None)
        self.trying.pop(peer, None)
        self.proven.pop(peer, None)
        self.groups.pop(peer, None)

    def pause(self) -> None:
        """Fed again: no turns are running (the queue stays, for the next time we starve)."""
        self.trying.clear()

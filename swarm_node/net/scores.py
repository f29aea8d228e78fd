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

Rates (`PeerLimiter`): a token bucket per peer for incoming announcement and fetch streams; a
stream over the rate is closed before anything is read and counts as misbehaviour; a peer with
`graylist_after` of those within `misbehaviour_window_s` is ignored (every stream closed at once)
for `graylist_s`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

IDLE_BENCH_S, MAX_IDLE_BENCH_S = 60.0, 600.0  # an idle neighbour evicted is refused for 60, 120 ... 600 s


@dataclass
class Score:
    """One neighbour's record, as this node measured it."""

    outbound: bool  # we dialled it, to a candidate we picked
    since_round: int  # our round when it became a neighbour
    since_t: float  # our clock then
    credits: int = 0  # accepted, non-echo packets it delivered first
    credited_round: int = -1  # our round at its last credit
    credited_t: float = float("-inf")  # our clock at its last credit

    def idle(self, round: int, now: float, idle_rounds: int, idle_s: float) -> bool:
        """Delivered nothing for idle_rounds of our rounds and idle_s seconds (since it joined or its last credit)."""
        if idle_rounds <= 0:
            return False
        last_round, last_t = max(self.since_round, self.credited_round), max(self.since_t, self.credited_t)
        return round - last_round >= idle_rounds and now - last_t >= idle_s

    def as_dict(self, round: int) -> dict:
        last = max(self.since_round, self.credited_round)
        return {"outbound": self.outbound, "credits": self.credits, "rounds_idle": max(0, round - last)}


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

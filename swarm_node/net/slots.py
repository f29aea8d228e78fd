"""What a node remembers of the neighbours that lost their slot, so that a lost slot is not simply taken back.

    bench     an evicted or graylisted peer is refused (not admitted, not dialled) until a time: 60 s for an
              idle neighbour, doubling per eviction up to 600 s; 10 s, doubling, for one that delivered and then
              fell silent (its link is down, and it comes back on both sides); STARVING_BENCH_S when the node
              evicting it is itself starving (it may be an honest peer that stalled and restarts)
    left      a neighbour that never delivered and left by any door keeps its idle clock if it is back within
              EMPTY_MEMORY_S (else leaving and returning restarted the clock: red team 14)
    vacated   a freed slot stays its group's (public /24, or relay) for a while, but for the same peer's
              return: ids are free, and a fresh id of the same /24 took every slot an evicted one freed
              (red teams 14-16); `scores.crowded` counts these holds

Every table is bounded (the expired go first). Pure state, no clock of its own: every call takes `now`.
"""

from __future__ import annotations

from collections import Counter

IDLE_BENCH_S, MAX_IDLE_BENCH_S = 60.0, 600.0  # an idle neighbour evicted is refused for 60, 120 ... 600 s
SILENT_BENCH_S = 10.0  # ... one that delivered, then fell silent (its link down) for 10, 20, 40 ... 600 s (bench_s)
STARVING_BENCH_S = 10.0  # what a starving node evicts is refused this long only: it may be an honest peer restarting
EMPTY_MEMORY_S = IDLE_BENCH_S  # a neighbour that left before it delivered, back within this: its idle clock goes on
MAX_HOLDS = 256  # vacated slots held for their groups, at most (a flush needs 256 fresh holds within their time)
MAX_REMEMBERED = 256  # benched and left peers remembered (as many as the candidates a node knows)


def bench_s(evictions: int, silent: bool) -> float:
    """How long an idle neighbour evicted for the `evictions`-th time is refused. `silent`: it delivered, then
    nothing was heard from it for idle_s: its link is down (a partition, a crash, a freeze), not a slot held without
    delivering, and a link that comes back comes back on both sides (CI, session 32: in a 20 s partition each side
    benched the other for 60 s, and the cut node took a packet 19 rounds after the heal). Only after a delivery: an
    empty Sybil that let our pushes hang got 10 s too (red team 14). Evicted again, it waits twice as long."""
    return min(MAX_IDLE_BENCH_S, (SILENT_BENCH_S if silent else IDLE_BENCH_S) * 2 ** (evictions - 1))


class SlotMemory:
    """The bench, the idle clocks of empty neighbours that left, and the slots held for their groups."""

    def __init__(self):
        self.benched: dict[str, float] = {}  # peer -> refused until (evicted idle, or graylisted)
        self.evictions: Counter[str] = Counter()  # idle evictions per peer (the bench doubles)
        self.left: dict[str, tuple[int, float, float]] = {}  # neighbour gone without delivering -> (joined round, t; left t)
        self.vacated: dict[str, tuple[str, float]] = {}  # ex-neighbour -> (its group, until its slot stays the group's)

    def is_benched(self, peer: str, now: float) -> bool:
        return self.benched.get(peer, 0.0) > now

    def evicted(self, peer: str, group: str | None, now: float, silent: bool, starving: bool) -> float:
        """An idle neighbour lost its slot: bench it (`bench_s`; briefly while we starve, and then it does not count
        as an eviction) and hold its slot for its group as long. Returns the end of the bench."""
        self.evictions[peer] += not starving
        until = now + (STARVING_BENCH_S if starving else bench_s(self.evictions[peer], silent))
        if len(self.evictions) > 4 * MAX_REMEMBERED:
            self.evictions.clear()
        self.bench(peer, group, until, now)
        return until

    def bench(self, peer: str, group: str | None, until: float, now: float) -> None:
        """Refuse `peer` until `until` (a later bench is kept); its slot, if it had one, stays its group's as long."""
        self.benched[peer] = max(self.benched.get(peer, 0.0), until)
        if len(self.benched) > MAX_REMEMBERED:
            self.benched = {p: t for p, t in self.benched.items() if t > now}
        self.hold(peer, group, until, now)

    def hold(self, peer: str, group: str | None, until: float, now: float) -> None:
        """`peer`'s vacated slot stays `group`'s until `until` (`scores.crowded`; None: no group, no hold). At most
        MAX_HOLDS holds, the expired going first, then the oldest (red team 16: holds piled up, 1,440 an hour)."""
        if group is not None:
            self.vacated[peer] = (group, max(until, self.vacated.get(peer, ("", 0.0))[1]))
        if len(self.vacated) > MAX_HOLDS:
            for p in [p for p, (_, t) in self.vacated.items() if t <= now]:
                del self.vacated[p]
            while len(self.vacated) > MAX_HOLDS:
                del self.vacated[next(iter(self.vacated))]

    def left_empty(self, peer: str, since: tuple[int, float], group: str | None, now: float) -> None:
        """A neighbour that never delivered is gone (any door): its idle clock (`since`: joined round, time) and its
        slot are kept for EMPTY_MEMORY_S."""
        self.left[peer] = (*since, now)
        self.hold(peer, group, now + EMPTY_MEMORY_S, now)
        while len(self.left) > MAX_REMEMBERED:
            del self.left[next(iter(self.left))]

    def returning(self, peer: str, now: float) -> tuple[int, float] | None:
        """`peer` is admitted again: its own hold ends, and if it left empty within EMPTY_MEMORY_S, the idle clock
        it had (joined round, time) goes on; None: a fresh clock."""
        self.vacated.pop(peer, None)
        since = self.left.pop(peer, None)
        return since[:2] if since is not None and now - since[2] < EMPTY_MEMORY_S else None

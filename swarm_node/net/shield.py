"""A shield: protocol ids a node stops registering in p2pd while strangers flood them (issue 27).

A stream or request the node refuses still costs it what p2pd and our handler spend accepting it
(`bench/stream_cost.py`: ~0.35 ms for a stream closed at once, ~0.17 ms for a DHT request refused at
once, most of it in p2pd and some in our Python beside the trainer); only an id the node does not register
is refused inside p2pd, in multistream-select (~0.07 ms, none of it ours). Rates and graylists bound
what a flooder gets, not what its refusals cost. So when `trigger` arrivals on the shielded ids come
within `window_s` (served or refused: a flood of ids each within its own rate counts too), the ids are
unregistered for SHIELD_S, then registered again and kept open for at least OPEN_S whatever comes
(arrivals are not counted then). The bound both ways: a flood costs the node full price at most
OPEN_S / (SHIELD_S + OPEN_S) of the time, and however cheaply an attacker re-triggers it, the ids are
open that share of the time, every SHIELD_S + OPEN_S seconds, for honest strangers to get in (red team 21:
a shield that doubled while floods came back was held shut by ~200 streams every few minutes, and links that
broke then never re-formed). Used for the public announcement and fetch ids (`lanes.py`; neighbours go on
over their lanes). Not for the DHT: a node that stopped serving it was dropped from its peers' routing
tables, which then never refilled (red team 23), and a DHT request refused at once was already cheap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

SHIELD_S = 12.0  # the ids stay unregistered this long
OPEN_S = 3.0  # ... then registered again for at least this long, arrivals uncounted: open >= 20 % of the time


class Shield:
    """Counts arrivals on some ids; past `trigger` within `window_s`, `close()`s them for a while, then `reopen()`s.
    Runs on the transport's loop."""

    def __init__(self, name: str, trigger: int, window_s: float, close: Callable[[], Awaitable[None]],
                 reopen: Callable[[], Awaitable[None]], clock: Callable[[], float] = time.monotonic):
        self.name, self.trigger, self.window_s = name, trigger, window_s
        self.close, self.reopen, self.clock = close, reopen, clock
        self.window_start, self.arrivals = -float("inf"), 0
        self.shields = 0  # times raised, for stats
        self.closed = False  # the ids are unregistered (from the trigger until they are registered again)
        self.task: asyncio.Task | None = None  # while the shield is up, and its open share after it

    def up(self) -> bool:
        """The ids are unregistered now (or being unregistered)."""
        return self.closed

    def arrived(self) -> None:
        """A stream or request came on a shielded id: count it; raise the shield at `trigger` in the window."""
        if self.task is not None:  # shut, or in its guaranteed open share: not counted
            return
        now = self.clock()
        if now - self.window_start > self.window_s:
            self.window_start, self.arrivals = now, 0
        self.arrivals += 1
        if self.arrivals >= self.trigger:
            self.window_start = -float("inf")
            self.closed = True
            self.task = asyncio.get_running_loop().create_task(self._hold())

    async def _hold(self) -> None:
        try:
            self.shields += 1
            logger.warning("%s flood: %d arrivals within %.0f s; refused by p2pd for %.0f s", self.name,
                           self.trigger, self.window_s, SHIELD_S)
            try:
                await self.close()
                await asyncio.sleep(SHIELD_S)
            finally:  # whatever happened, the ids come back (a shield that never reopened would shut them for good)
                self.closed = False
                await self.reopen()
            await asyncio.sleep(OPEN_S)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # p2pd gone: the transport is closing
            logger.debug("%s shield: %r", self.name, e)
        finally:
            self.task = None

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

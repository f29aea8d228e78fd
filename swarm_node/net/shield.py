"""A shield: protocol ids a node stops registering in p2pd while strangers flood them (issue 27).

A stream or request the node refuses still costs it what p2pd and our handler spend accepting it
(`bench/stream_cost.py`: ~0.35 ms for a stream closed at once, ~0.17 ms for a DHT request refused at
once, most of it in p2pd and some in our Python beside the trainer); only an id the node does not register
is refused inside p2pd, in multistream-select (~0.07 ms, none of it ours). Rates and graylists bound
what a flooder gets, not what its refusals cost. So when `trigger` arrivals on the shielded ids come
within `window_s` (served or refused: a flood of ids each within its own rate counts too), the ids are
unregistered for `shield_s`, doubled each time a flood comes back within that long of reopening (up to
MAX_SHIELD_S), then registered again. Users: the public announcement, fetch and dial-back ids
(`lanes.py`; neighbours go on over their lanes) and the DHT's requests (`hivemind_internals.guard_dht_requests`;
the node keeps using the DHT, it only stops serving it for a while).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

SHIELD_S, MAX_SHIELD_S = 15.0, 240.0  # ids stay unregistered this long, doubled while floods come back


class Shield:
    """Counts arrivals on some ids; past `trigger` within `window_s`, `close()`s them for a while, then `reopen()`s.
    Runs on the transport's loop."""

    def __init__(self, name: str, trigger: int, window_s: float, close: Callable[[], Awaitable[None]],
                 reopen: Callable[[], Awaitable[None]], clock: Callable[[], float] = time.monotonic):
        self.name, self.trigger, self.window_s = name, trigger, window_s
        self.close, self.reopen, self.clock = close, reopen, clock
        self.window_start, self.arrivals = -float("inf"), 0
        self.shield_s, self.reopened_at, self.shields = SHIELD_S, -float("inf"), 0
        self.task: asyncio.Task | None = None  # while the shield is up

    def up(self) -> bool:
        return self.task is not None

    def arrived(self) -> None:
        """A stream or request came on a shielded id: count it; raise the shield at `trigger` in the window."""
        now = self.clock()
        if now - self.window_start > self.window_s:
            self.window_start, self.arrivals = now, 0
        self.arrivals += 1
        if self.arrivals >= self.trigger and self.task is None:
            self.window_start = -float("inf")
            self.task = asyncio.get_running_loop().create_task(self._hold())

    async def _hold(self) -> None:
        try:
            came_back = self.clock() - self.reopened_at < self.shield_s
            self.shield_s = min(MAX_SHIELD_S, 2 * self.shield_s) if came_back else SHIELD_S
            self.shields += 1
            await self.close()
            logger.warning("%s flood: %d arrivals within %.0f s; refused by p2pd for %.0f s", self.name,
                           self.trigger, self.window_s, self.shield_s)
            await asyncio.sleep(self.shield_s)
            await self.reopen()
            self.reopened_at = self.clock()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # p2pd gone: the transport is closing
            logger.debug("%s shield: %r", self.name, e)
        finally:
            self.task = None

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

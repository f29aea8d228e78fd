"""A private asyncio event loop on a daemon thread, and bounded synchronous calls into it.

The libp2p transport runs its daemon client, DHT node and packet server on such a loop, so the
node's own thread never blocks in asyncio and every call it makes has a time limit. A call that
runs out of time is cancelled on the loop (not left running), and `run` waits briefly for the
cancellation to finish before it raises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CANCEL_WAIT_S = 2.0  # how long a timed-out call waits for its coroutine to unwind after cancel()


class CallTimeout(TimeoutError):
    """A coroutine submitted with `LoopThread.run` did not finish in time (it was cancelled)."""


class LoopThread:
    """An event loop running forever on its own daemon thread until `stop`."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def on_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `coro` on the loop and return its result; raises CallTimeout after `timeout` seconds
        (the coroutine is cancelled first) and whatever the coroutine raised."""
        if self.on_loop_thread():
            coro.close()
            raise RuntimeError("a synchronous transport call must not be made from the transport's own thread")
        finished = threading.Event()

        async def tracked() -> T:
            try:
                return await coro
            finally:
                finished.set()

        fut = asyncio.run_coroutine_threadsafe(tracked(), self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            if fut.done() and not fut.cancelled():
                raise  # the coroutine's own TimeoutError, not ours
            fut.cancel()  # propagates to the task on the loop
            finished.wait(CANCEL_WAIT_S)
            raise CallTimeout(f"no answer within {timeout:.3g} s") from None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop and join the thread; the loop is closed once the thread has ended."""
        if self.on_loop_thread():
            raise RuntimeError("the transport must not be stopped from its own thread")
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)
        if not self.thread.is_alive() and not self.loop.is_closed():
            self.loop.close()

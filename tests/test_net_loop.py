"""net/loop.py: bounded synchronous calls into a private event loop."""
from __future__ import annotations

import asyncio
import time

import pytest

from swarm_node.net.loop import CallTimeout, LoopThread


def test_a_timed_out_call_is_cancelled_not_left_running():
    lt = LoopThread("test-loop")
    state = []

    async def slow():
        try:
            await asyncio.sleep(10)
            state.append("finished")
        except asyncio.CancelledError:
            await asyncio.sleep(0.1)  # unwinding takes a moment: run() waits for it
            state.append("cancelled")
            raise

    try:
        t0 = time.monotonic()
        with pytest.raises(CallTimeout):
            lt.run(slow(), 0.2)
        assert state == ["cancelled"] and time.monotonic() - t0 < 1.5

        async def own_timeout():
            raise TimeoutError("mine")

        with pytest.raises(TimeoutError, match="mine") as err:  # the coroutine's own, not mistaken for ours
            lt.run(own_timeout(), 5)
        assert not isinstance(err.value, CallTimeout)
        assert lt.run(asyncio.sleep(0, "x"), 1) == "x"

        async def call_from_the_loop_thread():
            return lt.run(asyncio.sleep(0), 1)

        with pytest.raises(RuntimeError, match="own thread"):
            lt.run(call_from_the_loop_thread(), 5)
    finally:
        lt.stop()
    assert not lt.thread.is_alive() and lt.loop.is_closed()

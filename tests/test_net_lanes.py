"""net/lanes.py: which stream ids a node registers in p2pd (a recording stand-in for p2pd here; the real
p2pd runs in tests/test_net_flood.py)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from swarm_node.net import lanes as lanes_module
from swarm_node.net import shield as shield_module
from swarm_node.net.lanes import LANE_INFIX, SHIELD_TRIGGER, Kind, Lanes, lane_token

ANNOUNCE, FETCH, DIALBACK = ("/a/2", "a.legacy"), ("/f/1", "f.legacy"), ("/d/1",)


class Daemon:
    """p2pd's handler table: registering an id twice fails, as p2pd's does."""

    def __init__(self, fail_on: str | None = None):
        self.handlers: dict[str, object] = {}
        self.fail_on = fail_on

    async def add_binary_stream_handler(self, proto, handler):
        if proto in self.handlers or (self.fail_on and self.fail_on in proto):
            raise RuntimeError(f"handler for protocol {proto} already set")
        self.handlers[proto] = handler

    async def remove_binary_stream_handler(self, proto):
        del self.handlers[proto]


class Writer:
    closed = False

    def close(self):
        self.closed = True


def make(daemon: Daemon, served: list) -> Lanes:
    async def serve(info, reader, writer):
        served.append(str(info.peer_id))
    kinds = {"announce": Kind(ANNOUNCE, serve), "fetch": Kind(FETCH, serve), "dialback": Kind(DIALBACK, serve, laned=False)}
    return Lanes(daemon, kinds, secret=b"s" * 32)


def test_a_lane_is_registered_for_its_peer_alone_and_goes_with_it():
    async def main():
        daemon, served = Daemon(), []
        lanes = make(daemon, served)
        await lanes.listen()
        assert set(daemon.handlers) == {*ANNOUNCE, *FETCH, *DIALBACK}
        field = await lanes.give("QmH")
        token = field["lane"]
        assert lane_token(field) == token == lanes.token("QmH") != lanes.token("QmX") and len(token) == 32
        assert lanes.open["QmH"] == [ANNOUNCE[0] + LANE_INFIX + token, FETCH[0] + LANE_INFIX + token]
        assert await lanes.give("QmH") == field  # again: registered once (p2pd refuses a second time)
        handler = daemon.handlers[ANNOUNCE[0] + LANE_INFIX + token]
        await handler(SimpleNamespace(peer_id="QmX"), None, w := Writer())
        assert w.closed and served == []  # another id on H's lane: closed unread
        await handler(SimpleNamespace(peer_id="QmH"), None, Writer())
        assert served == ["QmH"]
        await lanes.keep({"QmOther"})
        assert "QmH" not in lanes.open and set(daemon.handlers) == {*ANNOUNCE, *FETCH, *DIALBACK}
    asyncio.run(main())


def test_a_lane_that_fails_half_way_leaves_nothing_registered():
    async def main():
        daemon = Daemon(fail_on=FETCH[0] + LANE_INFIX)
        lanes = make(daemon, [])
        with pytest.raises(RuntimeError):
            await lanes.give("QmH")
        assert daemon.handlers == {} and lanes.open == {}
        daemon.fail_on = None
        await lanes.give("QmH")  # and it can be registered later
        assert len(daemon.handlers) == 2
    asyncio.run(main())


def test_peers_lanes_are_read_strictly_and_tried_first():
    lanes = make(Daemon(), [])
    for bad in ({"lane": "A" * 32}, {"lane": "a" * 31}, {"lane": 7}, {"lane": "0" * 31 + "g"}, {}, "junk"):
        lanes.heard("QmH", bad)
        assert lanes.protocols("QmH", "fetch") == FETCH
    lanes.heard("QmH", {"lane": "0f" * 16})
    assert lanes.protocols("QmH", "announce") == (ANNOUNCE[0] + LANE_INFIX + "0f" * 16, *ANNOUNCE)
    lanes.heard("QmH", {"status": "full"})  # a frame without one: it keeps no lane for us
    assert lanes.protocols("QmH", "announce") == ANNOUNCE
    for i in range(lanes_module.MAX_THEIRS + 10):
        lanes.heard(f"Qm{i}", {"lane": "0f" * 16})
    assert len(lanes.theirs) == lanes_module.MAX_THEIRS


def test_a_flood_on_the_public_ids_shuts_them_for_a_while_and_longer_when_it_comes_back(monkeypatch):
    monkeypatch.setattr(shield_module, "SHIELD_S", 0.2)

    async def main():
        daemon, served = Daemon(), []
        lanes = make(daemon, served)
        lanes.shield.shield_s = 0.2
        await lanes.listen()
        await lanes.give("QmH")
        public = daemon.handlers[FETCH[1]]
        for i in range(SHIELD_TRIGGER - 1):
            await public(SimpleNamespace(peer_id=f"QmS{i}"), None, Writer())
        await asyncio.sleep(0)
        assert not lanes.shield.up() and len(served) == SHIELD_TRIGGER - 1  # served (or refused) by the handler
        await public(SimpleNamespace(peer_id="QmS"), None, Writer())
        await asyncio.sleep(0.05)
        assert lanes.shield.up() and lanes.shield.shields == 1 and not lanes.public
        assert sorted(daemon.handlers) == sorted(lanes.open["QmH"])  # only H's lanes are left
        await asyncio.sleep(0.3)
        assert not lanes.shield.up() and lanes.public == {*ANNOUNCE, *FETCH, *DIALBACK} and set(daemon.handlers) >= lanes.public
        public = daemon.handlers[DIALBACK[0]]
        for i in range(SHIELD_TRIGGER):  # back at once: shut twice as long
            await public(SimpleNamespace(peer_id=f"QmS{i}"), None, Writer())
        await asyncio.sleep(0.05)
        assert lanes.shield.up() and lanes.shield.shields == 2 and lanes.shield.shield_s == 0.4
        await asyncio.sleep(0.3)
        assert lanes.shield.up()
        lanes.shield.cancel()
    asyncio.run(main())

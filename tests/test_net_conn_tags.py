"""conn_tags.py: neighbours tagged in p2pd's connection manager, against real p2pd processes (slow)."""
from __future__ import annotations

import asyncio

import pytest
from hivemind.p2p import P2P
from hivemind.proto import p2pd_pb2

from swarm_node.net import conn_tags
from swarm_node.net.conn_tags import ConnTags
from swarm_node.net.hivemind_internals import conn_manager

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
GRACE_S = 1.0


class SmallP2P(P2P):
    """A p2pd whose connection manager trims down to one connection, and sees peers past a 1 s grace (p2pd's
    defaults: 256, 2 min)."""

    @staticmethod
    def _make_process_args(*args, **kwargs) -> list[str]:
        return P2P._make_process_args(*args, **kwargs, connLo=1, connHi=100, connGrace=f"{GRACE_S:g}s")


async def connect(dialler: P2P, target: P2P) -> None:
    addrs = [m.decapsulate(f"/p2p/{target.peer_id}") for m in await target.get_visible_maddrs()]
    await dialler._client.connect(target.peer_id, addrs)


async def trimmed(node: P2P) -> set[str]:
    """Past the grace, ask p2pd to trim now (as it does by itself past `high` connections); who is left."""
    await asyncio.sleep(GRACE_S + 0.5)
    await conn_manager(node, p2pd_pb2.ConnManagerRequest.TRIM)
    await asyncio.sleep(0.3)
    return {str(p.peer_id) for p in await node.list_peers()}


async def kept_through_a_trim(tagged: bool, reconnected: bool = False) -> tuple[bool, int]:
    """Node A, a neighbour B that dialled A, three strangers A dialled; a trim past the grace. Whether B's connection
    survived, and how many peers A still has. All peers are DHT clients: p2pd's Kademlia marks no one.
    `reconnected`: B's connection closes and B dials again after it was tagged, and the lane loop goes on."""
    node = await SmallP2P.create(host_maddrs=LOCAL)
    others = [await P2P.create(host_maddrs=LOCAL, dht_mode="client") for _ in range(4)]
    try:
        neighbour, strangers = others[0], others[1:]
        await connect(neighbour, node)  # inbound for A: p2pd closes inbound peers first among equals
        for stranger in strangers:
            await connect(node, stranger)
        clock = [0.0]
        tags = ConnTags(node, clock=lambda: clock[0])
        wanted = {str(neighbour.peer_id)} if tagged else set()
        await tags.keep(wanted)
        if reconnected:  # p2pd forgets a peer's tags with its last connection
            await node._client.disconnect(neighbour.peer_id)
            await asyncio.sleep(0.3)
            await connect(neighbour, node)
            await tags.keep(wanted)  # within TAG_REFRESH_S: nothing sent
            clock[0] += conn_tags.TAG_REFRESH_S
            await tags.keep(wanted)  # the refresh tags it again
        left = await trimmed(node)
        return str(neighbour.peer_id) in left, len(left)
    finally:
        for p2p in [node, *others]:
            await p2p.shutdown()


@pytest.mark.slow
def test_a_trim_closes_strangers_connections_before_a_tagged_neighbours_even_after_it_reconnected():
    assert asyncio.run(kept_through_a_trim(tagged=True)) == (True, 1)
    assert asyncio.run(kept_through_a_trim(tagged=False)) == (False, 1)  # what red team 26 saw: the neighbour went first
    assert asyncio.run(kept_through_a_trim(tagged=True, reconnected=True)) == (True, 1)


@pytest.mark.slow
def test_tags_follow_the_wanted_set_and_a_failed_request_is_tried_again(caplog):
    async def run() -> None:
        node = await P2P.create(host_maddrs=LOCAL)
        peer = await P2P.create(host_maddrs=LOCAL, dht_mode="client")
        try:
            await connect(peer, node)
            tags, pid = ConnTags(node), str(peer.peer_id)
            await tags.keep({pid})
            assert set(tags.tagged) == {pid}
            await tags.keep(set())
            assert tags.tagged == {}
            await node.shutdown()  # p2pd gone: the request fails, is logged, and nothing is recorded as tagged
            await tags.keep({pid})
            assert tags.tagged == {} and "cannot tag" in caplog.text
        finally:
            await peer.shutdown()
    asyncio.run(run())

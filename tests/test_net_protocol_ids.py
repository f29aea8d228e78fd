"""Stream protocol ids every libp2p stack accepts (issue 28): versioned, with a leading "/"; the legacy
ids are still served, and a node dials the new id first and falls back to the legacy one."""
from __future__ import annotations

import asyncio
import os
import re

import pytest

from swarm_node.net.lanes import Kind
from swarm_node.net.reach import DIALBACK_PROTOCOL
from swarm_node.net.records import (ANNOUNCE_PROTOCOL, ANNOUNCE_PROTOCOLS, FETCH_PROTOCOL, FETCH_PROTOCOLS,
                                    LEGACY_ANNOUNCE_PROTOCOL, LEGACY_FETCH_PROTOCOL)
from swarm_node.wire.codec import digest as packet_digest

# rust-libp2p's StreamProtocol::try_from_owned refuses ids that do not start with "/"
VERSIONED = re.compile(r"/swarm-node/[a-z]+/\d+\.\d+\.\d+")


def test_every_stream_protocol_id_is_versioned_with_a_leading_slash():
    for proto in (FETCH_PROTOCOL, ANNOUNCE_PROTOCOL, DIALBACK_PROTOCOL):
        assert VERSIONED.fullmatch(proto), proto
    assert FETCH_PROTOCOLS == (FETCH_PROTOCOL, LEGACY_FETCH_PROTOCOL)  # dial order: new first
    assert ANNOUNCE_PROTOCOLS == (ANNOUNCE_PROTOCOL, LEGACY_ANNOUNCE_PROTOCOL)
    assert not LEGACY_FETCH_PROTOCOL.startswith("/") and not LEGACY_ANNOUNCE_PROTOCOL.startswith("/")


@pytest.mark.slow
def test_both_ids_are_served_and_a_fetch_falls_back_to_the_legacy_id():
    from hivemind.p2p import PeerID
    from test_net_hivemind import config, started, wait_until

    from swarm_node.net.hivemind_internals import open_stream

    a = started(config())
    b = None
    try:
        b = started(config(peers=a.join_addrs()))
        target = PeerID.from_base58(a.peer_id)

        async def negotiated(protos) -> str:
            info, _, writer = await open_stream(b._p2p, target, protos)
            writer.close()
            return info.proto

        # A serves every id, alone or offered in dial order; the new one wins when both are offered
        for proto in (*FETCH_PROTOCOLS, *ANNOUNCE_PROTOCOLS):
            assert b._run(negotiated(proto), 10) == proto
        assert b._run(negotiated(FETCH_PROTOCOLS), 10) == FETCH_PROTOCOL
        assert b._run(negotiated(ANNOUNCE_PROTOCOLS), 10) == ANNOUNCE_PROTOCOL

        # A turns into a node of the previous release: it serves the legacy fetch id only, its lanes included
        # (the lane it gives B from now on is named after the legacy id, which B never dials)
        async def legacy_only():
            lanes = a._push.lanes
            async with lanes.lock:
                await a._p2p.remove_binary_stream_handler(FETCH_PROTOCOL)
                lanes.public.discard(FETCH_PROTOCOL)
                lanes.kinds["fetch"] = Kind((LEGACY_FETCH_PROTOCOL,), lanes.kinds["fetch"].serve)
            await lanes.close(b.peer_id)  # the lanes A gave B on the new fetch id
        a._run(legacy_only(), 10)

        async def probe() -> bool:
            try:
                _, reader, writer = await open_stream(b._p2p, target, FETCH_PROTOCOL)
            except Exception as e:  # noqa: BLE001 - the refusal is p2pd's error text
                return "protocols not supported" in str(e)
            try:  # p2pd negotiates lazily an id A listed in identify: the refusal comes as the stream's end,
                await asyncio.wait_for(reader.read(1), 2)  # and p2pd drops the id from what it knows of A
            except asyncio.TimeoutError:
                pass
            finally:
                writer.close()
            return False

        assert wait_until(lambda: b._run(probe(), 10), 15)
        data = os.urandom(100_000)
        digest = a.offer(3, 1, data)
        assert digest == packet_digest(data)
        assert wait_until(lambda: [p for p in b.peers() if p.offers], 15)
        got = b.collect(3, 3, min_peers=1, deadline_s=10)
        assert [x.data for x in got.packets] == [data]
    finally:
        for sw in (b, a):
            if sw is not None:
                sw.close()

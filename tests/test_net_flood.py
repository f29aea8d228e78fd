"""Announcement flood (issue 27), real p2pd on 127.0.0.1: one id opens announce streams in 8 loops
as fast as it can; the victim closes the streams over the id's rate unread, graylists the id within
5 s, and its rounds with an honest peer keep going."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from swarm_node.config import SwarmConfig
from swarm_node.harness.dht_attacker import announce_loop
from swarm_node.net.hivemind import HivemindTransport

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
FLOOD_S, LOOPS, MAX_STREAMS = 8.0, 8, 20_000


async def flood(p2p, target: str, announcement: dict, counts: dict) -> None:
    """LOOPS concurrent loops of valid announcement exchanges with `target`, for FLOOD_S at most."""
    from hivemind.p2p import PeerID

    t_end = time.monotonic() + FLOOD_S
    await asyncio.gather(*(announce_loop(p2p, PeerID.from_base58(target), announcement, counts, t_end,
                                         max_streams=MAX_STREAMS) for _ in range(LOOPS)))


@pytest.mark.slow
def test_an_id_flooding_announce_streams_is_graylisted_and_rounds_go_on():
    run = "flood"
    v = HivemindTransport(SwarmConfig(run_id=run, host_maddrs=LOCAL, fetch_timeout_s=3.0), "m", "tok")
    v.measure()  # as the exchange does: accepted packets are credited
    v.start()
    h = attacker = None
    try:
        h = HivemindTransport(SwarmConfig(run_id=run, host_maddrs=LOCAL, fetch_timeout_s=3.0, peers=v.join_addrs()),
                              "m", "tok")
        h.measure()
        h.start()
        attacker = HivemindTransport(SwarmConfig(run_id=run, host_maddrs=LOCAL, peers=v.join_addrs()), "m", "tok",
                                     discovery="dht-key")
        attacker.start()
        announcement = {"run_id": run, "seq": 1, "degree": 0, "model_id": "m", "tokenizer": "tok",
                        "protocol": v.protocol, "round": 1, "policy_version": 1, "offers": [], "addrs": [], "peers": []}
        counts = {"sent": 0, "answered": 0, "errors": 0}

        async def start():
            return asyncio.get_running_loop().create_task(flood(attacker._p2p, v.peer_id, announcement, counts))
        task = attacker._run(start(), 10)
        t0, t_gray, waits, r = time.monotonic(), None, [], 0
        while time.monotonic() - t0 < FLOOD_S + 1 and r < 200:
            r += 1
            data = {n.peer_id: os.urandom(2_000) for n in (v, h)}
            for n in (v, h):
                n.offer(r, r, data[n.peer_id])
            t = time.monotonic()
            got = v.collect(r, r, min_peers=1, deadline_s=10)
            waits.append(time.monotonic() - t)
            assert [(x.peer_id, x.data) for x in got.packets] == [(h.peer_id, data[h.peer_id])], r
            v.credit(h.peer_id)  # as the exchange does for an accepted packet
            h.collect(r, r, min_peers=1, deadline_s=10)
            h.credit(v.peer_id)
            if t_gray is None and v.stats()["peers_graylisted"] > 0:
                t_gray = time.monotonic() - t0
        stats = v.stats()
        attacker._run(asyncio.wait_for(task, 10), 15)
        print(f"\nflood: {counts} in {FLOOD_S:.0f} s; victim: graylisted after {t_gray} s, "
              f"{stats['streams_over_rate']} streams over rate, {stats['announces_received']} answered; "
              f"{r} rounds, wait p50 {sorted(waits)[len(waits) // 2]:.3f} s max {max(waits):.3f} s")
        assert t_gray is not None and t_gray <= 5.0
        assert stats["peers_graylisted"] == 1 and attacker.peer_id not in {p.peer_id for p in v.peers()}
        # H kept; the flooder's first (valid) announcements made it a neighbour, the graylist evicted it
        assert stats["mesh_credited"] == 1 and stats["neighbors_evicted"] <= 1 and h.peer_id in {p.peer_id for p in v.peers()}
        assert counts["answered"] < 100 and r >= 5 and max(waits) < 3.0
    finally:
        for n in (v, h, attacker):
            if n is not None:
                n.close()

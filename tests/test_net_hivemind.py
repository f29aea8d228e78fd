"""HivemindTransport: real libp2p nodes (p2pd child processes) on 127.0.0.1 (slow)."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

import psutil
import pytest

from swarm_node.config import SwarmConfig
from swarm_node.net import SwarmError
from swarm_node.net.hivemind import HivemindTransport
from swarm_node.net.identity import load_or_create_identity, peer_id_of
from swarm_node.wire.codec import digest as packet_digest

LOCAL = ["/ip4/127.0.0.1/tcp/0"]


def config(run_id="run-a", **kw) -> SwarmConfig:
    kw.setdefault("host_maddrs", LOCAL)
    kw.setdefault("bootstrap_retry_s", 1.0)
    kw.setdefault("fetch_timeout_s", 3.0)
    return SwarmConfig(run_id=run_id, **kw)


def started(cfg: SwarmConfig, model="m", tok="tok") -> HivemindTransport:
    sw = HivemindTransport(cfg, model, tok)
    sw.start()
    return sw


def wait_until(pred, timeout: float, step: float = 0.2):
    t_end = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > t_end:
            return value
        time.sleep(step)


def p2pd_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running() and "p2pd" in p.name()]


def assert_p2pd_gone(sw: HivemindTransport) -> None:
    pid = sw._p2pd_pid
    assert pid is not None
    if psutil.pid_exists(pid):
        try:
            proc = psutil.Process(pid)
            assert proc.status() == psutil.STATUS_ZOMBIE or proc.ppid() != os.getpid()
        except psutil.NoSuchProcess:
            pass


def serve_wrong_bytes(sw: HivemindTransport, digest: str, data: bytes) -> None:
    """Make `sw` serve `data` under a digest it does not hash to (on the transport's own thread)."""
    async def put():
        sw._offers.add(5, digest, data)
    sw._run(put(), 5)


@pytest.mark.slow
def test_two_nodes_discover_transfer_and_faults():
    a = started(config())
    b = c = None
    try:
        b = started(config(peers=a.join_addrs()))
        c = started(config(run_id="run-other", peers=a.join_addrs()))
        assert all(m.endswith("/p2p/" + a.peer_id) for m in a.join_addrs())

        data = os.urandom(3 * 2**20 + 123)  # larger than p2pd's 4 MiB/2 unary payload limit
        digest = packet_digest(data)
        assert a.offer(5, 2, data) == digest
        assert wait_until(lambda: any(p.peer_id == b.peer_id for p in a.peers()), 15)
        peers_b = wait_until(lambda: [p for p in b.peers() if p.offers], 15)
        assert [p.peer_id for p in peers_b] == [a.peer_id]
        info = peers_b[0]
        assert (info.model_id, info.tokenizer, info.protocol, info.round, info.policy_version) == ("m", "tok", 1, 5, 2)
        assert info.offers == [(5, digest, len(data))]

        t0 = time.monotonic()
        got = b.collect(5, 5, min_peers=1, deadline_s=20)
        assert time.monotonic() - t0 < 10
        assert len(got.packets) == 1 and got.packets[0].data == data and got.packets[0].peer_id == a.peer_id
        assert (got.packets[0].round, got.packets[0].digest) == (5, digest) and set(b._delivery.delivered) == {digest}
        assert got.peers == 1 and b.stats()["bytes_in"] == len(data) and a.stats()["bytes_out"] == len(data)

        # min_peers unreachable: returns at the deadline, nothing new (digest already delivered)
        t0 = time.monotonic()
        assert b.collect(0, 2**40, min_peers=1, deadline_s=1.5).packets == []
        assert 1.4 < time.monotonic() - t0 < 1.5 + 1.5
        # distrust (from this thread, applied on the transport's): never fetched from A again
        b.distrust(a.peer_id, digest)
        assert digest not in b._delivery.delivered and b.collect(5, 5, min_peers=1, deadline_s=1.0).packets == []

        # unknown digest -> clean "not found"
        assert b.fetch(a.peer_id, packet_digest(b"nope")) is None and b.stats()["fetch_not_found"] == 1
        # a peer serving bytes that do not match the digest: dropped, counted, not retried
        fake = packet_digest(b"promised")
        serve_wrong_bytes(a, fake, b"something else")
        assert b.fetch(a.peer_id, fake) is None and b.stats()["digest_mismatches"] == 1
        # declared size above our limit: refused before reading
        b.cfg.max_packet_bytes = 2**20
        assert b.fetch(a.peer_id, digest) is None and b.stats()["fetch_oversize"] == 1
        b.cfg.max_packet_bytes = 16 * 2**20

        # a peer that accepts the stream but never answers costs at most fetch_timeout_s
        async def hang(reader, writer, *_):
            await asyncio.sleep(3600)

        a._server._respond = hang
        t0 = time.monotonic()
        assert b.fetch(a.peer_id, digest) is None
        assert time.monotonic() - t0 < b.cfg.fetch_timeout_s + 2.0 and b.stats()["fetch_timeouts"] == 1

        # the other run shares the DHT but sees nobody, and nobody sees it
        assert c.peers() == [] and all(p.peer_id != c.peer_id for p in a.peers() + b.peers())
    finally:
        for sw in (a, b, c):
            if sw is not None:
                sw.close()
    for sw in (a, b, c):
        assert_p2pd_gone(sw)
    a.close()  # idempotent
    assert p2pd_children() == []


@pytest.mark.slow
def test_three_nodes_and_vanishing_peer():
    a = started(config())
    b = c = None
    try:
        b = started(config(peers=a.join_addrs()))
        c = started(config(peers=a.join_addrs(), fetch_timeout_s=2.0))  # knows only A
        pa, pb = os.urandom(200_000), os.urandom(300_000)
        a.offer(1, 1, pa)
        b.offer(1, 1, pb)
        assert wait_until(lambda: sum(bool(p.offers) for p in c.peers()) == 2, 20)
        got = c.collect(1, 1, min_peers=2, deadline_s=20).packets
        assert sorted((r.peer_id, r.data) for r in got) == sorted([(a.peer_id, pa), (b.peer_id, pb)])

        # B offers a new packet, C sees the offer, then B vanishes before C fetches it
        pb2 = os.urandom(100_000)
        b.offer(2, 2, pb2)
        assert wait_until(lambda: any(p.round == 2 for p in c.peers()), 20)
        b.close()
        assert_p2pd_gone(b)
        t0 = time.monotonic()
        assert c.collect(2, 2, min_peers=1, deadline_s=4.0).packets == []
        assert time.monotonic() - t0 < 4.0 + 1.5
        t0 = time.monotonic()
        assert c.fetch(b.peer_id, packet_digest(pb2)) is None
        assert time.monotonic() - t0 < 2.0 + 1.0
        # A and C keep working
        pa2 = os.urandom(1000)
        a.offer(2, 2, pa2)
        got = c.collect(2, 2, min_peers=1, deadline_s=10).packets
        assert [(r.peer_id, r.data) for r in got] == [(a.peer_id, pa2)]
    finally:
        for sw in (a, b, c):
            if sw is not None:
                sw.close()
    assert p2pd_children() == []


@pytest.mark.slow
def test_identity_persists_and_is_exclusive(tmp_path):
    path = str(tmp_path / "ids" / "node.key")  # parent directory is created
    first = started(config(identity=path))
    try:
        pid = first.peer_id
        assert all(m.endswith("/p2p/" + pid) for m in first.join_addrs())
        with pytest.raises(SwarmError, match="already used by another running node"):
            HivemindTransport(config(identity=path), "m", "tok").start()
    finally:
        first.close()
    second = started(config(identity=path))
    try:
        assert second.peer_id == pid
    finally:
        second.close()
    with pytest.raises(SwarmError):
        second.start()  # a closed transport is not restartable
    assert p2pd_children() == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_unreachable_initial_peer_then_it_appears(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="swarm_node.net.hivemind")
    a_path = str(tmp_path / "a.key")
    a_key, _ = load_or_create_identity(a_path)  # A's peer id is known before A runs
    port = _free_port()
    a_addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_of(a_key.public_key())}"
    t0 = time.monotonic()
    b = started(config(peers=[a_addr]))
    a = None
    try:
        assert time.monotonic() - t0 < 10 and b.peers() == []
        time.sleep(2.5)
        time.sleep(2.0)  # retries after 1 s, then 2 s, then 4 s (backoff): one line each, naming the wait
        warnings = [r.getMessage() for r in caplog.records if "initial peers answered" in r.getMessage()]
        assert 2 <= len(warnings) <= 3 and "retrying in 1 s" in warnings[0] and "next try in 4 s" in warnings[-1]
        a = started(config(identity=a_path, host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"]))
        assert wait_until(lambda: [p.peer_id for p in b.peers()] == [a.peer_id], 15)
        assert wait_until(lambda: [p.peer_id for p in a.peers()] == [b.peer_id], 15)
    finally:
        b.close()
        if a is not None:
            a.close()
    assert p2pd_children() == []


def test_bad_initial_peer_is_a_clear_error():
    with pytest.raises(SwarmError, match="bad initial peer"):
        HivemindTransport(config(peers=["/ip4/127.0.0.1/tcp/1"]), "m", "tok")
    sw = HivemindTransport(config(), "m", "tok")
    with pytest.raises(SwarmError, match="not running"):
        sw.peers()
    with pytest.raises(SwarmError, match="not running"):
        sw.distrust("QmA", packet_digest(b"x"))


@pytest.mark.slow
def test_any_answering_peer_is_enough_over_ipv4_and_ipv6(caplog):
    caplog.set_level(logging.WARNING, logger="swarm_node.net.hivemind")
    a = started(config(host_maddrs=["/ip4/127.0.0.1/tcp/0", "/ip6/::1/tcp/0"]))
    b = None
    try:
        addrs = a.join_addrs()
        assert any(m.startswith("/ip4/127.0.0.1/") for m in addrs) and any(m.startswith("/ip6/::1/") for m in addrs)
        dead = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{peer_id_of(load_or_create_identity(None)[0].public_key())}"
        ip6 = next(m for m in addrs if m.startswith("/ip6/"))
        b = started(config(host_maddrs=["/ip6/::1/tcp/0"], peers=[dead, ip6]))  # the first one is down
        assert not [r for r in caplog.records if "initial peers answered" in r.getMessage()]
        assert b.join_addrs()[0].startswith("/ip6/::1/")
        data = os.urandom(5000)
        a.offer(1, 1, data)
        got = b.collect(1, 1, min_peers=1, deadline_s=10).packets
        assert [(r.peer_id, r.data) for r in got] == [(a.peer_id, data)]
        b.offer(1, 1, data[::-1])
        assert [r.peer_id for r in a.collect(1, 1, min_peers=1, deadline_s=10).packets] == [b.peer_id]
    finally:
        for sw in (a, b):
            if sw is not None:
                sw.close()
    assert p2pd_children() == []


@pytest.mark.slow
def test_discovery_v1_still_works_and_a_v2_node_says_clearly_that_a_v1_peer_is_too_old(caplog):
    caplog.set_level(logging.WARNING, logger="swarm_node.net.announce")
    old = HivemindTransport(config(), "m", "tok", discovery="dht-key")
    old.start()
    old2 = new = None
    try:
        old2 = HivemindTransport(config(peers=old.join_addrs()), "m", "tok", discovery="dht-key")
        old2.start()
        data = os.urandom(2000)
        old.offer(1, 1, data)
        assert [r.data for r in old2.collect(1, 1, min_peers=1, deadline_s=15).packets] == [data]  # v1 <-> v1
        new = started(config(peers=old.join_addrs()))
        assert wait_until(lambda: [r for r in caplog.records if "does not accept /swarm-node/announce/2.0.0" in r.getMessage()],
                          10)
        new.offer(1, 1, os.urandom(100))
        assert new.peers() == [] and new.collect(1, 1, min_peers=1, deadline_s=1).packets == []
        assert all(p.peer_id != new.peer_id for p in old.peers())  # v1 nodes never see v2 nodes either
    finally:
        for sw in (old, old2, new):
            if sw is not None:
                sw.close()
    with pytest.raises(SwarmError, match="swarm.discovery must be one of push|dht-key"):
        HivemindTransport(config(), "m", "tok", discovery="gossip")
    assert p2pd_children() == []


def test_a_daemon_that_starts_too_slowly_is_one_clear_error():
    sw = HivemindTransport(config(start_timeout_s=0.001), "m", "tok")
    with pytest.raises(SwarmError, match="swarm.start_timeout_s"):
        sw.start()
    assert p2pd_children() == []


@pytest.mark.slow
def test_a_restarted_node_finds_its_anchor_again_without_any_initial_peer(tmp_path):
    """The outbound neighbour that delivered is saved beside the identity file (`<identity>.anchors`);
    restarted with no --peers, the node dials it first and is in the swarm again. Control: the same
    identity without the file stays alone."""
    import json
    from pathlib import Path

    path = str(tmp_path / "a.key")
    anchors = Path(path + ".anchors")
    b = started(config())
    try:
        a = started(config(identity=path, peers=b.join_addrs()))
        try:
            assert wait_until(lambda: b.peer_id in a.neighbours(), 15)
            assert wait_until(lambda: set(a._push.tags.tagged) == {b.peer_id}, 5)  # p2pd trims B last (conn_tags.py)
            assert not anchors.exists()  # nothing delivered yet: nothing worth remembering
            a.credit(b.peer_id)
            assert [r["peer"] for r in json.loads(anchors.read_text())] == [b.peer_id]
            assert len(json.loads(anchors.read_text())[0]["lane"]) == 32  # B's lane for A: tried first after a restart
        finally:
            a.close()
        again = started(config(identity=path))
        try:
            assert wait_until(lambda: b.peer_id in again.neighbours(), 20)
        finally:
            again.close()
        anchors.unlink()
        alone = started(config(identity=path))
        try:
            time.sleep(3.0)
            assert alone.neighbours() == {}
        finally:
            alone.close()
    finally:
        b.close()
    assert p2pd_children() == []


@pytest.mark.slow
def test_a_node_speaks_noise_only_so_a_stranger_cannot_pick_a_costlier_handshake():
    """A stranger picks the handshake whose answer costs the node most: a TLS 1.3 ClientHello offering only P-521
    costs p2pd 7.7-8.2 ms, a Noise answer one RSA signature, 2.0-2.5 ms (red team 29, bench/handshake_cost.py).
    A node answers /noise, refuses /tls/1.0.0 with either hello, and a dialer with hivemind's flags connects."""
    from hivemind.p2p import P2P, PeerID
    from hivemind.utils.multiaddr import Multiaddr

    from swarm_node.harness.handshake_flood import HELLOS, attempt

    node = started(config())
    try:
        addr = next(m for m in node.join_addrs() if m.startswith("/ip4/127.0.0.1/tcp/"))
        port = int(addr.split("/tcp/")[1].split("/")[0])

        async def tries() -> list[bool]:
            answers = [await attempt("127.0.0.1", port, 3.0, HELLOS[kind]()) for kind in ("noise", "tls", "tls-p521")]
            client = await P2P.create(host_maddrs=LOCAL, dht_mode="client")
            try:
                await client._client.connect(PeerID.from_base58(node.peer_id), [Multiaddr(addr.split("/p2p/")[0])])
                return answers + [node.peer_id in {str(p.peer_id) for p in await client.list_peers()}]
            finally:
                await client.shutdown()
        assert asyncio.run(tries()) == [True, False, False, True]
    finally:
        node.close()

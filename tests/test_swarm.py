"""Swarm transport: record validation (unit) and real libp2p nodes on 127.0.0.1 (slow)."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import time

import msgpack
import psutil
import pytest

from swarm_node.swarm import Swarm, SwarmError, SwarmRecordValidator, SwarmSettings, _wrap_rsa, packet_digest
from swarm_node.swarm_fetch import PacketServer, collect_offers, request_packet
from swarm_node.swarm_identity import IdentityLock, decode_key_pb, load_or_create_identity, peer_id_of
from swarm_node.swarm_records import (
    MAX_OFFERS_IN_RECORD, FrameError, PeerInfo, RecordError, decode_frame_body, encode_frame, frame_length,
    make_record, parse_record, record_key,
)

LOCAL = ["/ip4/127.0.0.1/tcp/0"]


def settings(run_id="run-a", **kw) -> SwarmSettings:
    kw.setdefault("host_maddrs", LOCAL)
    kw.setdefault("bootstrap_retry_s", 1.0)
    kw.setdefault("fetch_timeout_s", 3.0)
    return SwarmSettings(run_id=run_id, **kw)


def started(s: SwarmSettings, model="m", tok="tok") -> Swarm:
    sw = Swarm(s, model, tok)
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


def assert_p2pd_gone(sw: Swarm) -> None:
    pid = sw._p2pd_pid
    assert pid is not None
    if psutil.pid_exists(pid):
        try:
            proc = psutil.Process(pid)
            assert proc.status() == psutil.STATUS_ZOMBIE or proc.ppid() != os.getpid()
        except psutil.NoSuchProcess:
            pass


# ---- unit: records, frames, validator -------------------------------------------------------------
def _record(peer_id="QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", offers=()):
    return make_record(peer_id, "model", "tok", 1, 3, 2, list(offers), 1000.0)


def test_record_schema_bounds():
    d = packet_digest(b"x")
    info = parse_record(_record(offers=[(3, d, 1)]))
    assert info.offers == [(3, d, 1)] and info.round == 3 and info.policy_version == 2
    assert parse_record({**_record(), "future_field": [1, 2]}).model_id == "model"  # extra fields ignored
    bad = [
        {**_record(), "round": True},  # bools are not ints
        {**_record(), "round": -1},
        {**_record(), "round": 1.0},
        {**_record(), "model_id": "x" * 300},
        {**_record(), "peer_id": "not base58 0OIl"},
        {**_record(), "offers": [[1, "sha256:" + "A" * 64, 5]]},  # upper-case hex
        {**_record(), "offers": [[1, d, 5]] * (MAX_OFFERS_IN_RECORD + 1)},
        {**_record(), "offers": [[1, d]]},
        {**_record(), "updated_at": float("nan")},
        {k: v for k, v in _record().items() if k != "tokenizer"},
        [1, 2, 3],
    ]
    for obj in bad:
        with pytest.raises(RecordError):
            parse_record(obj)


def test_frames():
    frame = encode_frame({"run_id": "r", "digest": packet_digest(b"")})
    assert frame_length(frame[:4]) == len(frame) - 4
    assert decode_frame_body(frame[4:])["run_id"] == "r"
    with pytest.raises(FrameError):
        frame_length((10**6).to_bytes(4, "big"))
    with pytest.raises(FrameError):
        frame_length(b"\0\0\0\0")
    with pytest.raises(FrameError):
        decode_frame_body(msgpack.packb([1, 2]))


def test_identity_file_and_peer_id(tmp_path):
    from hivemind.p2p import PeerID

    path = str(tmp_path / "node.key")
    key, raw = load_or_create_identity(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o400
    key2, raw2 = load_or_create_identity(path)
    assert raw2 == raw and key2.private_numbers() == key.private_numbers()
    assert decode_key_pb(raw)[0] == 0  # RSA
    # our peer id derivation == libp2p's (as implemented by hivemind for identity files)
    assert peer_id_of(key.public_key()) == PeerID.from_identity(raw).to_base58()
    lock = IdentityLock(path)
    with pytest.raises(SwarmError, match="already used by another running node"):
        IdentityLock(path)
    lock.release()
    IdentityLock(path).release()
    (tmp_path / "bad.key").write_bytes(b"garbage")
    with pytest.raises(SwarmError):
        load_or_create_identity(str(tmp_path / "bad.key"))


def test_validator_rejects_forged_and_malformed_records():
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils.serializer import MSGPackSerializer

    key_x, _ = load_or_create_identity(None)
    key_y, _ = load_or_create_identity(None)
    vx, vy = SwarmRecordValidator(_wrap_rsa(key_x), "run-a"), SwarmRecordValidator(_wrap_rsa(key_y), "run-a")
    pid_x, pid_y = (peer_id_of(k.public_key()) for k in (key_x, key_y))
    key_id = DHTID.generate(source=record_key("run-a")).to_bytes()
    expiration = time.time() + 60

    def signed(validator, subkey: bytes, value: dict, key: bytes = key_id) -> DHTRecord:
        rec = DHTRecord(key, MSGPackSerializer.dumps(subkey), MSGPackSerializer.dumps(value), expiration)
        return DHTRecord(rec.key, rec.subkey, validator.sign_value(rec), expiration)

    good = signed(vy, vy.local_public_key, _record(pid_y))
    assert vx.validate(good) and vx.stats["records_rejected"] == 0
    assert MSGPackSerializer.loads(vx.strip_value(good))["peer_id"] == pid_y

    # X signs a record placed in Y's subkey: X's signature does not verify under Y's key
    forged = DHTRecord(key_id, good.subkey, signed(vx, vx.local_public_key, _record(pid_y)).value, expiration)
    assert vx.check(forged) == "bad signature" and not vx.validate(forged)
    # Y (validly signed, own subkey) claims X's libp2p peer id
    assert "peer_id" in vx.check(signed(vy, vy.local_public_key, _record(pid_x)))
    # tampered value / extended expiration after signing
    tampered = DHTRecord(key_id, good.subkey, good.value.replace(b"model", b"MODEL"), expiration)
    assert vx.check(tampered) == "bad signature"
    assert vx.check(DHTRecord(key_id, good.subkey, good.value, expiration + 1)) == "bad signature"
    # unsigned subkey, other run's key, bad schema, absurd expiration
    assert "subkey" in vx.check(DHTRecord(key_id, MSGPackSerializer.dumps(b"anyone"), MSGPackSerializer.dumps(
        _record(pid_y)), expiration))
    other_key = DHTID.generate(source=record_key("run-b")).to_bytes()
    assert "key" in vx.check(signed(vy, vy.local_public_key, _record(pid_y), key=other_key))
    assert "schema" in vx.check(signed(vy, vy.local_public_key, {**_record(pid_y), "round": "3"}))
    far = DHTRecord(key_id, good.subkey, MSGPackSerializer.dumps(_record(pid_y)), time.time() + 10**6)
    far = DHTRecord(far.key, far.subkey, vy.sign_value(far), far.expiration_time)
    assert "expiration" in vx.check(far)
    assert vx.stats["records_rejected"] == 1


async def _pipe(server: PacketServer):
    """A client (reader, writer) connected to ``server`` over a unix socketpair."""
    a, b = socket.socketpair()
    server_side = await asyncio.open_connection(sock=a)
    task = asyncio.ensure_future(server.handle(*server_side))
    reader, writer = await asyncio.open_connection(sock=b)
    return reader, writer, task


def test_fetch_protocol_over_plain_streams():
    data = os.urandom(2_500_000)
    d = packet_digest(data)
    fake = packet_digest(b"promised")
    table = {d: data, fake: b"other bytes"}

    async def main():
        stats: dict[str, int] = {}
        server = PacketServer("run-a", table.get, stats)

        async def fetch(run_id, digest, max_bytes=16 * 2**20):
            reader, writer, task = await _pipe(server)
            try:
                return await asyncio.wait_for(request_packet(reader, writer, run_id, digest, max_bytes), 5)
            finally:
                writer.close()
                await task

        assert await fetch("run-a", d) == (data, "ok")
        assert await fetch("run-a", packet_digest(b"unknown")) == (None, "not_found")
        assert await fetch("run-b", d) == (None, "not_found")  # other runs' requests are not served
        assert await fetch("run-a", fake) == (None, "mismatch")
        assert await fetch("run-a", d, max_bytes=2**20) == (None, "oversize")
        reader, writer, task = await _pipe(server)  # garbage request -> bad_request reply
        writer.write(b"\0\0\0\3abc")
        header = decode_frame_body(await reader.readexactly(frame_length(await reader.readexactly(4))))
        assert header == {"status": "bad_request"}
        writer.close()
        await task
        assert stats["bytes_out"] == len(data) + len(b"other bytes") and stats["serve_not_found"] == 2

        # collect: deadline-bounded, de-duplicated, skip rule, `seen` updated
        offers = [(1, d, len(data)), (2, fake, 11), (9, packet_digest(b"x"), 1)]
        peers = [PeerInfo("QmA", "m", "t", 1, 1, 1, offers, 0.0), PeerInfo("QmB", "m", "t", 1, 1, 1, offers, 0.0)]
        calls = []

        async def list_peers(timeout):
            return peers

        async def fake_fetch(peer, digest, timeout):
            calls.append((peer, digest))
            return (table[digest], "ok") if digest == d else (None, "mismatch")

        seen: set[str] = set()
        kw = dict(wanted=lambda r: r < 5, keep=lambda p: True, skip=lambda p, dg: False, poll_s=0.05,
                  fetch_timeout_s=1.0, max_packet_bytes=16 * 2**20)
        t0 = time.monotonic()
        got = await collect_offers(list_peers, fake_fetch, seen=seen, min_packets=5, deadline_s=0.5, **kw)
        assert 0.45 < time.monotonic() - t0 < 1.0
        assert [(g.peer_id, g.digest, g.data == data) for g in got] == [("QmA", d, True)] and seen == {d}
        assert (("QmA", packet_digest(b"x")) not in calls) and calls.count(("QmA", d)) == 1
        got = await collect_offers(list_peers, fake_fetch, seen=set(), min_packets=0, deadline_s=5, **kw)
        assert len(got) == 1  # min_packets=0: one pass, then return

    asyncio.run(main())


# ---- real libp2p nodes -----------------------------------------------------------------------------
@pytest.mark.slow
def test_two_nodes_discover_transfer_and_faults():
    a = started(settings())
    b = c = None
    try:
        b = started(settings(initial_peers=a.visible_maddrs()))
        c = started(settings(run_id="run-other", initial_peers=a.visible_maddrs()))
        assert all(m.endswith("/p2p/" + a.peer_id) for m in a.visible_maddrs())

        data = os.urandom(3 * 2**20 + 123)  # larger than p2pd's 4 MiB/2 unary payload limit
        digest = packet_digest(data)
        a.offer(5, 2, data, digest)
        assert wait_until(lambda: any(p.peer_id == b.peer_id for p in a.peers()), 15)
        peers_b = wait_until(lambda: [p for p in b.peers() if p.offers], 15)
        assert [p.peer_id for p in peers_b] == [a.peer_id]
        info = peers_b[0]
        assert (info.model_id, info.tokenizer, info.protocol, info.round, info.policy_version) == ("m", "tok", 1, 5, 2)
        assert info.offers == [(5, digest, len(data))]

        seen: set[str] = set()
        t0 = time.monotonic()
        got = b.collect(range(5, 6), seen, min_packets=1, deadline_s=20)
        assert time.monotonic() - t0 < 10
        assert len(got) == 1 and got[0].data == data and got[0].peer_id == a.peer_id
        assert (got[0].round, got[0].digest) == (5, digest) and seen == {digest}
        assert b.stats["bytes_in"] == len(data) and a.stats["bytes_out"] == len(data)

        # min_packets unreachable: returns at the deadline, nothing new (digest already seen)
        t0 = time.monotonic()
        assert b.collect(lambda r: True, seen, min_packets=1, deadline_s=1.5) == []
        assert 1.4 < time.monotonic() - t0 < 1.5 + 1.5

        # unknown digest -> clean "not found"
        assert b.fetch(a.peer_id, packet_digest(b"nope")) is None and b.stats["fetch_not_found"] == 1
        # a peer serving bytes that do not match the digest: dropped, counted, not retried
        fake = packet_digest(b"promised")
        with a._lock:
            a._offers[fake] = (5, b"something else")
        assert b.fetch(a.peer_id, fake) is None and b.stats["digest_mismatches"] == 1
        # declared size above our limit: refused before reading
        b.settings.max_packet_bytes = 2**20
        assert b.fetch(a.peer_id, digest) is None and b.stats["fetch_oversize"] == 1
        b.settings.max_packet_bytes = 16 * 2**20

        # a peer that accepts the stream but never answers costs at most fetch_timeout_s
        async def hang(reader, writer):
            await asyncio.sleep(3600)

        a._server._respond = hang
        t0 = time.monotonic()
        assert b.fetch(a.peer_id, digest) is None
        assert time.monotonic() - t0 < b.settings.fetch_timeout_s + 2.0 and b.stats["fetch_timeouts"] == 1

        # the other run shares the DHT but sees nobody, and nobody sees it
        assert c.peers() == [] and all(p.peer_id != c.peer_id for p in a.peers() + b.peers())
    finally:
        for sw in (a, b, c):
            if sw is not None:
                sw.shutdown()
    for sw in (a, b, c):
        assert_p2pd_gone(sw)
    a.shutdown()  # idempotent
    assert p2pd_children() == []


@pytest.mark.slow
def test_three_nodes_and_vanishing_peer():
    a = started(settings())
    b = c = None
    try:
        b = started(settings(initial_peers=a.visible_maddrs()))
        c = started(settings(initial_peers=a.visible_maddrs(), fetch_timeout_s=2.0))  # knows only A
        pa, pb = os.urandom(200_000), os.urandom(300_000)
        a.offer(1, 1, pa, packet_digest(pa))
        b.offer(1, 1, pb, packet_digest(pb))
        assert wait_until(lambda: sum(bool(p.offers) for p in c.peers()) == 2, 20)
        seen: set[str] = set()
        got = c.collect([1], seen, min_packets=2, deadline_s=20)
        assert sorted((r.peer_id, r.data) for r in got) == sorted([(a.peer_id, pa), (b.peer_id, pb)])

        # B offers a new packet, C sees the offer, then B vanishes before C fetches it
        pb2 = os.urandom(100_000)
        b.offer(2, 2, pb2, packet_digest(pb2))
        assert wait_until(lambda: any(p.round == 2 for p in c.peers()), 20)
        b.shutdown()
        assert_p2pd_gone(b)
        t0 = time.monotonic()
        assert c.collect([2], seen, min_packets=1, deadline_s=4.0) == []
        assert time.monotonic() - t0 < 4.0 + 1.5
        t0 = time.monotonic()
        assert c.fetch(b.peer_id, packet_digest(pb2)) is None
        assert time.monotonic() - t0 < 2.0 + 1.0
        # A and C keep working
        pa2 = os.urandom(1000)
        a.offer(2, 2, pa2, packet_digest(pa2))
        got = c.collect([2], seen, min_packets=1, deadline_s=10)
        assert [(r.peer_id, r.data) for r in got] == [(a.peer_id, pa2)]
    finally:
        for sw in (a, b, c):
            if sw is not None:
                sw.shutdown()
    assert p2pd_children() == []


@pytest.mark.slow
def test_identity_persists_and_is_exclusive(tmp_path):
    path = str(tmp_path / "ids" / "node.key")  # parent directory is created
    first = started(settings(identity_path=path))
    try:
        pid = first.peer_id
        assert all(m.endswith("/p2p/" + pid) for m in first.visible_maddrs())
        with pytest.raises(SwarmError, match="already used by another running node"):
            Swarm(settings(identity_path=path), "m", "tok").start()
    finally:
        first.shutdown()
    second = started(settings(identity_path=path))
    try:
        assert second.peer_id == pid
    finally:
        second.shutdown()
    with pytest.raises(SwarmError):
        second.start()  # a shut-down Swarm is not restartable
    assert p2pd_children() == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_unreachable_initial_peer_then_it_appears(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="swarm_node.swarm")
    a_path = str(tmp_path / "a.key")
    a_key, _ = load_or_create_identity(a_path)  # A's peer id is known before A runs
    port = _free_port()
    a_addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_of(a_key.public_key())}"
    t0 = time.monotonic()
    b = started(settings(initial_peers=[a_addr]))
    a = None
    try:
        assert time.monotonic() - t0 < 10 and b.peers() == []
        time.sleep(2.5)
        warnings = [r for r in caplog.records if "initial peers answered" in r.getMessage()]
        assert 1 <= len(warnings) <= int((time.monotonic() - t0) / b.settings.bootstrap_retry_s) + 1
        a = started(settings(identity_path=a_path, host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"]))
        assert wait_until(lambda: [p.peer_id for p in b.peers()] == [a.peer_id], 15)
        assert wait_until(lambda: [p.peer_id for p in a.peers()] == [b.peer_id], 15)
    finally:
        b.shutdown()
        if a is not None:
            a.shutdown()
    assert p2pd_children() == []


def test_bad_initial_peer_is_a_clear_error():
    with pytest.raises(SwarmError, match="bad initial peer"):
        Swarm(settings(initial_peers=["/ip4/127.0.0.1/tcp/1"]), "m", "tok")
    sw = Swarm(settings(), "m", "tok")
    with pytest.raises(SwarmError, match="not running"):
        sw.peers()

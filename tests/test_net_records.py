"""net/records.py: discovery schemas (v1 records, v2 announcements and membership records) and frames (no libp2p)."""
from __future__ import annotations

import msgpack
import pytest

from swarm_node.net.records import (MAX_ADDRS, MAX_ANNOUNCE_BYTES, MAX_FRAME_BYTES, MAX_OFFERS_IN_RECORD, MAX_PX,
                                    MAX_ROUND, MEMBER_BUCKETS, FrameError, RecordError, decode_frame_body, encode_frame,
                                    frame_length, make_announcement, make_member_record, make_record, member_bucket,
                                    member_key, parse_announcement, parse_member_record, parse_record)
from swarm_node.wire.codec import digest


def _record(peer_id="QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", offers=()):
    return make_record(peer_id, "model", "tok", 1, 3, 2, list(offers), 1000.0)


def test_record_schema_bounds():
    d = digest(b"x")
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


def test_make_record_keeps_the_newest_offers_and_refuses_what_peers_would_reject():
    offers = [(r, digest(str(r).encode()), 10) for r in range(MAX_OFFERS_IN_RECORD + 3)]
    assert [o[0] for o in parse_record(_record(offers=offers)).offers] == list(range(3, MAX_OFFERS_IN_RECORD + 3))
    with pytest.raises(RecordError):
        _record(offers=[(1, "sha256:short", 1)])


def test_frames():
    frame = encode_frame({"run_id": "r", "digest": digest(b"")})
    assert frame_length(frame[:4]) == len(frame) - 4
    assert decode_frame_body(frame[4:])["run_id"] == "r"
    with pytest.raises(FrameError):
        frame_length((10**6).to_bytes(4, "big"))
    with pytest.raises(FrameError):
        frame_length(b"\0\0\0\0")
    with pytest.raises(FrameError):
        decode_frame_body(msgpack.packb([1, 2]))


def test_v2_announcement_and_membership_schemas():
    d = digest(b"x")
    ann = make_announcement("run", 7, "model", "tok", 1, 3, 2, [(3, d, 10)], ["/ip4/127.0.0.1/tcp/5"],
                            [("QmPeer", ["/ip4/10.0.0.1/tcp/6"])], degree=4)
    got = parse_announcement({**ann, "future_field": 1}, "QmSender", 12.5)  # the sender is the stream's peer
    assert (got.info.peer_id, got.info.round, got.info.offers, got.info.updated_at) == ("QmSender", 3, [(3, d, 10)], 12.5)
    assert (got.run_id, got.seq, got.degree, got.addrs, got.peers) == (
        "run", 7, 4, ["/ip4/127.0.0.1/tcp/5"], [("QmPeer", ["/ip4/10.0.0.1/tcp/6"])])
    bad = [
        {**ann, "round": MAX_ROUND + 1},  # the round 2^63-1 is junk: no packet can carry it
        {**ann, "offers": [[MAX_ROUND + 1, d, 1]]},
        {**ann, "seq": -1},
        {**ann, "addrs": ["not a multiaddr"]},
        {**ann, "addrs": ["/ip4/1/tcp/1"] * (MAX_ADDRS + 1)},
        {**ann, "peers": [["QmPeer", ["/ip4/1/tcp/1"]]] * (MAX_PX + 1)},
        {**ann, "peers": [["0OIl", []]]},  # not base58
        {k: v for k, v in ann.items() if k != "degree"},
    ]
    for obj in bad:
        with pytest.raises(RecordError):
            parse_announcement(obj, "QmSender", 0.0)
    member = parse_member_record(make_member_record("QmPeer", 1, ["/ip4/1/tcp/1"], 5.0))
    assert (member.peer_id, member.protocol, member.addrs) == ("QmPeer", 1, ["/ip4/1/tcp/1"])
    with pytest.raises(RecordError):
        parse_member_record({"peer_id": "QmPeer", "protocol": True, "addrs": [], "updated_at": 1.0})
    assert member_key("run", 3) == "swarm-node/run/v2/members/3" and 0 <= member_bucket("QmPeer") < MEMBER_BUCKETS
    # announcement frames may be larger than fetch frames, up to their own limit
    big = {"x": "y" * 4000}
    assert frame_length(encode_frame(big, MAX_ANNOUNCE_BYTES)[:4], MAX_ANNOUNCE_BYTES) > MAX_FRAME_BYTES
    with pytest.raises(FrameError):
        encode_frame(big)


def lying_lengths(size: int) -> bytes:
    """Nested array16 headers that each claim 8,192 entries (msgpack presizes a container to its claim), padded."""
    body = b"\xdc\x20\x00" * (size // 6)
    return body + b"\xc0" * (size - len(body))


def test_a_frame_of_lying_container_lengths_is_refused_without_allocating_what_it_claims():
    """Red team 17: an 8 KiB announcement frame of 1,024 such headers made the reader allocate 67 MB and spend
    48 ms before it failed; now no container may claim more than MAX_CONTAINER entries."""
    import tracemalloc

    from swarm_node.net.records import MAX_CONTAINER
    tracemalloc.start()
    try:
        with pytest.raises(FrameError):
            decode_frame_body(lying_lengths(MAX_ANNOUNCE_BYTES))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"{peak / 1e6:.1f} MB allocated for an {MAX_ANNOUNCE_BYTES} B frame"
    assert decode_frame_body(msgpack.packb({"peers": [[str(i), []] for i in range(MAX_CONTAINER)]}))
    with pytest.raises(FrameError):
        decode_frame_body(msgpack.packb({"peers": [[str(i), []] for i in range(MAX_CONTAINER + 1)]}))


def test_a_frame_with_an_ext_type_is_refused():
    """An ext is opaque to our parse but decoded by hivemind's reader (red team 17: one record with a bad ext made
    every read of its DHT bucket fail); no frame or record of ours has one."""
    with pytest.raises(FrameError):
        decode_frame_body(msgpack.packb({"status": "ok", "x": msgpack.ExtType(0x40, b"\xc1")}))

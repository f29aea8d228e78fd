"""Discovery schemas, limits and framing: the transport's plain data.

    discovery v2 (the default): announcements pushed over `ANNOUNCE_PROTOCOL` streams (the stream
        authenticates the sender, so they are unsigned) and small signed membership records in
        `MEMBER_BUCKETS` DHT keys (net/announce.py, net/discovery.py)
    discovery v1 ("dht-key", kept for benchmarks): one signed record per node under one DHT key
    fetch framing (both): u32 length + msgpack map
    send_announcement / serve_announcement: one announcement exchange over a stream

No hivemind here: everything in this module can be tested (and re-implemented by a third party)
without libp2p. The byte-level protocol is specified in protocol/SPEC.md (sections 11-12).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from swarm_node.net import PeerInfo

# ---- names and limits (protocol/SPEC.md sections 11-12) ---------------------------------------
DISCOVERY_VERSION = 2
ANNOUNCE_PROTOCOL = "/swarm-node/announce/2.0.0"  # libp2p stream protocol id of announcements (v2)
LEGACY_ANNOUNCE_PROTOCOL = "swarm_node.announce.v2"  # the same protocol's id before 2026-11 (no leading "/")
ANNOUNCE_PROTOCOLS = (ANNOUNCE_PROTOCOL, LEGACY_ANNOUNCE_PROTOCOL)  # served both; dialled in this order
MEMBER_KEY_FORMAT = "swarm-node/{run_id}/v2/members/{bucket}"  # DHT keys of membership records (v2)
MEMBER_BUCKETS = 8  # membership keys per run; a node writes to bucket H(peer id) mod MEMBER_BUCKETS
MAX_BUCKET_ENTRIES = 64  # a holder keeps at most this many records per membership key (the latest-expiring)
MAX_MEMBER_BYTES = 1024  # msgpack membership record, signature stripped
MAX_MEMBER_TTL_S = 600.0  # a membership record may not expire later than now + this
MAX_ANNOUNCE_BYTES = 8192  # one announcement frame (request or reply), msgpack part
MAX_ADDRS = 4  # multiaddrs per peer in an announcement, a membership record or a peer-exchange entry
MAX_ADDR_CHARS = 256
MAX_PX = 8  # peer-exchange entries per announcement
MAX_DEGREE = 1024  # largest neighbor count an announcement may state
MAX_ROUND = 2**53 - 1  # v2: rounds above the packet codec's integer range are junk (no packet can carry them)
STATUS_FULL, STATUS_REFUSED = "full", "refused"  # announcement replies besides "ok"
RECORD_KEY_FORMAT = "swarm-node/{run_id}/peers"  # v1 DHT key; the subkey is the owner's "[owner:ssh-rsa ...]"
FETCH_PROTOCOL = "/swarm-node/fetch/1.0.0"  # libp2p stream protocol id of the packet server
LEGACY_FETCH_PROTOCOL = "swarm_node.fetch.v1"  # the same protocol's id before 2026-11 (rust-libp2p refuses it)
FETCH_PROTOCOLS = (FETCH_PROTOCOL, LEGACY_FETCH_PROTOCOL)  # served both; dialled in this order (SPEC section 12)
MAX_RECORD_BYTES = 4096  # msgpack record value, signature stripped
MAX_SIGNED_RECORD_BYTES = 8192  # record value as stored in the DHT (record + "[signature:...]")
MAX_RECORD_TTL_S = 3600.0  # a record may not expire later than now + this (bounds stale entries)
MAX_OFFERS_IN_RECORD = 16
MAX_STR = 256
MAX_FRAME_BYTES = 1024  # request frame and response header frame (msgpack part)
CHUNK_BYTES = 1 << 20  # server writes (and client reads) the packet body in pieces of this size
REQUEST_TIMEOUT_S = 10.0  # server: the request frame must arrive this soon after the stream opens
SERVE_TIMEOUT_S = 120.0  # server: a whole response must be written within this
MAX_CONCURRENT_UPLOADS = 8  # server: more concurrent fetches are answered "busy"
MAX_INT = 2**63 - 1
MAX_CONTAINER = 64  # entries in any msgpack array or map a peer sends us (the largest we define: 16 offers)
MAX_SIZE = 2**31  # largest packet size a record may announce

STATUS_OK, STATUS_NOT_FOUND, STATUS_BAD_REQUEST, STATUS_BUSY = "ok", "not_found", "bad_request", "busy"
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_B58_RE = re.compile(r"[1-9A-HJ-NP-Za-km-z]{1,128}")
_U32 = struct.Struct(">I")


class RecordError(ValueError):
    """A DHT record value that does not match the schema."""


class FrameError(ValueError):
    """A malformed fetch-protocol frame."""


def is_digest(s: Any) -> bool:
    return isinstance(s, str) and _DIGEST_RE.fullmatch(s) is not None


def record_key(run_id: str) -> str:
    return RECORD_KEY_FORMAT.format(run_id=run_id)


# ---- record schema ----------------------------------------------------------------------------
def member_key(run_id: str, bucket: int) -> str:
    return MEMBER_KEY_FORMAT.format(run_id=run_id, bucket=bucket)


def member_bucket(peer_id: str) -> int:
    """The membership bucket a peer writes to: sha256(peer id) mod MEMBER_BUCKETS."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:8], "big") % MEMBER_BUCKETS


def _int(obj: dict, name: str, lo: int, hi: int) -> int:
    v = obj.get(name)
    if type(v) is not int or not lo <= v <= hi:  # bool is rejected on purpose
        raise RecordError(f"{name}: expected int in [{lo}, {hi}], got {v!r:.80}")
    return v


def _str(obj: dict, name: str, max_len: int = MAX_STR) -> str:
    v = obj.get(name)
    if not isinstance(v, str) or len(v) > max_len:
        raise RecordError(f"{name}: expected str of at most {max_len} chars")
    return v


def make_record(
    peer_id: str, model_id: str, tokenizer: str, protocol: int, round: int, policy_version: int,
    offers: list[tuple[int, str, int]], updated_at: float,
) -> dict:
    rec = {
        "peer_id": peer_id, "model_id": model_id, "tokenizer": tokenizer, "protocol": protocol,
        "round": round, "policy_version": policy_version,
        "offers": [[r, d, s] for r, d, s in offers][-MAX_OFFERS_IN_RECORD:], "updated_at": float(updated_at),
    }
    parse_record(rec)  # never publish what peers would reject
    return rec


def _parse_offers(raw: Any, max_round: int = MAX_INT) -> list[tuple[int, str, int]]:
    if not isinstance(raw, (list, tuple)) or len(raw) > MAX_OFFERS_IN_RECORD:
        raise RecordError(f"offers: expected a list of at most {MAX_OFFERS_IN_RECORD} entries")
    offers = []
    for o in raw:
        if not isinstance(o, (list, tuple)) or len(o) != 3:
            raise RecordError("offers entry must be [round, digest, size]")
        r, d, s = o
        if type(r) is not int or not 0 <= r <= max_round or type(s) is not int or not 0 <= s <= MAX_SIZE:
            raise RecordError("offers entry: bad round or size")
        if not is_digest(d):
            raise RecordError("offers entry: digest must be 'sha256:' + 64 lowercase hex chars")
        offers.append((r, d, s))
    return offers


def parse_record(obj: Any) -> PeerInfo:
    """Validate a decoded record value (schema + bounds); unknown extra fields are ignored."""
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise RecordError("record must be a map with string keys")
    peer_id = _str(obj, "peer_id", 128)
    if not _B58_RE.fullmatch(peer_id):
        raise RecordError("peer_id must be a base58 libp2p peer id")
    offers = _parse_offers(obj.get("offers"))
    updated_at = _updated_at(obj)
    return PeerInfo(
        peer_id=peer_id, model_id=_str(obj, "model_id"), tokenizer=_str(obj, "tokenizer"),
        protocol=_int(obj, "protocol", 0, 2**31 - 1), round=_int(obj, "round", 0, MAX_INT),
        policy_version=_int(obj, "policy_version", 0, MAX_INT), offers=offers, updated_at=updated_at,
    )


# ---- v2: membership records (signed, in the DHT) and announcements (over authenticated streams) ---
@dataclass
class Member:
    """What a membership record says: a peer of this run and where it may be dialled."""

    peer_id: str
    protocol: int  # packet protocol version it speaks
    addrs: list[str]  # multiaddrs it claims (hints: the dialled peer id is what libp2p authenticates)
    updated_at: float


@dataclass
class Announcement:
    """One announcement received over a stream: the sender's offers and a few peers it knows."""

    info: PeerInfo  # peer_id = the stream's authenticated remote peer, never a field of the frame
    run_id: str
    seq: int  # the sender's version of its announcement: a receiver keeps the highest seen
    degree: int  # how many neighbors the sender has (a claim: sizes peer exchange only, never prunes; issue 27)
    addrs: list[str]  # the sender's own multiaddrs (claims)
    peers: list[tuple[str, list[str]]] = field(default_factory=list)  # peer exchange: (peer id, multiaddrs)
    manifest: str | None = None  # digest of the sender's run manifest (None: it announced none)


def _parse_peer_id(v: Any, what: str = "peer_id") -> str:
    if not isinstance(v, str) or not _B58_RE.fullmatch(v):
        raise RecordError(f"{what} must be a base58 libp2p peer id")
    return v


def _parse_addrs(raw: Any) -> list[str]:
    if not isinstance(raw, (list, tuple)) or len(raw) > MAX_ADDRS or not all(
            isinstance(a, str) and 0 < len(a) <= MAX_ADDR_CHARS and a.startswith("/") for a in raw):
        raise RecordError(f"addrs: expected at most {MAX_ADDRS} multiaddr strings")
    return list(raw)


def _updated_at(obj: dict) -> float:
    v = obj.get("updated_at")
    if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
        raise RecordError("updated_at: expected a finite non-negative number")
    return float(v)


def make_member_record(peer_id: str, protocol: int, addrs: list[str], updated_at: float) -> dict:
    rec = {"peer_id": peer_id, "protocol": protocol, "addrs": list(addrs)[:MAX_ADDRS], "updated_at": float(updated_at)}
    parse_member_record(rec)
    return rec


def parse_member_record(obj: Any) -> Member:
    """Validate a decoded membership record (schema + bounds); unknown extra fields are ignored."""
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise RecordError("record must be a map with string keys")
    return Member(_parse_peer_id(obj.get("peer_id")), _int(obj, "protocol", 0, 2**31 - 1),
                  _parse_addrs(obj.get("addrs")), _updated_at(obj))


def make_announcement(run_id: str, seq: int, model_id: str, tokenizer: str, protocol: int, round: int,
                      policy_version: int, offers: list[tuple[int, str, int]], addrs: list[str],
                      peers: list[tuple[str, list[str]]], degree: int = 0, produces: bool = True,
                      manifest: str | None = None) -> dict:
    """An announcement map (request frame, or the body of an "ok" reply), checked like a receiver would.
    `produces` False says the sender offers no packets (a relay, a light client): never wait for it.
    `manifest`: the digest of the sender's run manifest (swarm_node/wire/contract.py), if it has one."""
    ann = {"run_id": run_id, "seq": seq, "degree": degree, "model_id": model_id, "tokenizer": tokenizer, "protocol": protocol, "round": round,
           "policy_version": policy_version, "offers": [[r, d, s] for r, d, s in offers][-MAX_OFFERS_IN_RECORD:],
           "addrs": list(addrs)[:MAX_ADDRS], "peers": [[p, list(a)[:MAX_ADDRS]] for p, a in peers][:MAX_PX],
           "produces": bool(produces)}
    if manifest is not None:
        ann["manifest"] = manifest
    parse_announcement(ann, "Qm1", 0.0)
    return ann


def parse_peer_exchange(raw: Any) -> list[tuple[str, list[str]]]:
    if not isinstance(raw, (list, tuple)) or len(raw) > MAX_PX:
        raise RecordError(f"peers: expected a list of at most {MAX_PX} entries")
    out = []
    for entry in raw:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise RecordError("peers entry must be [peer id, [multiaddr, ...]]")
        out.append((_parse_peer_id(entry[0], "peers entry"), _parse_addrs(entry[1])))
    return out


def parse_announcement(obj: Any, peer_id: str, received_at: float) -> Announcement:
    """Validate a decoded announcement sent by the authenticated peer `peer_id`. Rounds above
    MAX_ROUND are malformed; unknown extra fields are ignored."""
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise RecordError("announcement must be a map with string keys")
    addrs = _parse_addrs(obj.get("addrs"))
    produces = obj.get("produces", True)  # optional (2026-11); absent: the legacy convention decides
    if type(produces) is not bool:
        raise RecordError("produces: expected a bool")
    manifest = obj.get("manifest")  # optional (2026-11): the digest of the sender's run manifest
    if manifest is not None and not is_digest(manifest):
        raise RecordError("manifest: expected 'sha256:' + 64 lowercase hex chars")
    info = PeerInfo(
        peer_id=peer_id, model_id=_str(obj, "model_id"), tokenizer=_str(obj, "tokenizer"),
        protocol=_int(obj, "protocol", 0, 2**31 - 1), round=_int(obj, "round", 0, MAX_ROUND),
        policy_version=_int(obj, "policy_version", 0, MAX_ROUND), offers=_parse_offers(obj.get("offers"), MAX_ROUND),
        updated_at=float(received_at), addrs=addrs, produces=produces)
    return Announcement(info, _str(obj, "run_id", 64), _int(obj, "seq", 0, MAX_ROUND), _int(obj, "degree", 0, MAX_DEGREE),
                        addrs, parse_peer_exchange(obj.get("peers")), manifest)


# ---- framing: u32 big-endian length + msgpack map (fetch requests/headers; announcements) ---------
def encode_frame(obj: dict, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > max_bytes:
        raise FrameError("frame too large")
    return _U32.pack(len(body)) + body


def frame_length(prefix: bytes, max_bytes: int = MAX_FRAME_BYTES) -> int:
    (n,) = _U32.unpack(prefix)
    if not 1 <= n <= max_bytes:
        raise FrameError(f"frame length {n} out of range")
    return n


def _refuse_ext(code: int, data: bytes) -> object:
    raise ValueError(f"msgpack ext type {code} is refused")


def unpack_untrusted(data: bytes) -> object:
    """msgpack from a peer, decoded with bounds: no array or map over MAX_CONTAINER entries (msgpack presizes a
    container to the length it claims, so 1,024 nested headers each claiming 8,192 entries made an 8 KiB frame
    cost 67 MB and 48 ms, and a 64 KiB DHT request half a second: red team 17), and no ext types (hivemind's
    reader decodes those that our parse left opaque, and one record with a bad ext made every read of its
    DHT bucket fail; msgpack reads the timestamp type -1 natively, and no field of ours accepts one). Raises
    ValueError (or msgpack's own errors) on anything else."""
    return msgpack.unpackb(data, raw=False, strict_map_key=True, max_array_len=MAX_CONTAINER,
                           max_map_len=MAX_CONTAINER, ext_hook=_refuse_ext)


def decode_frame_body(body: bytes) -> dict:
    try:
        obj = unpack_untrusted(body)
    except Exception as e:
        raise FrameError(f"undecodable frame: {e}") from None
    if not isinstance(obj, dict):
        raise FrameError("frame must be a msgpack map")
    return obj


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> dict:
    """One frame from `reader`, decoded; FrameError if malformed, IncompleteReadError if the stream ends first."""
    return decode_frame_body(await reader.readexactly(frame_length(await reader.readexactly(4), max_bytes)))


# ---- one announcement exchange over a stream -------------------------------------------------------------
async def send_announcement(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, obj: dict) -> tuple[dict, int, int]:
    """Client side: write our announcement frame, read the reply frame. (reply, bytes out, bytes in);
    I/O and frame errors raise; the caller bounds the call in time."""
    frame = encode_fitted(obj)
    writer.write(frame)
    await writer.drain()
    n = frame_length(await reader.readexactly(4), MAX_ANNOUNCE_BYTES)
    reply = decode_frame_body(await reader.readexactly(n))
    return reply, len(frame), 4 + n


async def serve_announcement(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             answer: Callable[[dict], dict]) -> tuple[int, int]:
    """Server side: read one announcement frame (within REQUEST_TIMEOUT_S), write `answer(frame)`.
    (bytes in, bytes out). A malformed frame is answered `refused`/`bad_request`."""
    try:
        n = frame_length(await asyncio.wait_for(reader.readexactly(4), REQUEST_TIMEOUT_S), MAX_ANNOUNCE_BYTES)
        obj = decode_frame_body(await asyncio.wait_for(reader.readexactly(n), REQUEST_TIMEOUT_S))
        reply, size_in = answer(obj), 4 + n
    except FrameError:
        reply, size_in = {"status": STATUS_REFUSED, "reason": "bad_request"}, 4
    frame = encode_fitted(reply)
    writer.write(frame)
    await writer.drain()
    return size_in, len(frame)


def encode_fitted(obj: dict) -> bytes:
    """`obj` as one announcement frame, its peer-exchange sample cut, last entries first, until it fits (packed
    once when it does): hearsay of long addresses made every announcement we sent, and every answer, too large
    to encode, which cut a node off from its honest peers (red team 12)."""
    peers = list(obj.get("peers") or [])
    while True:
        try:
            return encode_frame({**obj, "peers": peers} if "peers" in obj else obj, MAX_ANNOUNCE_BYTES)
        except FrameError:
            if not peers:
                raise
            peers.pop()


def frame_size(obj: dict) -> int:
    """Bytes of `obj` as a frame (for simulations and accounting)."""
    return 4 + len(msgpack.packb(obj, use_bin_type=True))

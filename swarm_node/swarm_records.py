"""Plain data, limits, record schema and fetch framing for the swarm transport.

This module must not import hivemind: it holds everything of the transport that can be
tested (and re-implemented by a third party) without libp2p. ``swarm.py`` wires it to
hivemind's P2P daemon and DHT. The byte-level protocol is specified in protocol/SPEC.md (sections 11-12).
"""
from __future__ import annotations

import hashlib
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

# ---- names and limits (see protocol/SPEC.md (sections 11-12)) -------------------------------------------
RECORD_KEY_FORMAT = "swarm-node/{run_id}/peers"  # DHT key; the subkey is the owner's "[owner:ssh-rsa ...]"
FETCH_PROTOCOL = "swarm_node.fetch.v1"  # libp2p stream protocol id of the packet server
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
MAX_SIZE = 2**31  # largest packet size a record may announce

STATUS_OK, STATUS_NOT_FOUND, STATUS_BAD_REQUEST, STATUS_BUSY = "ok", "not_found", "bad_request", "busy"
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_B58_RE = re.compile(r"[1-9A-HJ-NP-Za-km-z]{1,128}")
_U32 = struct.Struct(">I")


class SwarmError(Exception):
    """User-facing transport error with one clear message."""


class RecordError(ValueError):
    """A DHT record value that does not match the schema."""


class FrameError(ValueError):
    """A malformed fetch-protocol frame."""


@dataclass
class SwarmSettings:
    run_id: str
    initial_peers: list[str] = field(default_factory=list)  # multiaddrs ending in /p2p/<peer id>
    identity_path: str | None = None  # libp2p RSA key file (created if missing); None = ephemeral identity
    host_maddrs: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    announce_maddrs: list[str] = field(default_factory=list)
    record_ttl_s: float = 60.0
    fetch_timeout_s: float = 10.0
    max_packet_bytes: int = 16 * 2**20
    bootstrap_retry_s: float = 10.0
    max_offers: int = 4  # packets served at once (the newest ones)
    max_peer_packets: int = 4  # per collect call (one round): packets fetched from one peer at most
    max_peer_bytes: int = 32 * 2**20  # per collect call: declared bytes fetched from one peer at most
    # libp2p UPnP/NAT-PMP port mapping + AutoNAT + circuit-relay client. Off by default: port mapping
    # probes the LAN (multicast) and opens router ports; turn it on for home-NAT users.
    nat_traversal: bool = False


@dataclass
class PeerInfo:
    peer_id: str
    model_id: str
    tokenizer: str
    protocol: int
    round: int
    policy_version: int
    offers: list[tuple[int, str, int]]
    updated_at: float


@dataclass
class Received:
    peer_id: str  # authenticated libp2p peer id of the peer that served the bytes
    round: int
    digest: str
    data: bytes


def packet_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(s: Any) -> bool:
    return isinstance(s, str) and _DIGEST_RE.fullmatch(s) is not None


def record_key(run_id: str) -> str:
    return RECORD_KEY_FORMAT.format(run_id=run_id)


# ---- record schema ----------------------------------------------------------------------------
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


def parse_record(obj: Any) -> PeerInfo:
    """Validate a decoded record value (schema + bounds); unknown extra fields are ignored."""
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise RecordError("record must be a map with string keys")
    peer_id = _str(obj, "peer_id", 128)
    if not _B58_RE.fullmatch(peer_id):
        raise RecordError("peer_id must be a base58 libp2p peer id")
    offers_raw = obj.get("offers")
    if not isinstance(offers_raw, (list, tuple)) or len(offers_raw) > MAX_OFFERS_IN_RECORD:
        raise RecordError(f"offers: expected a list of at most {MAX_OFFERS_IN_RECORD} entries")
    offers = []
    for o in offers_raw:
        if not isinstance(o, (list, tuple)) or len(o) != 3:
            raise RecordError("offers entry must be [round, digest, size]")
        r, d, s = o
        if type(r) is not int or not 0 <= r <= MAX_INT or type(s) is not int or not 0 <= s <= MAX_SIZE:
            raise RecordError("offers entry: bad round or size")
        if not is_digest(d):
            raise RecordError("offers entry: digest must be 'sha256:' + 64 lowercase hex chars")
        offers.append((r, d, s))
    updated_at = obj.get("updated_at")
    if type(updated_at) not in (int, float) or not math.isfinite(updated_at) or updated_at < 0:
        raise RecordError("updated_at: expected a finite non-negative number")
    return PeerInfo(
        peer_id=peer_id, model_id=_str(obj, "model_id"), tokenizer=_str(obj, "tokenizer"),
        protocol=_int(obj, "protocol", 0, 2**31 - 1), round=_int(obj, "round", 0, MAX_INT),
        policy_version=_int(obj, "policy_version", 0, MAX_INT), offers=offers, updated_at=float(updated_at),
    )


# ---- fetch framing: u32 big-endian length + msgpack map ------------------------------------------
def encode_frame(obj: dict) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError("frame too large")
    return _U32.pack(len(body)) + body


def frame_length(prefix: bytes) -> int:
    (n,) = _U32.unpack(prefix)
    if not 1 <= n <= MAX_FRAME_BYTES:
        raise FrameError(f"frame length {n} out of range")
    return n


def decode_frame_body(body: bytes) -> dict:
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as e:
        raise FrameError(f"undecodable frame: {e}") from None
    if not isinstance(obj, dict):
        raise FrameError("frame must be a msgpack map")
    return obj

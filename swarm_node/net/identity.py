"""Node identity: one RSA key is both the libp2p identity (peer id) and the DHT record owner key.

The identity file is libp2p's serialized ``PrivateKey`` protobuf (the format p2pd reads with
``-id``): ``08 <key type varint> 12 <len varint> <PKCS#1 DER private key>``, RSA = 0.
Also here: the checks that bind a signed record value to its owner key. No hivemind here.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import re
import time

import base58
import msgpack
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from swarm_node.net import SwarmError
from swarm_node.net.records import MAX_RECORD_BYTES, MAX_RECORD_TTL_S, RecordError, parse_record, unpack_untrusted

logger = logging.getLogger(__name__)
KEY_TYPE_RSA = 0
RSA_EXPONENT = 65537  # the only public exponent accepted in a peer's key (key_policy_problem)
MIN_RSA_BITS, MAX_RSA_BITS = 2048, 4096  # accepted RSA modulus sizes, ours and peers'


def uvarint(n: int) -> bytes:
    """An unsigned LEB128 varint (protobuf, multistream-select lengths)."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def encode_key_pb(key_type: int, data: bytes) -> bytes:
    """libp2p crypto.proto PrivateKey/PublicKey {required KeyType Type = 1; required bytes Data = 2}."""
    return b"\x08" + uvarint(key_type) + b"\x12" + uvarint(len(data)) + data


def decode_key_pb(raw: bytes) -> tuple[int, bytes]:
    fields, pos = {}, 0

    def varint() -> int:
        nonlocal pos
        n = shift = 0
        while True:
            b = raw[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while pos < len(raw):
        tag = varint()
        if tag == 0x08:
            fields[1] = varint()
        elif tag == 0x12:
            n = varint()
            fields[2], pos = raw[pos:pos + n], pos + n
        else:
            raise ValueError(f"unexpected protobuf tag {tag}")
    if 1 not in fields or 2 not in fields or pos != len(raw):
        raise ValueError("incomplete key protobuf")
    return fields[1], fields[2]


def private_key_der(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def peer_id_of(public_key: rsa.RSAPublicKey) -> str:
    """libp2p peer id (base58btc) of an RSA key: multihash sha2-256 of the PublicKey protobuf (PKIX DER)."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base58.b58encode(b"\x12\x20" + hashlib.sha256(encode_key_pb(KEY_TYPE_RSA, der)).digest()).decode()


MAX_SUBKEY_BYTES = 1024  # a record subkey "[owner:ssh-rsa ...]" of a 4096-bit key is ~740 bytes
OWNER_RE = re.compile(rb"\[owner:(ssh-rsa [A-Za-z0-9+/]+={0,2})\]")  # hivemind's RSASignatureValidator marker
_owner_peer_ids: dict[bytes, str | None] = {}


def owner_key_of(subkey: bytes) -> bytes | None:
    """The OpenSSH public key in a record subkey (msgpack bin of exactly ``[owner:ssh-rsa ...]``). Longer than a
    4096-bit key's subkey: refused unread (each record of a DHT request was unpacked first: red team 17)."""
    if len(subkey) > MAX_SUBKEY_BYTES:
        return None
    try:
        obj = unpack_untrusted(subkey)
    except Exception:
        return None
    match = OWNER_RE.fullmatch(obj) if isinstance(obj, bytes) else None
    return match.group(1) if match else None


def key_policy_problem(public_key) -> str | None:
    """Why a peer's public key is refused before any RSA operation on it (None: accepted).

    A verification's cost grows with the modulus and the public exponent, both chosen by the key's
    owner: with a 3071-bit exponent one check cost 140x a normal one. So only RSA keys with
    e = 65537 and a 2048..4096-bit modulus are accepted (what every libp2p implementation makes)."""
    if not isinstance(public_key, rsa.RSAPublicKey):
        return "owner key is not an RSA public key"
    if not MIN_RSA_BITS <= public_key.key_size <= MAX_RSA_BITS:
        return f"RSA modulus of {public_key.key_size} bits (accepted: {MIN_RSA_BITS}..{MAX_RSA_BITS})"
    if public_key.public_numbers().e != RSA_EXPONENT:
        return f"RSA public exponent is not {RSA_EXPONENT}"
    return None


def owner_peer_id(ssh_key: bytes) -> str | None:
    """libp2p peer id of an OpenSSH RSA public key (None if `key_policy_problem` refuses it); cached, but for keys
    longer than a 4096-bit one's, refused uncached (1,000 refused 63 KB keys held 63 MB: red team 17)."""
    if len(ssh_key) > MAX_SUBKEY_BYTES:
        return None
    if ssh_key not in _owner_peer_ids:
        try:
            pub = serialization.load_ssh_public_key(ssh_key)
            pid = peer_id_of(pub) if key_policy_problem(pub) is None else None
        except Exception:
            pid = None
        if len(_owner_peer_ids) > 4096:
            _owner_peer_ids.clear()
        _owner_peer_ids[ssh_key] = pid
    return _owner_peer_ids[ssh_key]


def check_record_value(owner_ssh_key: bytes, value: bytes, expiration_time: float, *, parse=parse_record,
                       max_bytes: int = MAX_RECORD_BYTES, max_ttl_s: float = MAX_RECORD_TTL_S,
                       ttl_name: str = "MAX_RECORD_TTL_S") -> str | None:
    """Checks of a signature-verified record value: schema (`parse`), peer id bound to the owner key,
    expiry bound. None if valid, else the reason. (Only monotone time checks: a valid record stays
    valid.) v1 peer records by default; discovery.py passes the v2 membership record's schema."""
    if len(value) > max_bytes:
        return "record too large"
    try:
        info = parse(unpack_untrusted(value))
    except (RecordError, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        return f"schema: {e}"
    if info.peer_id != owner_peer_id(owner_ssh_key):
        return "peer_id is not the owner key's libp2p peer id"
    if not math.isfinite(expiration_time) or expiration_time > time.time() + max_ttl_s:
        return f"expiration must be finite and at most {ttl_name} ahead"  # NaN would never expire
    return None


def load_or_create_identity(path: str | None) -> tuple[rsa.RSAPrivateKey, bytes]:
    """(key, identity file bytes). ``None`` -> a fresh in-memory key; a missing file is created (mode 0400)."""
    if path is None or not os.path.exists(path):
        key = rsa.generate_private_key(public_exponent=RSA_EXPONENT, key_size=MIN_RSA_BITS)
        raw = encode_key_pb(KEY_TYPE_RSA, private_key_der(key))
        if path is not None:
            tmp = f"{path}.tmp{os.getpid()}"
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400), "wb") as f:
                f.write(raw)
            os.replace(tmp, path)  # atomic: a crash never leaves a half-written identity
            logger.info("created a new node identity in %s", path)
        return key, raw
    try:
        with open(path, "rb") as f:
            raw = f.read()
        key_type, der = decode_key_pb(raw)
        key = serialization.load_der_private_key(der, password=None) if key_type == KEY_TYPE_RSA else None
    except OSError as e:
        raise SwarmError(f"cannot read identity file {path}: {e}") from None
    except Exception:
        raise SwarmError(f"{path} is not a libp2p private key file") from None
    if not isinstance(key, rsa.RSAPrivateKey) or key_policy_problem(key.public_key()) is not None:
        raise SwarmError(f"{path}: swarm_node identities must be RSA keys of {MIN_RSA_BITS}..{MAX_RSA_BITS} bits "
                         f"with public exponent {RSA_EXPONENT} (the same key signs the node's DHT record, and "
                         "peers refuse other keys); delete the file to have a new one made")
    return key, raw


class IdentityLock:
    """Exclusive flock on ``<identity_path>.lock``, held until release() (or process exit)."""

    def __init__(self, identity_path: str):
        self.path = identity_path + ".lock"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(identity_path)), exist_ok=True)
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise SwarmError(f"cannot create identity lock file {self.path}: {e}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            self._fd = None
            raise SwarmError(
                f"identity {identity_path} is already used by another running node on this machine "
                f"(lock {self.path} is held); stop that node or give this one a different identity path"
            ) from None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

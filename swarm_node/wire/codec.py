"""Rollout packet codec: the wire format peers use to share GRPO completions.

A packet is one msgpack map carrying the groups a node generated in one round. Completions cost
8 bytes per token on the wire: token ids are one msgpack `bin` of little-endian uint32 and
generator log-probs one `bin` of little-endian float32; everything else is small header data.
The normative description is protocol/SPEC.md; this module is its reference implementation.

    data = encode(packet)              # canonical bytes (validates first)
    packet = decode(data, vocab_size)  # strict; raises only PacketError
    digest(data)                       # "sha256:<hex>": the content address of packet bytes
    tokenizer_fingerprint(vocab)       # "sha256:<hex>" of the vocabulary (SPEC.md section 5)

Decoding follows the check order of SPEC.md section 6: each msgpack header is checked (type,
then declared length against the limits) before its payload is touched, so hostile input never
makes us allocate anything proportional to a declared length. Decoded token/log-prob arrays are
read-only zero-copy numpy views into the packet bytes (copy them to write). Canonicity is checked
by comparing the canonical encoding with the input piece by piece, without building it.
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgpack
import numpy as np

from swarm_node.errors import SwarmNodeError

PROTOCOL_VERSION = 1

# Limits (SPEC.md "Limits"): 5x+ headroom over paper-size rounds on every axis; the byte cap
# bounds their product (64*64*8192*8 B would be 256 MiB).
MAX_PACKET_BYTES = 16 * 1024 * 1024  # whole encoded packet
MAX_GROUPS = 64  # groups per packet
MAX_COMPLETIONS = 64  # completions per group
MAX_TOKENS = 8192  # tokens per completion
MAX_PROMPT_TOKENS = 8192  # prompt tokens per group
MAX_STR_BYTES = 256  # UTF-8 bytes of every string field
MAX_UINT = 2**53 - 1  # integer fields: 0..2^53-1, exact in every language/JSON
MAX_TOKEN_ID = 2**32 - 1  # token ids are uint32 on the wire

MODES, FINISH_REASONS = ("vertical", "horizontal"), ("stop", "length")

ERROR_CODES = (  # every error code decode() / encode() can raise (SPEC.md "Errors")
    "bad_type",  # wrong msgpack/Python type (bool is not int; ext types; bin not a multiple of 4)
    "too_large",  # packet longer than MAX_PACKET_BYTES
    "bad_msgpack",  # malformed or truncated msgpack, invalid UTF-8 in a str value
    "trailing_bytes",  # bytes after the packet map
    "bad_version",  # empty map, first key not "version", or version not the integer PROTOCOL_VERSION
    "missing_field",  # a required key is absent
    "unknown_field",  # a key the spec does not define (v1 rejects them)
    "duplicate_field",  # a key appears twice in one map
    "limit_exceeded",  # a count or length over its limit
    "bad_value",  # integer out of range, empty free-text string, non-finite reward
    "bad_enum",  # mode / finish_reason not one of the allowed strings (the empty string included)
    "length_mismatch",  # len(tokens) != len(logprobs)
    "bad_logprob",  # a log-prob that is NaN, infinite or > 0
    "token_out_of_range",  # a token id >= vocab_size
    "not_canonical",  # valid content but not the canonical byte encoding
)


class PacketError(SwarmNodeError, ValueError):
    """The one error type of packet decoding/encoding: `code` is one of ERROR_CODES."""

    def __init__(self, code: str, message: str):
        assert code in ERROR_CODES, code
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class VocabError(SwarmNodeError, ValueError):
    """A vocabulary that has no tokenizer fingerprint (SPEC.md section 5)."""


@dataclass
class Completion:
    tokens: np.ndarray  # [T] uint32 token ids of the completion
    logprobs: np.ndarray  # [T] float32 generator log-probs of those tokens (<= 0, finite)
    finish_reason: str  # "stop" (EOS emitted) | "length" (hit max_new_tokens)
    reward: float  # sender's reward: advisory only, receivers recompute


@dataclass
class Group:
    task: str  # task name, e.g. "gsm8k"
    example_id: str  # dataset example id, e.g. "train/17": receivers look up the gold answer themselves
    prompt_tokens: np.ndarray  # [P] uint32, the exact prompt the completions were conditioned on
    completions: list[Completion] = field(default_factory=list)


@dataclass
class Packet:
    run_id: str  # swarm / training run id
    sender: str  # libp2p peer id (base58); receivers check it equals the transport peer
    model_id: str  # sender's model, e.g. "Qwen/Qwen2.5-0.5B-Instruct"
    tokenizer: str  # tokenizer_fingerprint() of the sender's tokenizer
    policy_version: int  # optimizer steps the sender has taken
    round: int  # swarm round the groups were generated in
    mode: str  # "vertical" | "horizontal"
    groups: list[Group] = field(default_factory=list)
    version: int = PROTOCOL_VERSION
    created_at: int = 0  # sender wall clock, unix milliseconds; advisory, 0 = unknown


# ----------------------------------------------------------------------------- digest, fingerprint

def digest(data: bytes) -> str:
    """Content address of bytes (a packet, a vocabulary's canonical JSON): "sha256:<64 lowercase hex>"."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the canonical JSON of the vocabulary (SPEC.md "Tokenizer fingerprint").

    `tokenizer`: anything with .get_vocab() (HF tokenizers, incl. added tokens) or a {token: id}
    dict. Only the vocabulary counts (models of one family share it). VocabError for a non-str
    token, a token with a lone surrogate, or an id outside 0..2^32-1.
    """
    vocab = tokenizer if isinstance(tokenizer, dict) else tokenizer.get_vocab()
    pairs = []
    for token, i in vocab.items():
        if not isinstance(token, str):
            raise VocabError(f"token {token!r} is not a string")
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) or not 0 <= i <= MAX_TOKEN_ID:
            raise VocabError(f"token {token!r} has id {i!r}: ids must be integers in 0..2^32-1")
        try:
            key = token.encode("utf-8")
        except UnicodeEncodeError:
            raise VocabError(f"token {token!r} is not valid Unicode (lone surrogate)") from None
        pairs.append((int(i), key, token))
    pairs.sort(key=lambda p: (p[0], p[1]))  # by id, ties by UTF-8 bytes
    text = json.dumps([[t, i] for i, _, t in pairs], ensure_ascii=False, separators=(",", ":"))
    return digest(text.encode("utf-8"))


# ----------------------------------------------------------------------------- encode

def _as_array(x, dtype: str, what: str) -> np.ndarray:
    """Coerce a 1-D array-like to little-endian uint32 ('<u4') / float32 ('<f4') without silent wrap-around."""
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):
        raise PacketError("bad_type", f"{what} is not a 1-D array") from None
    if a.ndim != 1 or (a.size and a.dtype.kind not in ("ui" if dtype == "<u4" else "uif")):
        raise PacketError("bad_type", f"{what} must be a 1-D {'integer' if dtype == '<u4' else 'float'} array")
    if dtype == "<u4" and a.size and a.dtype != np.uint32 and (a.min() < 0 or a.max() > MAX_TOKEN_ID):
        raise PacketError("bad_value", f"{what} has ids outside uint32")
    with np.errstate(all="ignore"):  # float64 -> float32 overflow becomes -inf and fails validation
        return np.ascontiguousarray(a, dtype=dtype)


def _norm_str(s, what: str) -> str:
    if not isinstance(s, str):
        raise PacketError("bad_type", f"{what} must be a str, got {type(s).__name__}")
    return s


def _norm_int(v, what: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise PacketError("bad_type", f"{what} must be an int, got {type(v).__name__}")
    return int(v)


def _norm_completion(c, w: str) -> Completion:
    if not isinstance(c, Completion):
        raise PacketError("bad_type", f"{w} must be a Completion")
    if isinstance(c.reward, (bool, np.bool_)) or not isinstance(c.reward, (int, float, np.integer, np.floating)):
        raise PacketError("bad_type", f"{w}.reward must be a float")
    try:
        reward = float(c.reward)
    except OverflowError:
        raise PacketError("bad_value", f"{w}.reward does not fit a float64") from None
    return Completion(_as_array(c.tokens, "<u4", w + ".tokens"), _as_array(c.logprobs, "<f4", w + ".logprobs"),
                      _norm_str(c.finish_reason, w + ".finish_reason"), reward)


def _normalize(p: Packet) -> Packet:
    """Type-check a Packet built in memory and coerce arrays/scalars to wire types (a shallow copy)."""
    if not isinstance(p, Packet):
        raise PacketError("bad_type", f"expected Packet, got {type(p).__name__}")
    if not isinstance(p.groups, (list, tuple)):
        raise PacketError("bad_type", "groups must be a list")
    groups = []
    for gi, g in enumerate(p.groups):
        w = f"groups[{gi}]"
        if not isinstance(g, Group) or not isinstance(g.completions, (list, tuple)):
            raise PacketError("bad_type", f"{w} must be a Group with a list of completions")
        comps = [_norm_completion(c, f"{w}.completions[{ci}]") for ci, c in enumerate(g.completions)]
        groups.append(Group(_norm_str(g.task, w + ".task"), _norm_str(g.example_id, w + ".example_id"),
                            _as_array(g.prompt_tokens, "<u4", w + ".prompt_tokens"), comps))
    s, i = _norm_str, _norm_int
    return Packet(s(p.run_id, "run_id"), s(p.sender, "sender"), s(p.model_id, "model_id"), s(p.tokenizer, "tokenizer"),
                  i(p.policy_version, "policy_version"), i(p.round, "round"), s(p.mode, "mode"), groups,
                  i(p.version, "version"), i(p.created_at, "created_at"))


_KEY = {k: msgpack.packb(k) for k in ("version", "run_id", "sender", "model_id", "tokenizer", "policy_version", "round",
                                      "mode", "created_at", "groups", "task", "example_id", "prompt_tokens",
                                      "completions", "tokens", "logprobs", "finish_reason", "reward")}


def _bin(a: np.ndarray, dtype: str) -> Iterator:
    """Smallest bin header, then the array's little-endian bytes (a view, not a copy)."""
    body = np.ascontiguousarray(a, dtype=dtype).view(np.uint8)  # [4 * len(a)]
    n = body.nbytes
    yield b"\xc4" + n.to_bytes(1, "big") if n < 256 else b"\xc5" + n.to_bytes(2, "big") if n < 65536 else b"\xc6" + n.to_bytes(4, "big")
    yield memoryview(body)


def _pieces(p: Packet) -> Iterator:
    """Canonical bytes of a valid packet in pieces (SPEC.md section 2); encode() joins them, decode() compares."""
    packer = msgpack.Packer(use_bin_type=True)
    pack, array_header = packer.pack, packer.pack_array_header
    yield b"\x8a"  # fixmap, 10 entries
    for key in ("version", "run_id", "sender", "model_id", "tokenizer", "policy_version", "round", "mode", "created_at"):
        yield _KEY[key]
        yield pack(getattr(p, key))
    yield _KEY["groups"] + array_header(len(p.groups))
    for g in p.groups:
        yield b"\x84" + _KEY["task"] + pack(g.task) + _KEY["example_id"] + pack(g.example_id) + _KEY["prompt_tokens"]
        yield from _bin(g.prompt_tokens, "<u4")
        yield _KEY["completions"] + array_header(len(g.completions))
        for c in g.completions:
            yield b"\x84" + _KEY["tokens"]
            yield from _bin(c.tokens, "<u4")
            yield _KEY["logprobs"]
            yield from _bin(c.logprobs, "<f4")
            yield _KEY["finish_reason"] + pack(c.finish_reason) + _KEY["reward"] + b"\xcb" + struct.pack(">d", c.reward)


def encode(packet: Packet) -> bytes:
    """Validate `packet` (same rules as decode, minus vocab) and return its canonical msgpack bytes."""
    p = _normalize(packet)
    validate(p)
    pieces = list(_pieces(p))
    size = sum(len(x) for x in pieces)
    if size > MAX_PACKET_BYTES:
        raise PacketError("too_large", f"encoded packet is {size} bytes > {MAX_PACKET_BYTES}")
    return b"".join(pieces)


# ----------------------------------------------------------------------------- validate

def _check_str(s: str, what: str, enum: tuple[str, ...] | None = None) -> None:
    try:
        n = len(s) if len(s) > MAX_STR_BYTES else len(s.encode("utf-8"))
    except UnicodeEncodeError:
        raise PacketError("bad_value", f"{what} is not valid Unicode (lone surrogate)") from None
    if n > MAX_STR_BYTES:
        raise PacketError("limit_exceeded", f"{what} is longer than {MAX_STR_BYTES} UTF-8 bytes")
    if enum is not None and s not in enum:
        raise PacketError("bad_enum", f"{what} {s!r} not in {enum}")
    if not s:
        raise PacketError("bad_value", f"{what} must not be empty")


def _check_uint(v: int, what: str) -> None:
    if not 0 <= v <= MAX_UINT:
        raise PacketError("bad_value", f"{what}={v} outside 0..2^53-1")


def _check_tokens(a: np.ndarray, limit: int, vocab_size: int | None, what: str) -> None:
    if len(a) > limit:
        raise PacketError("limit_exceeded", f"{what} has {len(a)} tokens > {limit}")
    if vocab_size is not None and len(a) and int(a.max()) >= vocab_size:
        raise PacketError("token_out_of_range", f"{what} has token id {int(a.max())} >= vocab_size {vocab_size}")


def _check_completion(c: Completion, vocab_size: int | None, w: str) -> None:
    _check_tokens(c.tokens, MAX_TOKENS, vocab_size, w + ".tokens")
    if len(c.logprobs) != len(c.tokens):
        raise PacketError("length_mismatch", f"{w}: {len(c.tokens)} tokens but {len(c.logprobs)} logprobs")
    if len(c.logprobs) and not np.all((c.logprobs <= 0) & (c.logprobs > -np.inf)):
        raise PacketError("bad_logprob", f"{w}.logprobs must be finite and <= 0")
    _check_str(c.finish_reason, w + ".finish_reason", FINISH_REASONS)
    if not math.isfinite(c.reward):
        raise PacketError("bad_value", f"{w}.reward must be finite")


def validate(p: Packet, vocab_size: int | None = None) -> None:
    """Semantic rules on a well-typed packet, field by field in wire order (SPEC.md section 6, step 4)."""
    if p.version != PROTOCOL_VERSION:
        raise PacketError("bad_version", f"version {p.version} is not {PROTOCOL_VERSION}")
    for name in ("run_id", "sender", "model_id", "tokenizer"):
        _check_str(getattr(p, name), name)
    _check_uint(p.policy_version, "policy_version")
    _check_uint(p.round, "round")
    _check_str(p.mode, "mode", MODES)
    _check_uint(p.created_at, "created_at")
    if len(p.groups) > MAX_GROUPS:
        raise PacketError("limit_exceeded", f"{len(p.groups)} groups > {MAX_GROUPS}")
    for gi, g in enumerate(p.groups):
        w = f"groups[{gi}]"
        _check_str(g.task, w + ".task")
        _check_str(g.example_id, w + ".example_id")
        _check_tokens(g.prompt_tokens, MAX_PROMPT_TOKENS, vocab_size, w + ".prompt_tokens")
        if len(g.completions) > MAX_COMPLETIONS:
            raise PacketError("limit_exceeded", f"{w} has {len(g.completions)} completions > {MAX_COMPLETIONS}")
        for ci, c in enumerate(g.completions):
            _check_completion(c, vocab_size, f"{w}.completions[{ci}]")


# ----------------------------------------------------------------------------- decode

_FAMILY = ["int"] * 0x80 + ["map"] * 16 + ["array"] * 16 + ["str"] * 32 + [
    "nil", "never-used", "bool", "bool", "bin", "bin", "bin", "ext", "ext", "ext", "float", "float",
    "int", "int", "int", "int", "int", "int", "int", "int", "ext", "ext", "ext", "ext", "ext",
    "str", "str", "str", "array", "array", "map", "map"] + ["int"] * 32  # indexed by the format byte
_LENGTH_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4, 0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4}
_FIX_MASK = {"str": 0x1F, "array": 0x0F, "map": 0x0F}
_INT_WIDTH = {0xCC: (1, False), 0xCD: (2, False), 0xCE: (4, False), 0xCF: (8, False),
              0xD0: (1, True), 0xD1: (2, True), 0xD2: (4, True), 0xD3: (8, True)}


class _Reader:
    """Pull reader: each value's header is checked (type, then length limit) before its payload (SPEC.md 6)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def format(self, what: str) -> int:
        if self.pos >= len(self.data):
            raise PacketError("bad_msgpack", f"truncated before {what}")
        fmt = self.data[self.pos]
        if fmt == 0xC1:
            raise PacketError("bad_msgpack", f"format byte 0xc1 (never used) at {what}")
        return fmt

    def take(self, n: int, what: str) -> int:
        """Step over `n` bytes and return where they start; bad_msgpack if the data ends first."""
        start = self.pos
        if start + n > len(self.data):
            raise PacketError("bad_msgpack", f"truncated {what}")
        self.pos = start + n
        return start

    def expect(self, kind: str, what: str) -> int:
        fmt = self.format(what)
        if _FAMILY[fmt] != kind:
            raise PacketError("bad_type", f"{what} must be a msgpack {kind}, got {_FAMILY[fmt]} (format byte 0x{fmt:02x})")
        return fmt

    def length(self, kind: str, what: str) -> int:
        """Step over the header of a str/bin/array/map value and return its declared length."""
        fmt = self.expect(kind, what)
        nlen = _LENGTH_BYTES.get(fmt, 0)
        start = self.take(1 + nlen, f"header of {what}")
        return fmt & _FIX_MASK[kind] if nlen == 0 else int.from_bytes(self.data[start + 1:start + 1 + nlen], "big")

    def int_value(self, fmt: int, what: str) -> int:
        if fmt < 0x80 or fmt >= 0xE0:
            self.pos += 1
            return fmt if fmt < 0x80 else fmt - 0x100
        n, signed = _INT_WIDTH[fmt]
        start = self.take(1 + n, what)
        return int.from_bytes(self.data[start + 1:start + 1 + n], "big", signed=signed)

    def uint(self, what: str) -> int:
        v = self.int_value(self.expect("int", what), what)
        _check_uint(v, what)
        return v

    def float(self, what: str) -> float:
        n = 4 if self.expect("float", what) == 0xCA else 8
        start = self.take(1 + n, what)
        return struct.unpack(">f" if n == 4 else ">d", self.data[start + 1:start + 1 + n])[0]

    def str(self, what: str) -> str:
        n = self.length("str", what)
        if n > MAX_STR_BYTES:
            raise PacketError("limit_exceeded", f"{what} is longer than {MAX_STR_BYTES} bytes")
        start = self.take(n, what)
        try:
            return self.data[start:start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise PacketError("bad_msgpack", f"{what} is not valid UTF-8") from None

    def key(self, what: str) -> str:
        """A map key: a str whose bytes either spell a table key or make it unknown (never bad UTF-8)."""
        if 0xA0 <= self.format(f"a key of {what}") <= 0xBF:  # fixstr (fast path: every table key)
            n = self.data[self.pos] & 0x1F
            start = self.take(1 + n, f"a key of {what}") + 1
        else:
            n = self.length("str", f"a key of {what}")
            start = self.take(n, f"a key of {what}")
        return self.data[start:start + min(n, 40)].decode("utf-8", "replace")  # table keys are <= 14 ASCII bytes

    def array_header(self, what: str, limit: int) -> int:
        n = self.length("array", what)
        if n > limit:
            raise PacketError("limit_exceeded", f"{what} has {n} entries > {limit}")
        return n

    def bin_array(self, dtype: str, what: str, limit: int) -> np.ndarray:
        n = self.length("bin", what)
        if n > 4 * limit:
            raise PacketError("limit_exceeded", f"{what} bin of {n} bytes > {4 * limit} ({limit} values)")
        if n % 4:
            raise PacketError("bad_type", f"{what} bin length {n} is not a multiple of 4")
        start = self.take(n, what)
        return np.frombuffer(self.data, dtype=dtype, count=n // 4, offset=start)

    def fields(self, what: str, schema: dict, n: int, seen: tuple[str, ...] = ()) -> dict:
        """The `n` entries of a map whose keys must be those of `schema` (key -> reader), each once."""
        out = dict.fromkeys(seen)
        for _ in range(n):
            key = self.key(what)
            if key not in schema:
                raise PacketError("unknown_field", f"{what} has unknown key {key!r}")
            if key in out:
                raise PacketError("duplicate_field", f"{what} has key {key!r} twice")
            out[key] = schema[key](key if what == "packet" else f"{what}.{key}")
        for key in schema:
            if key not in out:
                raise PacketError("missing_field", f"{what} lacks {key!r}")
        return out


def _read_completion(r: _Reader, what: str) -> Completion:
    f = r.fields(what, {"tokens": lambda w: r.bin_array("<u4", w, MAX_TOKENS),
                        "logprobs": lambda w: r.bin_array("<f4", w, MAX_TOKENS),
                        "finish_reason": r.str, "reward": r.float}, r.length("map", what))
    return Completion(f["tokens"], f["logprobs"], f["finish_reason"], f["reward"])


def _read_group(r: _Reader, what: str) -> Group:
    def completions(w):
        return [_read_completion(r, f"{w}[{i}]") for i in range(r.array_header(w, MAX_COMPLETIONS))]
    f = r.fields(what, {"task": r.str, "example_id": r.str, "prompt_tokens": lambda w: r.bin_array("<u4", w, MAX_PROMPT_TOKENS),
                        "completions": completions}, r.length("map", what))
    return Group(f["task"], f["example_id"], f["prompt_tokens"], f["completions"])


def _read_version(r: _Reader) -> int:
    """Version gate (SPEC.md section 7): the first entry must be "version": 1, else bad_version; the map size."""
    n = r.length("map", "packet")
    if n == 0:
        raise PacketError("bad_version", "the packet is an empty map; its first key must be 'version'")
    if _FAMILY[r.format("the first key")] != "str" or r.key("packet") != "version":
        raise PacketError("bad_version", "the first key of a packet must be the string 'version'")
    kind = _FAMILY[r.format("version")]
    if kind != "int":
        raise PacketError("bad_version", f"version must be the integer {PROTOCOL_VERSION}, got a msgpack {kind}")
    version = r.int_value(r.format("version"), "version")
    if version != PROTOCOL_VERSION:
        raise PacketError("bad_version", f"version {version} is not supported (this node speaks {PROTOCOL_VERSION})")
    return n


def _read_packet(r: _Reader) -> Packet:
    n = _read_version(r)

    def groups(w):
        return [_read_group(r, f"groups[{i}]") for i in range(r.array_header(w, MAX_GROUPS))]
    f = r.fields("packet", {"version": None, "run_id": r.str, "sender": r.str, "model_id": r.str, "tokenizer": r.str,
                            "policy_version": r.uint, "round": r.uint, "mode": r.str, "created_at": r.uint,
                            "groups": groups}, n - 1, seen=("version",))
    return Packet(f["run_id"], f["sender"], f["model_id"], f["tokenizer"], f["policy_version"], f["round"],
                  f["mode"], f["groups"], PROTOCOL_VERSION, f["created_at"])


def _is_canonical(p: Packet, data: bytes) -> bool:
    """Whether `data` is exactly the canonical encoding of `p`, without building that encoding."""
    view, pos = memoryview(data), 0
    for piece in _pieces(p):
        if view[pos:pos + len(piece)] != piece:
            return False
        pos += len(piece)
    return pos == len(data)


def decode(data: bytes, vocab_size: int | None = None) -> Packet:
    """Parse and fully validate a packet; PacketError (and nothing else) for any bad input.

    vocab_size: when given, every token id must be < vocab_size. Arrays are read-only views into `data`.
    """
    if vocab_size is not None:
        if isinstance(vocab_size, (bool, np.bool_)) or not isinstance(vocab_size, (int, np.integer)) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")  # caller bug, not hostile input
        vocab_size = int(vocab_size)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PacketError("bad_type", f"packet data must be bytes, got {type(data).__name__}")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if size > MAX_PACKET_BYTES:
        raise PacketError("too_large", f"packet is {size} bytes > {MAX_PACKET_BYTES}")
    data = bytes(data)  # no copy for bytes
    r = _Reader(data)
    packet = _read_packet(r)
    if r.pos != len(data):
        raise PacketError("trailing_bytes", f"{len(data) - r.pos} bytes after the packet")
    validate(packet, vocab_size)
    if not _is_canonical(packet, data):
        raise PacketError("not_canonical", "packet is valid but not canonically encoded (key order, smallest int/length forms, float64 reward)")
    return packet

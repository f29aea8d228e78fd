"""Rollout packet codec: the wire format peers use to share GRPO completions.

A packet is one msgpack map carrying the groups a node generated in one round.
Completions cost 8 bytes per token on the wire: token ids are one msgpack
`bin` of little-endian uint32 and generator log-probs one `bin` of
little-endian float32. Everything else is small header data. The normative
description is protocol/SPEC.md; this module is its reference implementation.

    data = encode(packet)              # canonical bytes (validates first)
    packet = decode(data, vocab_size)  # strict; raises only PacketError
    digest(data)                       # "sha256:<hex>" of the canonical bytes

Decoding is schema-driven: the reader peeks each msgpack header, checks the
type and the declared length against the limits, and only then lets
msgpack.Unpacker materialise the value, so hostile input never makes us
allocate more than the (already size-checked) packet, and never nests deeper
than the schema (5 containers). Decoded token/log-prob arrays are read-only
zero-copy numpy views (np.frombuffer) over the msgpack bin bytes; copy them
(`np.array(a)`) if you need to write.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

# Limits (SPEC.md "Limits"). Paper-size rounds are 2 prompts x 12 completions x
# ~200-1000 tokens (~0.2 MB); these leave 30x+ headroom on every axis while the
# byte cap bounds the product (64*64*8192*8 B would be 256 MiB).
MAX_PACKET_BYTES = 16 * 1024 * 1024  # whole encoded packet
MAX_GROUPS = 64  # groups per packet
MAX_COMPLETIONS = 64  # completions per group
MAX_TOKENS = 8192  # tokens per completion
MAX_PROMPT_TOKENS = 8192  # prompt tokens per group
MAX_STR_BYTES = 256  # UTF-8 bytes of every string field
MAX_UINT = 2**53 - 1  # integer fields: 0..2^53-1, exact in every language/JSON

MODES = ("vertical", "horizontal")
FINISH_REASONS = ("stop", "length")

# Every error code decode()/encode() can raise (SPEC.md "Errors").
ERROR_CODES = (
    "bad_type",  # wrong msgpack/Python type (bool is not int; ext types; bin not a multiple of 4)
    "too_large",  # packet longer than MAX_PACKET_BYTES
    "bad_msgpack",  # malformed or truncated msgpack, invalid UTF-8 in a str
    "trailing_bytes",  # bytes after the packet map
    "bad_version",  # first key is not "version", or version != PROTOCOL_VERSION
    "missing_field",  # a required key is absent
    "unknown_field",  # a key the spec does not define (v1 rejects them)
    "duplicate_field",  # a key appears twice in one map
    "limit_exceeded",  # a count or length over its limit
    "bad_value",  # integer out of range, empty string, non-finite reward
    "bad_enum",  # mode / finish_reason not one of the allowed strings
    "length_mismatch",  # len(tokens) != len(logprobs)
    "bad_logprob",  # a log-prob that is NaN, infinite or > 0
    "token_out_of_range",  # a token id >= vocab_size
    "not_canonical",  # valid content but not the canonical byte encoding
)


class PacketError(ValueError):
    """The one error type of this module: `code` is one of ERROR_CODES."""

    def __init__(self, code: str, message: str):
        assert code in ERROR_CODES, code
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


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


# ----------------------------------------------------------------------------- digests

def digest(data: bytes) -> str:
    """Content address of encoded bytes: "sha256:<64 lowercase hex>"."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def packet_digest(packet: Packet) -> str:
    return digest(encode(packet))


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the canonical JSON of the vocabulary (SPEC.md "Tokenizer fingerprint").

    `tokenizer` is anything with .get_vocab() (HF tokenizers, incl. added tokens)
    or a {token_string: id} dict. Only the vocabulary counts: chat template, eos
    and other settings differ across models of one family that can still share
    rollouts token-for-token.
    """
    vocab = tokenizer if isinstance(tokenizer, dict) else tokenizer.get_vocab()
    pairs = sorted(((int(i), str(t)) for t, i in vocab.items()), key=lambda p: (p[0], p[1].encode("utf-8", "surrogatepass")))
    text = json.dumps([[t, i] for i, t in pairs], ensure_ascii=False, separators=(",", ":"))
    return digest(text.encode("utf-8", "surrogatepass"))


# ----------------------------------------------------------------------------- encode

def _as_array(x, dtype: str, what: str) -> np.ndarray:
    """Coerce a 1-D array-like to little-endian uint32 ('<u4') / float32 ('<f4') without silent wrap-around."""
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):
        raise PacketError("bad_type", f"{what} is not a 1-D array") from None
    if a.ndim != 1 or (a.size and a.dtype.kind not in ("ui" if dtype == "<u4" else "uif")):
        raise PacketError("bad_type", f"{what} must be a 1-D {'integer' if dtype == '<u4' else 'float'} array")
    if dtype == "<u4" and a.size and a.dtype != np.uint32 and (a.min() < 0 or a.max() > 0xFFFFFFFF):
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


def _normalize(p: Packet) -> Packet:
    """Type-check a Packet built in memory and coerce arrays/scalars to wire types (a shallow copy)."""
    if not isinstance(p, Packet):
        raise PacketError("bad_type", f"expected Packet, got {type(p).__name__}")
    if not isinstance(p.groups, (list, tuple)):
        raise PacketError("bad_type", "groups must be a list")
    groups = []
    for gi, g in enumerate(p.groups):
        if not isinstance(g, Group) or not isinstance(g.completions, (list, tuple)):
            raise PacketError("bad_type", f"groups[{gi}] must be a Group with a list of completions")
        comps = []
        for ci, c in enumerate(g.completions):
            w = f"groups[{gi}].completions[{ci}]"
            if not isinstance(c, Completion):
                raise PacketError("bad_type", f"{w} must be a Completion")
            if isinstance(c.reward, (bool, np.bool_)) or not isinstance(c.reward, (int, float, np.integer, np.floating)):
                raise PacketError("bad_type", f"{w}.reward must be a float")
            try:
                reward = float(c.reward)
            except OverflowError:
                raise PacketError("bad_value", f"{w}.reward does not fit a float64") from None
            comps.append(Completion(_as_array(c.tokens, "<u4", w + ".tokens"), _as_array(c.logprobs, "<f4", w + ".logprobs"),
                                    _norm_str(c.finish_reason, w + ".finish_reason"), reward))
        groups.append(Group(_norm_str(g.task, f"groups[{gi}].task"), _norm_str(g.example_id, f"groups[{gi}].example_id"),
                            _as_array(g.prompt_tokens, "<u4", f"groups[{gi}].prompt_tokens"), comps))
    s, i = _norm_str, _norm_int
    return Packet(s(p.run_id, "run_id"), s(p.sender, "sender"), s(p.model_id, "model_id"), s(p.tokenizer, "tokenizer"),
                  i(p.policy_version, "policy_version"), i(p.round, "round"), s(p.mode, "mode"), groups,
                  i(p.version, "version"), i(p.created_at, "created_at"))


def _pack(p: Packet) -> bytes:
    """Canonical bytes of a normalized packet: keys in SPEC order, smallest int/str/bin/map/array forms, float64 reward."""
    return msgpack.packb({
        "version": p.version, "run_id": p.run_id, "sender": p.sender, "model_id": p.model_id,
        "tokenizer": p.tokenizer, "policy_version": p.policy_version, "round": p.round, "mode": p.mode,
        "created_at": p.created_at,
        "groups": [{
            "task": g.task, "example_id": g.example_id, "prompt_tokens": g.prompt_tokens.astype("<u4", copy=False).tobytes(),
            "completions": [{
                "tokens": c.tokens.astype("<u4", copy=False).tobytes(), "logprobs": c.logprobs.astype("<f4", copy=False).tobytes(),
                "finish_reason": c.finish_reason, "reward": float(c.reward),
            } for c in g.completions],
        } for g in p.groups],
    }, use_bin_type=True)


def encode(packet: Packet) -> bytes:
    """Validate `packet` (same rules as decode, minus vocab) and return its canonical msgpack bytes."""
    p = _normalize(packet)
    validate(p)
    data = _pack(p)
    if len(data) > MAX_PACKET_BYTES:
        raise PacketError("too_large", f"encoded packet is {len(data)} bytes > {MAX_PACKET_BYTES}")
    return data


# ----------------------------------------------------------------------------- validate

def _check_str(s: str, what: str) -> None:
    try:
        n = len(s) if len(s) > MAX_STR_BYTES else len(s.encode("utf-8"))
    except UnicodeEncodeError:
        raise PacketError("bad_value", f"{what} is not valid Unicode (lone surrogate)") from None
    if n > MAX_STR_BYTES:
        raise PacketError("limit_exceeded", f"{what} is longer than {MAX_STR_BYTES} UTF-8 bytes")
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


def validate(p: Packet, vocab_size: int | None = None) -> None:
    """Semantic rules on a well-typed packet (limits, ranges, enums, log-probs, vocab); raises PacketError."""
    if p.version != PROTOCOL_VERSION:
        raise PacketError("bad_version", f"version {p.version} is not {PROTOCOL_VERSION}")
    for name in ("run_id", "sender", "model_id", "tokenizer"):
        _check_str(getattr(p, name), name)
    for name in ("policy_version", "round", "created_at"):
        _check_uint(getattr(p, name), name)
    if p.mode not in MODES:
        raise PacketError("bad_enum", f"mode {p.mode!r} not in {MODES}")
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
            wc = f"{w}.completions[{ci}]"
            _check_tokens(c.tokens, MAX_TOKENS, vocab_size, wc + ".tokens")
            if len(c.logprobs) != len(c.tokens):
                raise PacketError("length_mismatch", f"{wc}: {len(c.tokens)} tokens but {len(c.logprobs)} logprobs")
            if len(c.logprobs) and not np.all((c.logprobs <= 0) & (c.logprobs > -np.inf)):
                raise PacketError("bad_logprob", f"{wc}.logprobs must be finite and <= 0")
            if c.finish_reason not in FINISH_REASONS:
                raise PacketError("bad_enum", f"{wc}.finish_reason {c.finish_reason!r} not in {FINISH_REASONS}")
            if not math.isfinite(c.reward):
                raise PacketError("bad_value", f"{wc}.reward must be finite")


# ----------------------------------------------------------------------------- decode

_INT_FMT = set(range(0x00, 0x80)) | set(range(0xE0, 0x100)) | set(range(0xCC, 0xD4))
_FLOAT_FMT = {0xCA, 0xCB}
# format byte -> (kind, header size, bytes of the big-endian length field; 0 = length in the low bits)
_SIZED_FMT = {0xD9: ("str", 2, 1), 0xDA: ("str", 3, 2), 0xDB: ("str", 5, 4),
              0xC4: ("bin", 2, 1), 0xC5: ("bin", 3, 2), 0xC6: ("bin", 5, 4),
              0xDC: ("array", 3, 2), 0xDD: ("array", 5, 4), 0xDE: ("map", 3, 2), 0xDF: ("map", 5, 4)}
for _b in range(0xA0, 0xC0):
    _SIZED_FMT[_b] = ("str", 1, 0)
for _b in range(0x90, 0xA0):
    _SIZED_FMT[_b] = ("array", 1, 0)
for _b in range(0x80, 0x90):
    _SIZED_FMT[_b] = ("map", 1, 0)
_FIX_MASK = {"str": 0x1F, "array": 0x0F, "map": 0x0F}
_TYPE_NAMES = {"str": "str", "bin": "bin", "array": "array", "map": "map", "int": "integer", "float": "float"}


class _Reader:
    """Schema-driven pull reader: peek a header, check type and length, then unpack exactly that value."""

    def __init__(self, data: bytes):
        self.data = data
        self.up = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1), max_str_len=MAX_STR_BYTES,
                                   max_bin_len=4 * max(MAX_TOKENS, MAX_PROMPT_TOKENS), max_array_len=max(MAX_GROUPS, MAX_COMPLETIONS),
                                   max_map_len=16, max_ext_len=0)
        self.up.feed(data)

    def _peek(self, kind: str, what: str) -> int:
        """Check the next value is of `kind`; for sized kinds return the declared length, else the format byte."""
        pos = self.up.tell()
        if pos >= len(self.data):
            raise PacketError("bad_msgpack", f"truncated before {what}")
        fmt = self.data[pos]
        if fmt == 0xC1:
            raise PacketError("bad_msgpack", f"format byte 0xc1 (never used) at {what}")
        if kind == "int" and fmt in _INT_FMT or kind == "float" and fmt in _FLOAT_FMT:
            return fmt
        got = _SIZED_FMT.get(fmt)
        if got is None or got[0] != kind:
            raise PacketError("bad_type", f"{what} must be a msgpack {_TYPE_NAMES[kind]} (format byte 0x{fmt:02x})")
        _, hdr, nlen = got
        if nlen == 0:
            return fmt & _FIX_MASK[kind]
        if pos + hdr > len(self.data):
            raise PacketError("bad_msgpack", f"truncated header of {what}")
        return int.from_bytes(self.data[pos + 1:pos + hdr], "big")

    def array_header(self, what: str, limit: int) -> int:
        if self._peek("array", what) > limit:
            raise PacketError("limit_exceeded", f"{what} has more than {limit} entries")
        return self.up.read_array_header()

    def map_header(self, what: str) -> int:
        self._peek("map", what)  # no limit needed: fields() fails by the (len(schema)+1)-th key
        return self.up.read_map_header()

    def str(self, what: str, limit: int = MAX_STR_BYTES) -> str:
        if self._peek("str", what) > limit:
            raise PacketError("limit_exceeded", f"{what} is longer than {limit} bytes")
        return self.up.unpack()

    def uint(self, what: str) -> int:
        self._peek("int", what)
        v = self.up.unpack()
        _check_uint(v, what)
        return v

    def float(self, what: str) -> float:
        self._peek("float", what)
        return self.up.unpack()

    def array(self, dtype: str, what: str, limit: int) -> np.ndarray:
        n = self._peek("bin", what)
        if n % 4:
            raise PacketError("bad_type", f"{what} bin length {n} is not a multiple of 4")
        if n // 4 > limit:
            raise PacketError("limit_exceeded", f"{what} has {n // 4} elements > {limit}")
        return np.frombuffer(self.up.unpack(), dtype=dtype)

    def fields(self, what: str, schema: dict, n: int | None = None) -> dict:
        """Read a map (or its remaining `n` entries) whose keys must be exactly those of `schema` (key -> reader)."""
        if n is None:
            n = self.map_header(what)
        out = {}
        for _ in range(n):
            key = self.str(f"a key of {what}", 32) if self._peek("str", f"a key of {what}") <= 32 else None
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
    f = r.fields(what, {"tokens": lambda w: r.array("<u4", w, MAX_TOKENS), "logprobs": lambda w: r.array("<f4", w, MAX_TOKENS),
                        "finish_reason": r.str, "reward": r.float})
    return Completion(f["tokens"], f["logprobs"], f["finish_reason"], f["reward"])


def _read_group(r: _Reader, what: str) -> Group:
    def completions(w):
        return [_read_completion(r, f"{w}[{i}]") for i in range(r.array_header(w, MAX_COMPLETIONS))]
    f = r.fields(what, {"task": r.str, "example_id": r.str,
                        "prompt_tokens": lambda w: r.array("<u4", w, MAX_PROMPT_TOKENS), "completions": completions})
    return Group(f["task"], f["example_id"], f["prompt_tokens"], f["completions"])


def _read_packet(r: _Reader) -> Packet:
    n = r.map_header("packet")
    if n == 0 or r._peek("str", "the first key") > 32 or r.str("the first key", 32) != "version":
        raise PacketError("bad_version", "the first key of a packet must be 'version'")
    r._peek("int", "version")
    version = r.up.unpack()
    if version != PROTOCOL_VERSION:
        raise PacketError("bad_version", f"version {version} is not supported (this node speaks {PROTOCOL_VERSION})")

    def groups(w):
        return [_read_group(r, f"groups[{i}]") for i in range(r.array_header(w, MAX_GROUPS))]
    f = r.fields("packet", {"run_id": r.str, "sender": r.str, "model_id": r.str, "tokenizer": r.str,
                            "policy_version": r.uint, "round": r.uint, "mode": r.str, "created_at": r.uint,
                            "groups": groups}, n - 1)
    return Packet(f["run_id"], f["sender"], f["model_id"], f["tokenizer"], f["policy_version"], f["round"],
                  f["mode"], f["groups"], version, f["created_at"])


def decode(data: bytes, vocab_size: int | None = None) -> Packet:
    """Parse and fully validate a packet. Raises PacketError (and nothing else) for any bad input.

    vocab_size: when given, every completion and prompt token id must be < vocab_size.
    Arrays in the result are read-only views over the packet's bin bytes.
    """
    if vocab_size is not None:
        if isinstance(vocab_size, (bool, np.bool_)) or not isinstance(vocab_size, (int, np.integer)) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")  # caller bug, not hostile input
        vocab_size = int(vocab_size)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PacketError("bad_type", f"packet data must be bytes, got {type(data).__name__}")
    if len(data) > MAX_PACKET_BYTES or (isinstance(data, memoryview) and data.nbytes > MAX_PACKET_BYTES):
        raise PacketError("too_large", f"packet is {len(data)} bytes > {MAX_PACKET_BYTES}")
    data = bytes(data)
    r = _Reader(data)
    try:
        packet = _read_packet(r)
    except msgpack.OutOfData:
        raise PacketError("bad_msgpack", "truncated msgpack") from None
    except (ValueError, UnicodeDecodeError, msgpack.UnpackException, OverflowError) as e:
        if isinstance(e, PacketError):
            raise
        raise PacketError("bad_msgpack", f"malformed msgpack: {e}") from None
    if r.up.tell() != len(data):
        raise PacketError("trailing_bytes", f"{len(data) - r.up.tell()} bytes after the packet")
    validate(packet, vocab_size)
    if _pack(packet) != data:
        raise PacketError("not_canonical", "packet is valid but not canonically encoded (key order, smallest int/length forms, float64 reward)")
    return packet


# JSON form (SPEC.md "JSON form") lives in its own module; re-exported here for convenience.
def packet_to_json(packet: Packet) -> dict:
    from swarm_node.packet_json import packet_to_json as f
    return f(packet)


def packet_from_json(obj) -> Packet:
    from swarm_node.packet_json import packet_from_json as f
    return f(obj)

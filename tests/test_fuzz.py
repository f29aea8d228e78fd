"""Fuzzing every parser a peer's bytes reach: the packet decoder, DHT record checks, fetch frames.

Only the documented error may escape: `PacketError` (with a code from `ERROR_CODES`) from the
decoder, a reason string (never an exception) from the record validator, `FrameError` from the
frame parser; the fetch server never raises and the fetch client fails with a reason or an error
its caller turns into one. Memory stays bounded: no allocation sized by a declared length before
the limit check (tracemalloc on the hand-made corpus and on a generated huge-length family).

Hypothesis runs derandomized (fixed examples, stable in CI, no example database); the `@fuzz(n)`
counts add up to 11,600 generated inputs (decoder 7,100, records 2,500, frames and fetch streams
2,000), plus the hand-made corpus, every truncation and single-byte edit of a packet, and
tests/test_codec.py's ~750. The four largest are marked slow (~30 s together).
"""

from __future__ import annotations

import asyncio
import functools
import math
import socket
import time
import tracemalloc

import msgpack
import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm_node.net.fetch import Download, PacketServer
from swarm_node.net.identity import check_record_value, load_or_create_identity, owner_key_of, peer_id_of
from swarm_node.net.records import (MAX_FRAME_BYTES, FrameError, RecordError, decode_frame_body, encode_frame,
                                    frame_length, make_record, parse_record)
from swarm_node.wire.codec import (ERROR_CODES, MAX_PACKET_BYTES, MAX_TOKENS, Completion, Group, Packet, PacketError,
                                   decode)
from swarm_node.wire.codec import digest as packet_digest
from swarm_node.wire.codec import encode, validate

VOCAB = 1000
FP = "sha256:" + "ab" * 32
PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def _packet(n_groups=2, n_comp=3, n_tok=5) -> Packet:
    rng = np.random.default_rng(0)
    groups = [Group("arith", f"train/{g}", rng.integers(0, VOCAB, 7).astype(np.uint32),
                    [Completion(rng.integers(0, VOCAB, n_tok).astype(np.uint32), -rng.random(n_tok).astype(np.float32),
                                "stop", 1.0) for _ in range(n_comp)]) for g in range(n_groups)]
    return Packet("run", PEER, "tiny-s", FP, 3, 7, "vertical", groups, created_at=1)


GOOD = encode(_packet())
WIRE = msgpack.unpackb(GOOD, raw=False)


def only_packet_errors(data) -> None:
    """decode() returns a packet that obeys every documented rule, or raises PacketError; nothing else."""
    try:
        p = decode(data, vocab_size=VOCAB)
    except PacketError as e:
        assert e.code in ERROR_CODES
        return
    validate(p, VOCAB)  # a decoded packet is within every limit, finite, <= 0 log-probs, ids < vocab
    assert encode(p) == bytes(data)  # and canonical: one packet, one byte string, one digest


# ----------------------------------------------------------------------------- decoder: generated

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.binary(max_size=64), st.sampled_from(["vertical", "stop", "length", "version", "groups"]))
msgpack_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
    st.text(max_size=12) | st.sampled_from(list(WIRE) + ["tokens", "logprobs", "reward", "completions"]), inner,
    max_size=4), max_leaves=8)

# A path into the wire dict, e.g. ("groups", 0, "completions", 1, "logprobs").
PATHS = [(k,) for k in WIRE] + [("groups", g, k) for g in (0, 1) for k in WIRE["groups"][0]] + [
    ("groups", g, "completions", c, k) for g in (0, 1) for c in (0, 2) for k in WIRE["groups"][0]["completions"][0]]


def _hostile_array(kind: str, n: int) -> bytes:
    if kind == "nan":
        return np.full(n, np.nan, "<f4").tobytes()
    if kind == "inf":
        return np.full(n, -np.inf, "<f4").tobytes()
    if kind == "positive":
        return np.full(n, 1e-3, "<f4").tobytes()
    if kind == "vocab":
        return np.full(n, VOCAB, "<u4").tobytes()
    if kind == "huge_id":
        return np.full(n, 2**32 - 1, "<u4").tobytes()
    return b"\x00" * (4 * n + (1 if kind == "misaligned" else 0))


@st.composite
def mutated_packets(draw) -> bytes:
    """A valid packet's wire dict with 1-4 hostile edits, packed (possibly non-canonically)."""
    import copy

    d = copy.deepcopy(WIRE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        parent = d
        try:
            for key in path[:-1]:
                parent = parent[key]
        except (KeyError, IndexError, TypeError):
            continue
        if not isinstance(parent, dict):
            continue
        how = draw(st.sampled_from(["value", "delete", "array", "dup_list", "rename"]))
        key = path[-1]
        if how == "value":
            parent[key] = draw(msgpack_values)
        elif how == "delete":
            parent.pop(key, None)
        elif how == "array":
            n = draw(st.sampled_from([0, 1, 5, 6, MAX_TOKENS, MAX_TOKENS + 1]))
            parent[key] = _hostile_array(draw(st.sampled_from(["nan", "inf", "positive", "vocab", "huge_id", "zero",
                                                               "misaligned"])), n)
        elif how == "dup_list" and isinstance(parent.get(key), list):
            parent[key] = parent[key] * draw(st.sampled_from([2, 30, 65]))
        elif how == "rename":
            parent[draw(st.text(max_size=8))] = parent.pop(key, None)
    data = msgpack.packb(d, use_bin_type=True)
    cut = draw(st.sampled_from([None, None, None, "truncate", "append"]))
    if cut == "truncate" and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif cut == "append":
        data += draw(st.binary(min_size=1, max_size=8))
    return data


@pytest.mark.slow
@fuzz(2500)
@given(mutated_packets())
def test_fuzz_decoder_structured_mutations(data):
    only_packet_errors(data)


FLOAT_LIES = st.sampled_from([np.nan, np.inf, -np.inf, 1e-3, 0.0, -0.0, -1e-45, -3.4e38, 1.0]) | st.floats(width=32)
INT_LIES = st.sampled_from([-1, 2**53 - 1, 2**53, 2**63, 2**64 - 1, True, False, 1.5, "7", None])


@st.composite
def semantic_lies(draw) -> bytes:
    """Exactly one lie in an otherwise valid packet: the kinds a peer would tell (log-probs, ids, lengths, rewards,
    counters, enums, strings), so every semantic rule is exercised, not just the msgpack layer."""
    g, c = draw(st.integers(0, 1)), draw(st.sampled_from([0, 2]))
    comp = f"groups.{g}.completions.{c}"
    what = draw(st.sampled_from(["logprobs", "tokens", "prompt", "lengths", "reward", "int", "enum", "string"]))
    if what == "logprobs":
        values = np.full(5, -0.5, "<f4")
        values[draw(st.integers(0, 4))] = draw(FLOAT_LIES)
        return _wire(**{f"{comp}.logprobs": values.tobytes()})
    if what in ("tokens", "prompt"):
        n = 5 if what == "tokens" else 7
        ids = np.full(n, 3, "<u4")
        ids[draw(st.integers(0, n - 1))] = draw(st.integers(VOCAB - 2, 2**32 - 1))
        return _wire(**{f"{comp}.tokens" if what == "tokens" else f"groups.{g}.prompt_tokens": ids.tobytes()})
    if what == "lengths":
        return _wire(**{f"{comp}.logprobs": np.zeros(draw(st.sampled_from([0, 4, 6, 50])), "<f4").tobytes()})
    if what == "reward":
        return _wire(**{f"{comp}.reward": draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e308, 1, True, "1"]))})
    if what == "int":
        return _wire(**{draw(st.sampled_from(["round", "policy_version", "created_at", "version"])): draw(INT_LIES)})
    if what == "enum":
        key = draw(st.sampled_from(["mode", f"{comp}.finish_reason"]))
        return _wire(**{key: draw(st.sampled_from(["Vertical", "", "eos", "stop ", "horizontal\x00"]))})
    key = draw(st.sampled_from(["run_id", "sender", "model_id", "tokenizer", f"groups.{g}.task", f"groups.{g}.example_id"]))
    return _wire(**{key: draw(st.sampled_from(["", "x" * 257, "é" * 129, "ok"]))})


@fuzz(1500)
@given(semantic_lies())
def test_fuzz_decoder_semantic_lies(data):
    only_packet_errors(data)


@pytest.mark.slow
@fuzz(1500)
@given(msgpack_values)
def test_fuzz_decoder_arbitrary_msgpack(obj):
    data = msgpack.packb(obj, use_bin_type=True)
    only_packet_errors(data)
    only_packet_errors(msgpack.packb({"version": 1, **obj} if isinstance(obj, dict) else [1, obj], use_bin_type=True))


@fuzz(1000)
@given(st.binary(max_size=512), st.integers(0, len(GOOD)))
def test_fuzz_decoder_spliced_bytes(noise, at):
    only_packet_errors(GOOD[:at] + noise + GOOD[at + len(noise):])
    only_packet_errors(GOOD[:at] + noise)


# header byte of every container/str/bin in GOOD, for the huge-declared-length family
def _headers(data: bytes) -> list[int]:
    out, up = [], msgpack.Unpacker(raw=True)
    up.feed(data)

    def walk():
        pos = up.tell()
        b = data[pos]
        if 0x80 <= b <= 0x9F or b in (0xDC, 0xDD, 0xDE, 0xDF):
            out.append(pos)
            if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
                for _ in range(up.read_map_header()):
                    walk()
                    walk()
            else:
                for _ in range(up.read_array_header()):
                    walk()
            return
        if 0xA0 <= b <= 0xBF or b in (0xC4, 0xC5, 0xC6, 0xD9, 0xDA, 0xDB):
            out.append(pos)
        up.skip()

    walk()
    return out


HEADERS = _headers(GOOD)
KIND_32 = {"map": b"\xdf", "array": b"\xdd", "str": b"\xdb", "bin": b"\xc6"}


def _kind(b: int) -> str:
    if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
        return "map"
    if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
        return "array"
    if 0xA0 <= b <= 0xBF or b in (0xD9, 0xDA, 0xDB):
        return "str"
    return "bin"


def _huge_at(pos: int, n: int) -> bytes:
    """GOOD with the container/str/bin header at `pos` replaced by a 32-bit header declaring `n` items/bytes."""
    b = GOOD[pos]
    size = {0xDC: 3, 0xDE: 3, 0xDA: 3, 0xC5: 3, 0xDD: 5, 0xDF: 5, 0xDB: 5, 0xC6: 5, 0xD9: 2, 0xC4: 2}.get(b, 1)
    return GOOD[:pos] + KIND_32[_kind(b)] + n.to_bytes(4, "big") + GOOD[pos + size:]


def _bounded(data: bytes) -> None:
    tracemalloc.start()
    try:
        only_packet_errors(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(data) + (1 << 20), peak  # nothing sized by a declared length


@fuzz(600)
@given(st.sampled_from(HEADERS), st.integers(2**16, 2**32 - 1))
def test_fuzz_huge_declared_lengths_allocate_nothing(pos, n):
    _bounded(_huge_at(pos, n))


# ----------------------------------------------------------------------------- decoder: hand-made corpus

def _wire(**changes) -> bytes:
    import copy

    d = copy.deepcopy(WIRE)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = d
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[leaf] = value
    return msgpack.packb(d, use_bin_type=True)


CORPUS = {
    "empty": b"",
    "truncated_header": GOOD[:3],
    "truncated_half": GOOD[: len(GOOD) // 2],
    "truncated_last_byte": GOOD[:-1],
    "trailing_garbage": GOOD + b"\xc0",
    "oversize_packet": b"\x00" * (MAX_PACKET_BYTES + 1),
    "oversize_valid_prefix": GOOD + b"\x00" * (MAX_PACKET_BYTES - len(GOOD) + 1),
    "depth_bomb_arrays": b"\x91" * 200_000,
    "depth_bomb_maps": b"\x81\xa1k" * 100_000,
    "depth_bomb_in_groups": GOOD[:GOOD.index(b"\xa6groups") + 7] + b"\x91" * 100_000,
    "depth_bomb_in_completion": _wire(**{"groups.0.completions": [[[[[[[[]]]]]]]]}),
    "array32_groups": b"\x8a\xa7version\x01\xa6groups\xdd\xff\xff\xff\xff",
    "map32_top": b"\xdf\xff\xff\xff\xff\xa7version\x01",
    "str32_run_id": b"\x8a\xa7version\x01\xa6run_id\xdb\xff\xff\xff\xff",
    "bin32_tokens": b"\x8a\xa7version\x01\xa6groups\x91\x84\xadprompt_tokens\xc6\xff\xff\xff\xfc",
    "ext_type": _wire(run_id=msgpack.ExtType(5, b"x" * 10)),
    "timestamp_ext": msgpack.packb({"version": 1, "run_id": msgpack.Timestamp(0)}, use_bin_type=True),
    "bool_round": _wire(round=True),
    "float_round": _wire(round=7.0),
    "negative_round": _wire(round=-1),
    "uint64_round": _wire(round=2**64 - 1),
    "str_tokens": _wire(**{"groups.0.completions.0.tokens": "abcd"}),
    "list_tokens": _wire(**{"groups.0.completions.0.tokens": [1, 2, 3, 4, 5]}),
    "nan_logprob": _wire(**{"groups.0.completions.0.logprobs": _hostile_array("nan", 5)}),
    "neg_inf_logprob": _wire(**{"groups.0.completions.0.logprobs": _hostile_array("inf", 5)}),
    "positive_logprob": _wire(**{"groups.0.completions.0.logprobs": _hostile_array("positive", 5)}),
    "nan_reward": _wire(**{"groups.0.completions.0.reward": float("nan")}),
    "inf_reward": _wire(**{"groups.0.completions.0.reward": float("inf")}),
    "token_at_vocab": _wire(**{"groups.0.completions.0.tokens": _hostile_array("vocab", 5)}),
    "token_uint32_max": _wire(**{"groups.1.prompt_tokens": _hostile_array("huge_id", 7)}),
    "length_mismatch": _wire(**{"groups.0.completions.0.logprobs": _hostile_array("zero", 4)}),
    "misaligned_bin": _wire(**{"groups.0.completions.0.tokens": _hostile_array("misaligned", 5)}),
    "too_many_tokens": _wire(**{"groups.0.completions.0.tokens": _hostile_array("zero", MAX_TOKENS + 1),
                                "groups.0.completions.0.logprobs": _hostile_array("zero", MAX_TOKENS + 1)}),
    "too_many_groups": _wire(groups=WIRE["groups"] * 33),
    "too_many_completions": _wire(**{"groups.0.completions": WIRE["groups"][0]["completions"] * 22}),
    "long_string": _wire(model_id="x" * 10_000),
    "bad_utf8": GOOD.replace(b"\xa5arith", b"\xa5\xff\xfe\xfd\xfc\xfb", 1),
    "duplicate_key": GOOD.replace(b"\xa6reward", b"\xa6tokens", 1),
    "unknown_key": _wire(extra=1),
    "missing_groups": msgpack.packb({k: v for k, v in WIRE.items() if k != "groups"}, use_bin_type=True),
    "version_2": _wire(version=2),
    "not_a_map": msgpack.packb([1, 2, 3]),
    "reserved_c1": b"\xc1",
    "non_canonical_int": GOOD.replace(b"\xa5round\x07", b"\xa5round\xcc\x07", 1),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hand_made_hostile_packets(name):
    data = CORPUS[name]
    with pytest.raises(PacketError) as e:
        decode(data, vocab_size=VOCAB)
    assert e.value.code in ERROR_CODES
    if len(data) < (1 << 20):
        _bounded(data)


def test_every_truncation_and_single_byte_of_a_packet():
    """Every prefix, and every byte replaced by each interesting format byte: only PacketError."""
    data = encode(_packet(1, 2, 3))
    for n in range(len(data)):
        only_packet_errors(data[:n])
    for pos in range(len(data)):
        for val in (0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xC0, 0xC1, 0xC2, 0xC4, 0xC6, 0xCA, 0xCB, 0xCF, 0xD3, 0xD9,
                    0xDB, 0xDC, 0xDD, 0xDF, 0xE0, 0xFF):
            only_packet_errors(data[:pos] + bytes([val]) + data[pos + 1:])


# ----------------------------------------------------------------------------- DHT records

OWNER_KEY, _ = load_or_create_identity(None)
OWNER_SSH = OWNER_KEY.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
OWNER_PID = peer_id_of(OWNER_KEY.public_key())
RECORD = make_record(OWNER_PID, "tiny-s", FP, 1, 3, 2, [(3, packet_digest(b"x"), 10)], 1000.0)
RECORD_KEYS = list(RECORD)


@st.composite
def mutated_records(draw) -> dict:
    rec = dict(RECORD)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(RECORD_KEYS + ["extra"]))
        if draw(st.booleans()):
            rec[key] = draw(msgpack_values)
        else:
            rec.pop(key, None)
    if draw(st.booleans()):
        rec["offers"] = draw(st.lists(st.lists(scalars, max_size=4) | scalars, max_size=20))
    return rec


expirations = st.floats(allow_nan=True, allow_infinity=True) | st.just(time.time() + 60)


@pytest.mark.slow
@fuzz(1500)
@given(mutated_records(), expirations)
def test_fuzz_record_schema(rec, expiration):
    try:
        parse_record(rec)
    except RecordError:
        pass
    value = msgpack.packb(rec, use_bin_type=True)
    reason = check_record_value(OWNER_SSH, value, expiration)
    assert reason is None or isinstance(reason, str)
    if reason is None:  # accepted: well-formed, bound to the owner, finite and not too far in the future
        assert parse_record(rec).peer_id == OWNER_PID and math.isfinite(expiration)


@fuzz(1000)
@given(st.binary(max_size=600), st.binary(max_size=120), expirations)
def test_fuzz_record_bytes_and_validator(value, subkey, expiration):
    """Raw bytes in every field of a DHT record: the validator answers with a reason, never an exception."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    from swarm_node.net.records import record_key

    assert isinstance(check_record_value(OWNER_SSH, value, expiration), str)
    owner_key_of(subkey)
    key_id = DHTID.generate(source=record_key("run")).to_bytes()
    for sub in (subkey, msgpack.packb(b"[owner:" + OWNER_SSH + b"]"), msgpack.packb(b"[owner:ssh-rsa AAAA" + subkey.hex().encode() + b"]")):
        for val in (value, value + b"[signature:" + subkey + b"]", msgpack.packb(RECORD) + b"[signature:AAAA]"):
            reason = _validator().check(DHTRecord(key_id, sub, val, expiration))
            assert isinstance(reason, str)  # nothing here is validly signed


@functools.cache
def _validator():
    from swarm_node.net.discovery import RecordValidator
    from swarm_node.net.hivemind import wrap_rsa_key

    return RecordValidator(wrap_rsa_key(load_or_create_identity(None)[0]), "run")


def test_non_finite_record_expiration_is_rejected():
    value = msgpack.packb(RECORD, use_bin_type=True)
    assert check_record_value(OWNER_SSH, value, time.time() + 60) is None
    for bad in (float("nan"), float("inf")):
        assert "expiration" in check_record_value(OWNER_SSH, value, bad)


# ----------------------------------------------------------------------------- fetch frames

@pytest.mark.slow
@fuzz(1200)
@given(st.binary(min_size=4, max_size=4), msgpack_values, st.binary(max_size=MAX_FRAME_BYTES))
def test_fuzz_frame_parser(prefix, obj, raw):
    try:
        n = frame_length(prefix)
        assert 1 <= n <= MAX_FRAME_BYTES
    except FrameError:
        pass
    for body in (raw, msgpack.packb(obj, use_bin_type=True)[:MAX_FRAME_BYTES]):
        try:
            assert isinstance(decode_frame_body(body), dict)
        except FrameError:
            pass
    try:
        encode_frame(obj if isinstance(obj, dict) else {"x": obj})
    except (FrameError, TypeError, ValueError, OverflowError):
        pass  # our own encoder refusing our own bad input is fine


async def _socketpair():
    a, b = socket.socketpair()
    return await asyncio.open_connection(sock=a), await asyncio.open_connection(sock=b)


@fuzz(400)
@given(st.lists(st.binary(max_size=40) | st.builds(lambda o: encode_frame({"x": 1}) if o is None else
                                                    len(msgpack.packb(o)).to_bytes(4, "big") + msgpack.packb(o),
                                                    st.none() | st.dictionaries(st.sampled_from(["run_id", "digest"]),
                                                                                msgpack_values, max_size=2)),
                max_size=4))
def test_fuzz_fetch_server(chunks):
    """Hostile request streams: the server answers or closes; it never raises and never serves by accident."""
    digest = packet_digest(b"secret")

    async def main():
        stats: dict = {}
        server = PacketServer("run", {digest: b"secret"}.get, stats)
        (sr, sw), (cr, cw) = await _socketpair()
        task = asyncio.ensure_future(server.handle(sr, sw))
        for chunk in chunks:
            cw.write(chunk)
        cw.write_eof()
        reply = await asyncio.wait_for(cr.read(), 5)
        await asyncio.wait_for(task, 5)  # handle() returned: it never raises
        cw.close()
        assert b"secret" not in reply or (len(chunks) and any(digest.encode() in c for c in chunks))

    # the server waits REQUEST_TIMEOUT_S for a request; EOF makes incomplete ones fail at once
    asyncio.run(main())


@fuzz(400)
@given(st.lists(st.binary(max_size=64) | st.builds(
    lambda o: len(msgpack.packb(o)).to_bytes(4, "big") + msgpack.packb(o),
    st.dictionaries(st.sampled_from(["status", "size", "offset"]), st.sampled_from(["ok", "busy", "not_found", 5, 6, -1, 0, 2**40, None])
                    | msgpack_values, max_size=2)), max_size=4))
def test_fuzz_fetch_client(chunks):
    """Hostile responses: the client returns (None, reason), or raises what `_afetch` maps to a failure;
    it never allocates more than its limit (here 4096 bytes) and never returns unverified bytes."""
    digest = packet_digest(b"wanted")

    async def main():
        (sr, sw), (cr, cw) = await _socketpair()
        for chunk in chunks:
            sw.write(chunk)
        sw.write_eof()
        try:
            data, reason = await asyncio.wait_for(Download("run", digest, 4096).request(cr, cw), 5)
        except (FrameError, asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            cw.close()
            sw.close()
        assert (data is None and reason != "ok") or (data == b"wanted" and reason == "ok")

    asyncio.run(main())

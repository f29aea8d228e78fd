"""Tests for swarm_node.wire.codec: round-trip properties, golden vectors, every error code, check order, hostile input."""
from __future__ import annotations

import json
import tempfile
import tracemalloc
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from swarm_node.commands.protocol import reference_outcome
from swarm_node.wire import conformance
from swarm_node.wire.codec import (ERROR_CODES, MAX_COMPLETIONS, MAX_GROUPS, MAX_PACKET_BYTES, MAX_STR_BYTES,
                                   MAX_TOKENS, MAX_UINT, PROTOCOL_VERSION, Completion, Group, Packet, PacketError,
                                   VocabError, decode, digest, encode, tokenizer_fingerprint)
from swarm_node.wire.packet_json import packet_from_json, packet_to_json

VECTORS = Path(__file__).resolve().parent.parent / "protocol" / "vectors"
SPEC = VECTORS.parent / "SPEC.md"
VECTOR_FILES = sorted(VECTORS.glob("*.msgpack"))
FP = "sha256:" + "ab" * 32
PEER = "12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf"


def completion(n=4, reward=1.0, finish="stop", seed=0) -> Completion:
    rng = np.random.default_rng(seed)
    return Completion(rng.integers(0, 1000, n).astype(np.uint32), -rng.random(n).astype(np.float32), finish, reward)


def packet(groups=None, **kw) -> Packet:
    if groups is None:
        groups = [Group("gsm8k", "train/17", np.arange(6, dtype=np.uint32), [completion(4, seed=1), completion(3, seed=2)])]
    base = dict(run_id="run-1", sender=PEER, model_id="Qwen/Qwen2.5-0.5B-Instruct", tokenizer=FP,
                policy_version=3, round=7, mode="vertical", groups=groups)
    return Packet(**{**base, **kw})


def wire(p: Packet) -> dict:
    return msgpack.unpackb(encode(p), raw=False)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def code_of(fn) -> str | None:
    try:
        fn()
    except PacketError as e:
        return e.code
    return None


def same(p: Packet, q: Packet) -> bool:
    """Equal JSON form and bit-identical arrays (so -0.0 vs 0.0 counts as different)."""
    arrays = lambda x: [a.tobytes() for g in x.groups for a in [g.prompt_tokens] + [b for c in g.completions for b in (c.tokens, c.logprobs)]]
    return packet_to_json(p) == packet_to_json(q) and arrays(p) == arrays(q)


# ----------------------------------------------------------------------------- properties

text = st.text(min_size=1, max_size=12)
uint = st.integers(0, MAX_UINT)


@st.composite
def completions(draw):
    n = draw(st.integers(0, 12))
    tokens = draw(hnp.arrays(np.uint32, n))
    logprobs = draw(hnp.arrays(np.float32, n, elements=st.floats(max_value=0, allow_nan=False, allow_infinity=False, width=32)))
    reward = draw(st.floats(allow_nan=False, allow_infinity=False))
    return Completion(tokens, logprobs, draw(st.sampled_from(["stop", "length"])), reward)


groups = st.builds(Group, text, text, hnp.arrays(np.uint32, st.integers(0, 10)), st.lists(completions(), max_size=4))
packets = st.builds(Packet, text, text, text, text, uint, uint, st.sampled_from(["vertical", "horizontal"]),
                    st.lists(groups, max_size=3), st.just(PROTOCOL_VERSION), uint)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packets)
def test_roundtrip_deterministic_digest(p):
    data = encode(p)
    q = decode(data)
    assert same(p, q)
    assert encode(q) == data == encode(p)  # deterministic, and decode -> encode is the identity on bytes
    assert digest(encode(q)) == digest(data)
    assert encode(packet_from_json(json.loads(json.dumps(packet_to_json(q))))) == data  # JSON form is lossless


def test_decoded_arrays_are_readonly_zero_copy_views():
    q = decode(encode(packet()))
    c = q.groups[0].completions[0]
    for a, dt in ((c.tokens, "<u4"), (c.logprobs, "<f4"), (q.groups[0].prompt_tokens, "<u4")):
        assert a.dtype == np.dtype(dt) and not a.flags.writeable and isinstance(a.base, bytes)


def test_encode_accepts_common_array_types_and_is_exact():
    p = packet([Group("t", "e", [1, 2, 3], [Completion(np.array([5, 6], np.int64), np.array([-0.5, -0.0]), "length", 1)])])
    q = decode(encode(p))
    assert q.groups[0].prompt_tokens.tolist() == [1, 2, 3]
    assert q.groups[0].completions[0].logprobs.tobytes() == np.array([-0.5, -0.0], "<f4").tobytes()
    assert isinstance(q.groups[0].completions[0].reward, float)


def test_paper_round_size_matches_spec():
    """SPEC.md section 1 quotes the size of vectors/paper_round.msgpack and a formula for it: both must hold."""
    data = (VECTORS / "paper_round.msgpack").read_bytes()
    q = decode(data)
    G, C, T, P = len(q.groups), len(q.groups[0].completions), len(q.groups[0].completions[0].tokens), len(q.groups[0].prompt_tokens)
    assert (G, C, T, P) == (2, 12, 200, 150)
    payload = sum(len(c.tokens.tobytes()) + len(c.logprobs.tobytes()) for g in q.groups for c in g.completions)
    assert payload == 8 * G * C * T
    def str_size(x: str) -> int:  # fixstr up to 31 bytes, else str8
        return len(x.encode()) + (1 if len(x.encode()) <= 31 else 2)
    # the formula of SPEC.md section 1: keys 87 B (with map and version), strings, ints 1+1+9 B, mode 9 B, groups array 1 B
    header = 87 + sum(str_size(x) for x in (q.run_id, q.sender, q.model_id, q.tokenizer)) + 1 + 1 + 9 + 9 + 1
    groups = sum(49 + len(g.task) + len(g.example_id) + 4 * P for g in q.groups)
    assert len(data) == header + groups + G * C * (58 + 8 * T)
    assert header == (VECTORS / "empty_packet.msgpack").stat().st_size  # same strings and ints, no groups
    spec = SPEC.read_text(encoding="utf-8")
    assert f"{len(data):,}".replace(",", " ") in spec and f"{len(data) / (G * C * T):.2f}" in spec


# ----------------------------------------------------------------------------- vectors

def reference_results(checks: tuple[str, ...]) -> list[conformance.Result]:
    with tempfile.TemporaryDirectory() as work:
        cases = conformance.decode_cases(VECTORS, Path(work)) + conformance.encode_cases(VECTORS)
        cases += conformance.fingerprint_cases(VECTORS, Path(work)) + conformance.digest_cases(VECTORS)
        return conformance.run_cases([c for c in cases if c.check in checks], dict.fromkeys(checks, reference_outcome), strict=True)


@pytest.mark.parametrize("path", VECTOR_FILES, ids=[p.stem for p in VECTOR_FILES])
def test_vector(path):
    with tempfile.TemporaryDirectory() as work:
        case = next(c for c in conformance.decode_cases(VECTORS, Path(work)) if c.file == path)
        ok, detail = conformance.judge(case, reference_outcome(case), strict=True)
    assert ok, detail


def test_vectors_encode_digest_and_fingerprint():
    results = reference_results(("encode", "digest", "fingerprint"))
    assert all(r.passed for r in results), [(r.case.name, r.detail) for r in results if not r.passed]
    counts = {check: sum(r.case.check == check for r in results) for check in ("encode", "digest", "fingerprint")}
    valid = sum("error" not in json.loads(p.with_suffix(".json").read_text(encoding="utf-8")) for p in VECTOR_FILES)
    assert counts["encode"] == counts["digest"] == valid and counts["fingerprint"] >= 12


def test_vector_coverage():
    kinds = [json.loads(p.with_suffix(".json").read_text(encoding="utf-8")) for p in VECTOR_FILES]
    invalid = [k["error"] for k in kinds if "error" in k]
    assert len(kinds) - len(invalid) >= 6 and len(invalid) >= 12
    assert set(invalid) == set(ERROR_CODES) - {"too_large"}  # too_large: the harness generates a 16 MiB + 1 file
    several = [k for k in kinds if "acceptable" in k]
    assert len(several) >= 5 and all(k["error"] not in k["acceptable"] for k in several)


def test_fingerprint_definition():
    class Tok:
        def get_vocab(self):
            return {"b": 2, "a": 1, "<eos>": 0, "ab": 3}
    fp = tokenizer_fingerprint(Tok())
    assert fp == tokenizer_fingerprint({"<eos>": 0, "a": 1, "b": 2, "ab": 3})  # dict order is irrelevant
    assert fp == digest(b'[["<eos>",0],["a",1],["b",2],["ab",3]]')
    assert fp != tokenizer_fingerprint({"<eos>": 0, "a": 1, "b": 2, "ab": 4})
    assert fp != tokenizer_fingerprint({"<eos>": 0, "a": 1, "b": 2, "ba": 3})
    assert tokenizer_fingerprint({"é\n": 0}) == digest('[["é\\n",0]]'.encode())
    assert tokenizer_fingerprint({"é": 1, "z": 1, "a": 1}) == digest('[["a",1],["z",1],["é",1]]'.encode())  # ties: UTF-8 bytes
    assert tokenizer_fingerprint({"a": np.int64(2**32 - 1)}) == digest(b'[["a",4294967295]]')


@pytest.mark.parametrize("vocab", [{"a": -1}, {"a": 2**32}, {"a": 1.0}, {"a": True}, {"\ud800": 0}, {b"a": 0}, {"a": "1"}],
                         ids=["negative", "over_uint32", "float", "bool", "lone_surrogate", "bytes_token", "str_id"])
def test_fingerprint_rejects_vocabularies_without_one(vocab):
    with pytest.raises(VocabError):
        tokenizer_fingerprint(vocab)


# ----------------------------------------------------------------------------- every error code

def _mutated(f) -> bytes:
    d = wire(packet())
    f(d)
    return pack(d)


def _comp(d):
    return d["groups"][0]["completions"][0]


GOOD = encode(packet())
ERROR_CASES = {
    "too_large": [lambda: decode(b"\x00" * (MAX_PACKET_BYTES + 1)),
                  lambda: encode(packet([Group("t", f"e{i}", np.zeros(0, np.uint32),
                                               [Completion(np.zeros(MAX_TOKENS, np.uint32), np.zeros(MAX_TOKENS, np.float32), "stop", 0.0)] * 5)
                                         for i in range(MAX_GROUPS)]))],
    "bad_msgpack": [lambda: decode(b""), lambda: decode(GOOD[:-1]), lambda: decode(b"\xc1"),
                    lambda: decode(GOOD.replace(b"\xa5gsm8k", b"\xa5\xff\xfe\xfd\xfc\xfb"))],
    "trailing_bytes": [lambda: decode(GOOD + b"\x00")],
    "bad_version": [lambda: decode(pack({"version": 2})), lambda: decode(pack({"run_id": "x", "version": 1})),
                    lambda: decode(pack({})), lambda: decode(pack({"version": -1})), lambda: encode(packet(version=2)),
                    lambda: decode(pack({"version": "1"})), lambda: decode(pack({"version": True})),
                    lambda: decode(pack({"version": 1.0})), lambda: decode(pack({"version": {}})),
                    lambda: decode(pack({1: 1})), lambda: decode(pack({b"version": 1})),
                    lambda: decode(pack({"v" * 300: 1}))],
    "missing_field": [lambda: decode(_mutated(lambda d: d.pop("groups"))), lambda: decode(pack({"version": 1}))],
    "unknown_field": [lambda: decode(_mutated(lambda d: _comp(d).update(x=1))),
                      lambda: decode(_mutated(lambda d: d.update({"k" * 40: 1})))],
    "duplicate_field": [lambda: decode(GOOD.replace(b"\xa6reward", b"\xa6tokens", 1)),
                        lambda: decode(GOOD.replace(b"\xa6run_id", b"\xa7version", 1)),  # a second version key
                        lambda: decode(pack({"version": 1, "version ": 2}).replace(b"\xa8version ", b"\xa7version"))],
    "bad_type": [lambda: decode("not bytes"), lambda: decode(pack([1])), lambda: decode(pack({"version": 1, 2: 2})),
                 lambda: decode(_mutated(lambda d: d.update(round=True))),
                 lambda: decode(_mutated(lambda d: d.update(round=1.0))),
                 lambda: decode(_mutated(lambda d: _comp(d).update(reward=1))),
                 lambda: decode(_mutated(lambda d: _comp(d).update(tokens=[1, 2, 3, 4]))),
                 lambda: decode(_mutated(lambda d: _comp(d).update(tokens=b"\0" * 5))),
                 lambda: decode(_mutated(lambda d: d.update(run_id=None))),
                 lambda: decode(_mutated(lambda d: d.update(groups={}))),
                 lambda: decode(_mutated(lambda d: _comp(d).update(tokens=b"\0" * (4 * MAX_TOKENS - 1)))),
                 lambda: encode(packet(round=True)), lambda: encode(packet(run_id=b"x")),
                 lambda: encode(packet([Group("t", "e", np.zeros((2, 2), np.uint32), [])])),
                 lambda: encode(packet([Group("t", "e", ["a"], [])])), lambda: encode("packet")],
    "limit_exceeded": [lambda: decode(_mutated(lambda d: d.update(groups=d["groups"] * (MAX_GROUPS + 1)))),
                       lambda: decode(_mutated(lambda d: d["groups"][0].update(completions=[_comp(d)] * (MAX_COMPLETIONS + 1)))),
                       lambda: decode(_mutated(lambda d: _comp(d).update(tokens=b"\0" * 4 * (MAX_TOKENS + 1)))),
                       lambda: decode(_mutated(lambda d: d["groups"][0].update(prompt_tokens=b"\0" * 4 * 8193))),
                       lambda: decode(_mutated(lambda d: d.update(sender="x" * (MAX_STR_BYTES + 1)))),
                       lambda: encode(packet(model_id="é" * (MAX_STR_BYTES // 2 + 1))),
                       lambda: encode(packet([Group("t", "e", [], [])] * (MAX_GROUPS + 1)))],
    "bad_value": [lambda: decode(_mutated(lambda d: d.update(policy_version=MAX_UINT + 1))),
                  lambda: decode(_mutated(lambda d: d.update(round=-1))),
                  lambda: decode(_mutated(lambda d: d.update(run_id=""))),
                  lambda: decode(_mutated(lambda d: _comp(d).update(reward=float("inf")))),
                  lambda: encode(packet([Group("t", "e", np.array([-1]), [])])),
                  lambda: encode(packet(sender="\ud800")),
                  lambda: encode(packet([Group("t", "e", [], [Completion([], [], "stop", 10**400)])]))],
    "bad_enum": [lambda: decode(_mutated(lambda d: d.update(mode="Vertical"))), lambda: decode(_mutated(lambda d: d.update(mode=""))),
                 lambda: decode(_mutated(lambda d: _comp(d).update(finish_reason=""))), lambda: encode(packet(mode="")),
                 lambda: encode(packet([Group("t", "e", [], [completion(finish="eos")])]))],
    "length_mismatch": [lambda: decode(_mutated(lambda d: _comp(d).update(logprobs=b""))),
                        lambda: encode(packet([Group("t", "e", [], [Completion([1, 2], [-1.0], "stop", 0.0)])]))],
    "bad_logprob": [lambda: decode(_mutated(lambda d: _comp(d).update(logprobs=np.array([-1, 1e-9, -1, -1], "<f4").tobytes()))),
                    lambda: encode(packet([Group("t", "e", [], [Completion([1], [np.nan], "stop", 0.0)])])),
                    lambda: encode(packet([Group("t", "e", [], [Completion([1], [1e-45], "stop", 0.0)])])),  # + subnormal
                    lambda: encode(packet([Group("t", "e", [], [Completion([1], [-1e300], "stop", 0.0)])]))],  # -inf in float32
    "token_out_of_range": [lambda: decode(GOOD, vocab_size=int(packet().groups[0].completions[0].tokens.max())),
                           lambda: decode(GOOD, vocab_size=5)],  # prompt token 5
    "not_canonical": [lambda: decode(GOOD.replace(b"\xa5round\x07", b"\xa5round\xcc\x07")),
                      lambda: decode(GOOD.replace(b"\xa5round\x07", b"\xa5round\xd0\x07")),  # int8 form
                      lambda: decode(pack({"version": 1, **dict(list(reversed(wire(packet()).items()))[:-1])}))],
}


def test_error_codes_documented_and_all_reachable():
    assert set(ERROR_CASES) == set(ERROR_CODES)
    spec = (VECTORS.parent / "SPEC.md").read_text(encoding="utf-8")
    assert all(f"`{code}`" in spec for code in ERROR_CODES)


@pytest.mark.parametrize("code,i", [(c, i) for c, fs in ERROR_CASES.items() for i in range(len(fs))])
def test_error_case(code, i):
    assert code_of(ERROR_CASES[code][i]) == code


ORDER_CASES = {  # several faults in one packet: the code of the first in SPEC.md section 6 order
    "limit_exceeded": lambda: decode(_mutated(lambda d: _comp(d).update(tokens=b"\0" * (4 * MAX_TOKENS + 3)))),  # and misaligned
    "bad_type": lambda: decode(_mutated(lambda d: (d.update(run_id=1), _comp(d).update(extra=1)))),  # byte order
    "unknown_field": lambda: decode(_mutated(lambda d: (d.update(zz=1), d.pop("groups")))),  # key checks before missing
    "bad_msgpack": lambda: decode(_mutated(lambda d: d.update(mode="x"))[:-1]),  # structure before semantics
    "trailing_bytes": lambda: decode(_mutated(lambda d: _comp(d).update(reward=float("nan"))) + b"\x00"),
    "bad_value": lambda: decode(_mutated(lambda d: (d.update(run_id=""), d.update(mode="x")))),  # wire order in step 4
    "length_mismatch": lambda: decode(_mutated(lambda d: _comp(d).update(logprobs=b"\0\0\x80\x7f", finish_reason="x"))),
    "bad_logprob": lambda: decode(GOOD.replace(b"\xa5round\x07", b"\xa5round\xcc\x07").replace(
        np.float32(packet().groups[0].completions[0].logprobs[0]).tobytes(), np.float32(0.5).tobytes())),  # before not_canonical
    "bad_version": lambda: decode(pack({"version": 2.5, "extra": None}) + b"junk"),  # the version gate comes first
}


@pytest.mark.parametrize("code", list(ORDER_CASES))
def test_check_order(code):
    assert code_of(ORDER_CASES[code]) == code


def test_decode_memory_is_bounded_by_the_packet():
    """A ~16 MiB packet decodes in little more memory than its own bytes (SPEC.md section 6 states the bound)."""
    rng = np.random.default_rng(0)
    T = 8000
    gs = [Group("gsm8k", f"train/{i}", np.arange(16, dtype=np.uint32), [
        Completion(rng.integers(0, 1000, T).astype(np.uint32), -rng.random(T).astype(np.float32), "stop", 1.0) for _ in range(4)])
        for i in range(MAX_GROUPS)]
    data = encode(packet(gs))
    assert len(data) > 0.95 * MAX_PACKET_BYTES
    del gs
    tracemalloc.start()
    q = decode(data, vocab_size=1000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(q.groups) == MAX_GROUPS and peak < len(data) // 16  # measured: ~0.4 MiB, 0.02x


def test_valid_inputs_accepted():
    assert same(decode(bytearray(GOOD)), decode(memoryview(GOOD)))
    assert decode(GOOD, vocab_size=1000).round == decode(GOOD, vocab_size=np.int64(1000)).round == 7
    with pytest.raises(ValueError):
        decode(GOOD, vocab_size=0)  # a caller bug, not a PacketError


# ----------------------------------------------------------------------------- hostile input

def only_packet_errors(data: bytes) -> None:
    try:
        decode(data, vocab_size=1000)
    except PacketError as e:
        assert e.code in ERROR_CODES


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_packet_error(data):
    only_packet_errors(data)
    only_packet_errors(b"\x8a\xa7version\x01" + data)  # past the version gate


VALID = [p.read_bytes() for p in VECTOR_FILES if "error" not in json.loads(p.with_suffix(".json").read_text(encoding="utf-8"))
         and p.stat().st_size < 5000]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VALID), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
       st.sampled_from(["flip", "insert", "delete", "truncate"]))
def test_mutated_vectors_only_packet_error(data, edits, how):
    b = bytearray(data)
    for pos, val in edits:
        pos %= len(b) or 1
        if how == "flip" and b:
            b[pos] = val
        elif how == "insert":
            b[pos:pos] = bytes([val])
        elif how == "delete":
            del b[pos:pos + 1]
        else:
            del b[pos:]
    only_packet_errors(bytes(b))


def test_mutation_sweep_every_byte():
    """Every single-byte replacement (a few values) of a small valid packet: never anything but PacketError."""
    data = VALID[0]
    for pos in range(len(data)):
        for val in (0x00, 0x7F, 0xC0, 0xC1, 0xC3, 0xCB, 0xCF, 0xD9, 0xDB, 0xDD, 0xDF, 0xFF):
            only_packet_errors(data[:pos] + bytes([val]) + data[pos + 1:])


@pytest.mark.parametrize("data", [
    b"\x91" * 100_000,  # deep nesting
    b"\xdd\xff\xff\xff\xff",  # array32 of 2^32-1 entries
    b"\xdf\xff\xff\xff\xff" + b"\xa7version\x01",  # map32 claiming 2^32-1 entries
    b"\x8a\xa7version\x01\xa6groups\xdd\xff\xff\xff\xff",  # groups claiming 2^32-1 entries
    b"\x8a\xa7version\x01\xa6run_id\xdb\xff\xff\xff\xff",  # str32 claiming 4 GiB
    b"\x8a\xa7version\x01\xa6groups\x91\x84\xadprompt_tokens\xc6\xff\xff\xff\xfc",  # bin32 claiming 4 GiB
    b"\x8a\xa7version\x01\xa6run_id\xc7\x01\x05x",  # ext
    b"\x8a\xa7version\x01" + b"\xa6run_id\xa1x" * 100_000,  # endless duplicate keys
], ids=["deep", "array32", "map32", "groups32", "str32", "bin32", "ext", "dupkeys"])
def test_hostile_headers(data):
    import tracemalloc
    tracemalloc.start()
    with pytest.raises(PacketError):
        decode(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * len(data) + (1 << 20)  # no allocation driven by the declared lengths

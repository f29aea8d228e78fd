"""Regenerate protocol/vectors/ (golden test vectors) deterministically.

    python protocol/make_vectors.py            # rewrite protocol/vectors/
    swarm-node protocol verify                 # check them against the codec

Valid vector NAME: NAME.msgpack (canonical bytes) + NAME.json (JSON form); digests.json: NAME -> digest.
Invalid vector NAME: NAME.msgpack (bad bytes) + NAME.json {"error": code, "note": ..., ["vocab_size": N]}.
Several-fault vector order_*: like an invalid one, plus "acceptable": the other codes a decoder may give.
tokenizer_fingerprint.json: vocabularies (or tokenizer.json files) and their fingerprints, or "error".
tasks.json: the task contract's vectors (swarm_node/wire/contract.py).
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from swarm_node.wire.codec import (MAX_COMPLETIONS, MAX_GROUPS, MAX_PROMPT_TOKENS, MAX_STR_BYTES, MAX_TOKENS, MAX_UINT,  # noqa: E402
                              Completion, Group, Packet, VocabError, decode, digest, encode, tokenizer_fingerprint)
from swarm_node.wire.contract import write_task_vectors  # noqa: E402
from swarm_node.commands.protocol import vocab_from_tokenizer_json  # noqa: E402
from swarm_node.wire.packet_json import dumps, packet_to_json  # noqa: E402

OUT = Path(__file__).resolve().parent / "vectors"
SENDER = "12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf"

FINGERPRINT_CASES = {
    "tiny": {"<eos>": 0, "a": 1, "b": 2, "ab": 3},
    "unsorted_with_gaps": {"z": 7, "<|endoftext|>": 100, "y": 3, "x": 0},
    "byte_level_bpe": {"Ġthe": 0, "Ċ": 1, "ĠĠ": 2, "é": 3, "中文": 4, "<|im_start|>": 5, "<|im_end|>": 6},
    "json_escapes": {'"': 0, "\\": 1, "\n": 2, "\t": 3, "\u0001": 4, "\u007f": 5, "/": 6, "\u2028": 7, "😀": 8, "": 9},
    "shared_id": {"b": 1, "a": 1, "é": 0},  # ties on the id are ordered by UTF-8 bytes
    "max_id": {"<last>": 2**32 - 1, "a": 0},
}
BAD_VOCABS = {  # vocabularies without a fingerprint: name -> (vocab, why)
    "negative_id": ({"a": 0, "b": -1}, "a negative id"),
    "id_over_uint32": ({"a": 2**32}, "an id of 2^32 (ids are uint32)"),
    "float_id": ({"a": 1.5}, "a non-integer id"),
    "lone_surrogate": ({"a": 0, "\ud800": 1}, "a token with a lone surrogate (not Unicode; RFC 8785 needs I-JSON)"),
}


def _added(i: int, content: str) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
            "special": True}


def _tokenizer_json(model: dict, added: list[dict]) -> dict:
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None, "model": model}


def _bpe(vocab: dict) -> dict:
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": ["a b"]}


TOKENIZER_JSON_CASES = {  # name -> (tokenizer.json, what it covers); ids as Hugging Face tokenizers 0.23 loads them
    "tokenizer_json_consecutive": (_tokenizer_json(_bpe({"a": 0, "b": 1, "ab": 2}), [_added(3, "<|eos|>"), _added(4, "<|pad|>")]),
                                   "the usual file: added tokens numbered on from model.vocab"),
    "tokenizer_json_collision": (_tokenizer_json(_bpe({"a": 0, "b": 1, "ab": 2}), [_added(5, "a"), _added(3, "<pad>")]),
                                 "an added token with the text of a model.vocab entry keeps the model.vocab id (0, not 5)"),
    "tokenizer_json_ids_reassigned": (_tokenizer_json(_bpe({"a": 0, "b": 1, "ab": 2}), [_added(10, "<x>"), _added(1, "<y>"), _added(7, "")]),
                                      "added-token ids in the file are not used: new texts get 3, 4; empty content is skipped"),
    "tokenizer_json_unigram": (_tokenizer_json({"type": "Unigram", "unk_id": 0, "byte_fallback": False,
                                                "vocab": [["<unk>", 0.0], ["▁a", -1.5], ["b", -2.0]]}, [_added(3, "<s>"), _added(0, "<unk>")]),
                               "Unigram: model.vocab is a list and a piece's id is its index"),
}
TOKENIZER = tokenizer_fingerprint(FINGERPRINT_CASES["tiny"])


def rng_completion(rng, n: int, finish="stop", reward=1.0, vocab=1000) -> Completion:
    lp = -np.abs(rng.standard_normal(n)).astype(np.float32) * 2
    return Completion(rng.integers(0, vocab, n).astype(np.uint32), lp, finish, reward)


def packet(groups, **kw) -> Packet:
    base = dict(run_id="swarm-demo-1", sender=SENDER, model_id="Qwen/Qwen2.5-0.5B-Instruct", tokenizer=TOKENIZER,
                policy_version=12, round=3, mode="vertical", groups=groups, created_at=1735689600000)
    base.update(kw)
    return Packet(**base)


def group(rng, n_completions=2, n_tokens=5, task="gsm8k", example_id="train/17", prompt=6, **kw) -> Group:
    return Group(task, example_id, rng.integers(0, 1000, prompt).astype(np.uint32),
                 [rng_completion(rng, n_tokens, **kw) for _ in range(n_completions)])


def valid_vectors() -> dict[str, tuple[Packet, str]]:
    rng = np.random.default_rng(0)
    v = {}
    v["basic"] = (packet([group(rng, 2, 5)]), "one group, two short completions, random float32 log-probs")
    v["empty_completion"] = (packet([Group("gsm8k", "train/0", np.arange(4, dtype=np.uint32), [
        Completion(np.zeros(0, np.uint32), np.zeros(0, np.float32), "length", 0.0), rng_completion(rng, 3)])]),
        "a completion with zero tokens (bins of length 0)")
    v["empty_packet"] = (packet([]), "no groups at all")
    v["empty_group"] = (packet([Group("gsm8k", "train/5", np.zeros(0, np.uint32), [])]),
                        "a group with no completions and an empty prompt")
    v["several_groups"] = (packet([group(rng, 3, 4, example_id=f"train/{i}", reward=float(i) / 2) for i in range(3)]
                                  + [group(rng, 1, 2, task="math", example_id="test/9")], policy_version=300),
                           "four groups from two tasks; uint16 policy_version")
    v["unicode_ids"] = (packet([group(rng, 1, 3, task="数学", example_id="train/第17题 ✓")],
                               run_id="swarm-🐝-1", model_id="org/模型-0.5B"),
                        "non-ASCII run id, model id, task and example id (raw UTF-8 in msgpack str)")
    v["horizontal_mode"] = (packet([group(rng, 2, 3)], mode="horizontal"), "mode = horizontal")
    v["finish_length"] = (packet([group(rng, 2, 4, finish="length", reward=0.0)]), "finish_reason = length")
    fl = np.array([-0.0, -1e-45, -1.1754944e-38, -3.4028235e38, -0.5, -1.0], np.float32)
    v["float_edges"] = (packet([Group("gsm8k", "train/1", np.array([0, 1], np.uint32), [
        Completion(np.arange(6, dtype=np.uint32), fl, "stop", -0.0),
        Completion(np.arange(1, dtype=np.uint32), fl[:1], "stop", -1.5e300),
        Completion(np.arange(1, dtype=np.uint32), fl[4:5], "stop", 5e-324)])]),
        "log-probs -0.0, smallest subnormal, smallest normal, lowest float32; rewards -0.0, huge, subnormal")
    v["int_widths"] = (packet([group(rng, 1, 70, example_id="x" * 31, task="y" * 32)],
                              policy_version=128, round=65536, created_at=2**32),
                       "uint8/uint32/uint64 ints, fixstr (31 bytes) vs str8 (32 bytes), bin16 (280 bytes)")
    big_token = np.array([0xFFFFFFFF, 0, 0x7FFFFFFF], np.uint32)
    s256 = "é" * (MAX_STR_BYTES // 2)  # 128 two-byte chars = 256 UTF-8 bytes
    v["max_strings_ints"] = (packet([Group("t" * MAX_STR_BYTES, s256, big_token,
                                           [Completion(big_token, np.array([-0.25] * 3, np.float32), "stop", 1.0)])],
                                    run_id="r" * MAX_STR_BYTES, model_id=s256, policy_version=MAX_UINT, round=MAX_UINT,
                                    created_at=MAX_UINT),
                             "every string at 256 UTF-8 bytes (ASCII and 2-byte chars), ints at 2^53-1, token id 2^32-1")
    v["max_counts"] = (packet([Group("gsm8k", "train/0", np.array([1], np.uint32),
                                     [Completion(np.array([i], np.uint32), np.array([-1.0], np.float32), "stop", 0.0)
                                      for i in range(MAX_COMPLETIONS)])]
                              + [Group("gsm8k", f"train/{i}", np.array([1], np.uint32), []) for i in range(1, MAX_GROUPS)]),
                       "64 groups, 64 completions in the first group")
    lp = -np.tile(np.array([0.5, 0.25, 0.125, 2.0], np.float32), MAX_TOKENS // 4)
    v["max_tokens"] = (packet([Group("gsm8k", "train/0", (np.arange(MAX_PROMPT_TOKENS) % 1000).astype(np.uint32),
                                     [Completion((np.arange(MAX_TOKENS) % 151936).astype(np.uint32), lp, "length", 0.0)])]),
                       "8192 prompt tokens and an 8192-token completion")
    v["integral_rewards"] = (packet([Group("gsm8k", "train/2", np.array([7], np.uint32), [
        Completion(np.array([1], np.uint32), np.array([-0.5], np.float32), "stop", r) for r in (1.0, 0.0, -0.0, 2.0, -1.0)])]),
        "rewards 1.0, 0.0, -0.0, 2.0, -1.0: float64 0xcb even when integral, -0.0 keeps its sign")
    prng = np.random.default_rng(7)
    v["paper_round"] = (packet([Group("gsm8k", f"train/{i}", prng.integers(0, 151936, PAPER[3]).astype(np.uint32),
                                      [Completion(prng.integers(0, 151936, PAPER[2]).astype(np.uint32),
                                                  -prng.random(PAPER[2]).astype(np.float32), "stop", 1.0) for _ in range(PAPER[1])])
                                for i in range(PAPER[0])]),
                        "paper-size round (SPEC.md section 1): 2 groups x 12 completions x 200 tokens, 150-token prompts")
    v["float_spellings"] = (packet([Group("gsm8k", "train/3", np.array([1, 2], np.uint32), [
        Completion(np.arange(4, dtype=np.uint32), np.array([-0.0, -1.0, -0.25, -2.0], np.float32), "stop", 1e16),
        Completion(np.arange(1, dtype=np.uint32), np.array([-0.5], np.float32), "length", -0.0),
        Completion(np.arange(1, dtype=np.uint32), np.array([-3.0], np.float32), "stop", 1.0)])]),
        "its .json spells floats as other writers do (-0, -1, -2.5E-1, 1e16, 1): equal values, same packet")
    return v


PAPER = (2, 12, 200, 150)  # groups, completions per group, tokens per completion, prompt tokens
FLOAT_SPELLINGS = {"logprobs": [["-0", "-1", "-2.5E-1", "-2"], ["-5e-1"], ["-3"]], "reward": ["1e16", "-0", "1"]}


def spelled_json(p: Packet) -> str:
    """The JSON form of float_spellings with its floats written as JavaScript/other writers do."""
    obj = packet_to_json(p)
    for ci, c in enumerate(obj["groups"][0]["completions"]):
        c["logprobs"] = [f"@{x}@" for x in FLOAT_SPELLINGS["logprobs"][ci]]
        c["reward"] = f"@{FLOAT_SPELLINGS['reward'][ci]}@"
    text = dumps(obj)
    return text.replace('"@', "").replace('@"', "")


def wire(p: Packet) -> dict:
    """The msgpack map of a valid packet as plain Python objects, for mutation."""
    return msgpack.unpackb(encode(p), raw=False)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, (old, data.count(old))
    return data.replace(old, new)


def comp(d: dict) -> dict:
    """The first completion of a packet's wire map."""
    return d["groups"][0]["completions"][0]


def invalid_vectors() -> dict[str, tuple[bytes, str, dict]]:
    rng = np.random.default_rng(1)
    good = packet([group(rng, 2, 4)])
    gb = encode(good)
    v = {}

    def mut(f):
        d = wire(good)
        f(d)
        return pack(d)

    v["bad_msgpack_truncated"] = (gb[:len(gb) // 2], "bad_msgpack", "a valid packet cut in half")
    v["bad_msgpack_utf8"] = (replace_once(gb, b"\xa5gsm8k", b"\xa5gsm\xff\xfe"), "bad_msgpack", "task str is not valid UTF-8")
    v["trailing_bytes"] = (gb + b"\xc0", "trailing_bytes", "a valid packet followed by one nil byte")
    v["bad_version_2"] = (pack({"version": 2, **{k: x for k, x in wire(good).items() if k != "version"}, "signature": b"\0" * 8}),
                          "bad_version", "version 2 with a key v1 does not know: rejected on the version alone")
    v["bad_version_not_first"] = (pack({"run_id": "x", "version": 1}), "bad_version", "'version' must be the first key")
    v["missing_field"] = (mut(lambda d: comp(d).pop("reward")), "missing_field", "a completion without reward")
    v["unknown_field"] = (mut(lambda d: d.update(extra=1)), "unknown_field", "v1 rejects unknown keys at every level")
    v["duplicate_field"] = (replace_once(pack({"version": 1, "run_id": "a", "run_id ": "b"}), b"\xa7run_id ", b"\xa6run_id"),
                            "duplicate_field", "the key run_id twice")
    v["bad_type_logprobs_array"] = (mut(lambda d: comp(d).update(logprobs=[-0.5] * 4)), "bad_type",
                                    "log-probs as a msgpack array of floats instead of bin")
    v["bad_type_bool_int"] = (mut(lambda d: d.update(round=True)), "bad_type", "round = true: bool is not an integer")
    v["bad_type_ext"] = (mut(lambda d: d.update(created_at=msgpack.ExtType(1, b"\0" * 8))), "bad_type",
                         "an extension type (ext 8) where an integer belongs")
    v["bad_type_misaligned_bin"] = (mut(lambda d: comp(d).update(tokens=b"\0" * 7)), "bad_type",
                                    "tokens bin of 7 bytes is not a whole number of uint32")
    v["limit_exceeded_groups"] = (mut(lambda d: d.update(groups=d["groups"] * (MAX_GROUPS + 1))), "limit_exceeded",
                                  "65 groups")
    v["limit_exceeded_tokens"] = (mut(lambda d: comp(d).update(tokens=b"\0" * 4 * (MAX_TOKENS + 1),
                                                               logprobs=b"\0" * 4 * (MAX_TOKENS + 1))),
                                  "limit_exceeded", "a completion of 8193 tokens")
    v["limit_exceeded_string"] = (mut(lambda d: d.update(model_id="m" * (MAX_STR_BYTES + 1))), "limit_exceeded",
                                  "model_id of 257 bytes")
    v["bad_value_empty_string"] = (mut(lambda d: d["groups"][0].update(example_id="")), "bad_value", "empty example_id")
    v["bad_value_int_range"] = (mut(lambda d: d.update(policy_version=MAX_UINT + 1)), "bad_value", "policy_version = 2^53")
    v["bad_value_reward_nan"] = (mut(lambda d: comp(d).update(reward=float("nan"))), "bad_value", "reward NaN")
    v["bad_enum_mode"] = (mut(lambda d: d.update(mode="diagonal")), "bad_enum", "mode 'diagonal'")
    v["bad_enum_finish_reason"] = (mut(lambda d: comp(d).update(finish_reason="eos")), "bad_enum", "finish_reason 'eos'")
    v["length_mismatch"] = (mut(lambda d: comp(d).update(logprobs=comp(d)["logprobs"][:-4])), "length_mismatch",
                            "4 tokens, 3 log-probs")
    v["bad_logprob_positive"] = (mut(lambda d: comp(d).update(logprobs=struct.pack("<4f", -1, -1, 0.5, -1))), "bad_logprob",
                                 "a log-prob of +0.5")
    v["bad_logprob_nan"] = (mut(lambda d: comp(d).update(logprobs=struct.pack("<4f", -1, float("nan"), -1, -1))),
                            "bad_logprob", "a NaN log-prob")
    v["bad_logprob_neg_inf"] = (mut(lambda d: comp(d).update(logprobs=struct.pack("<4f", -1, -1, -1, float("-inf")))),
                                "bad_logprob", "a -inf log-prob (the sampler picked an impossible token)")
    v["token_out_of_range"] = (mut(lambda d: comp(d).update(tokens=struct.pack("<4I", 1, 2, 1000, 3))),
                               "token_out_of_range", "token id 1000 with vocab_size 1000", {"vocab_size": 1000})
    v["token_out_of_range_prompt"] = (mut(lambda d: d["groups"][0].update(prompt_tokens=struct.pack("<2I", 5, 4000))),
                                      "token_out_of_range", "prompt token id 4000 with vocab_size 1000", {"vocab_size": 1000})
    v["not_canonical_int_width"] = (replace_once(gb, b"\xaepolicy_version\x0c", b"\xaepolicy_version\xcf" + (12).to_bytes(8, "big")),
                                    "not_canonical", "policy_version 12 written as uint64 instead of a positive fixint")
    v["not_canonical_key_order"] = (pack({"version": 1, **dict(list(reversed(wire(good).items()))[:-1])}), "not_canonical",
                                    "all keys present, but not in the specified order")
    v["not_canonical_float32_reward"] = (gb.replace(b"\xa6reward\xcb" + struct.pack(">d", 1.0), b"\xa6reward\xca" + struct.pack(">f", 1.0)),
                                         "not_canonical", "rewards written as float32 instead of float64")
    v["not_canonical_str8"] = (replace_once(gb, b"\xa8vertical", b"\xd9\x08vertical"), "not_canonical",
                               "mode written as str8 instead of fixstr")
    v["bad_type_top_level"] = (pack([1, 2, 3]), "bad_type", "the packet is an array, not a map")
    v.update(errata_vectors(good, mut))
    v.update(order_vectors(mut))
    return {k: (x[0], x[1], x[2], x[3] if len(x) > 3 else {}) for k, x in v.items()}


def errata_vectors(good: Packet, mut) -> dict:
    """Single-fault vectors for the 2026-11 errata of SPEC.md (changelog)."""
    v = {}
    rest = {k: x for k, x in wire(good).items() if k != "version"}
    v["duplicate_version"] = (replace_once(pack({"version": 1, "versio_": 1, **rest}), b"\xa7versio_", b"\xa7version"),
                              "duplicate_field", "a second 'version' key right after the first")
    v["bad_version_float"] = (pack({"version": 1.0, **rest}), "bad_version", "version 1.0: a float, not the integer 1")
    v["bad_version_string"] = (pack({"version": "1", **rest}), "bad_version", "version '1': a string, not the integer 1")
    v["bad_version_int_key"] = (pack({1: 1, **rest}), "bad_version", "the first key is the integer 1, not the string 'version'")
    v["bad_version_empty_map"] = (b"\x80", "bad_version", "an empty map: no 'version' first key")
    v["bad_enum_empty_mode"] = (mut(lambda d: d.update(mode="")), "bad_enum", "mode '': the empty string is not an allowed value")
    v["bad_enum_empty_finish_reason"] = (mut(lambda d: comp(d).update(finish_reason="")), "bad_enum", "finish_reason ''")
    v["bad_type_reward_int"] = (mut(lambda d: comp(d).update(reward=1)), "bad_type",
                                "reward as the integer 1 (what msgpack-javascript writes for 1.0 by default)")
    v["bad_logprob_positive_subnormal"] = (mut(lambda d: comp(d).update(logprobs=struct.pack("<4f", -1, -1, 1e-45, -1))),
                                           "bad_logprob", "a log-prob of +1e-45, the smallest positive subnormal float32")
    v["unknown_field_bad_utf8_key"] = (replace_once(mut(lambda d: comp(d).update(zz=1)), b"\xa2zz", b"\xa2\xff\xfe"),
                                       "unknown_field", "a completion key whose bytes are not UTF-8: unknown, not bad_msgpack")
    return v


def order_vectors(mut) -> dict:
    """Several faults: "error" is what the reference reports (SPEC.md section 6 order), "acceptable" the other codes."""
    v = {}
    big = b"\0" * (4 * MAX_TOKENS + 1)
    v["order_limit_before_alignment"] = (mut(lambda d: comp(d).update(tokens=big, logprobs=big)), "limit_exceeded",
                                         "bins of 32769 bytes: over the limit and not a multiple of 4", {"acceptable": ["bad_type"]})
    v["order_structure_before_semantics"] = (mut(lambda d: d["groups"][0].update(example_id=""))[:-1], "bad_msgpack",
                                             "an empty example_id, and the packet's last byte is missing", {"acceptable": ["bad_value"]})
    v["order_byte_order"] = (mut(lambda d: (d.update(run_id="r" * (MAX_STR_BYTES + 1)), comp(d).update(extra=1))), "limit_exceeded",
                             "run_id of 257 bytes, then an unknown key in a completion", {"acceptable": ["unknown_field"]})
    v["order_trailing_before_semantics"] = (mut(lambda d: d.update(mode="diagonal")) + b"\xc0", "trailing_bytes",
                                            "mode 'diagonal' and a trailing byte", {"acceptable": ["bad_enum"]})
    v["order_semantics_in_wire_order"] = (mut(lambda d: (d.update(mode="diagonal"), comp(d).update(reward=float("nan")))), "bad_enum",
                                          "mode 'diagonal', then a NaN reward", {"acceptable": ["bad_value"]})
    v["order_canonical_last"] = (replace_once(mut(lambda d: comp(d).update(logprobs=struct.pack("<4f", -1, -1, 0.5, -1))),
                                              b"\xaepolicy_version\x0c", b"\xaepolicy_version\xcf" + (12).to_bytes(8, "big")),
                                 "bad_logprob", "policy_version as uint64 (not canonical) and a log-prob of +0.5",
                                 {"acceptable": ["not_canonical"]})
    return v


def fingerprint_cases() -> list[dict]:
    cases = [{"name": n, "vocab": v, "canonical_json": canonical_json(v), "fingerprint": tokenizer_fingerprint(v)}
             for n, v in FINGERPRINT_CASES.items()]
    for name, (tj, note) in TOKENIZER_JSON_CASES.items():
        v = vocab_from_tokenizer_json(tj)
        cases.append({"name": name, "note": note, "tokenizer_json": tj, "vocab": v, "canonical_json": canonical_json(v),
                      "fingerprint": tokenizer_fingerprint(v)})
    for name, (v, note) in BAD_VOCABS.items():
        try:
            tokenizer_fingerprint(v)
        except VocabError:
            cases.append({"name": name, "note": note, "vocab": v, "error": "no fingerprint"})
        else:
            raise AssertionError(f"{name} has a fingerprint")
    return cases


def canonical_json(vocab: dict) -> str:
    pairs = sorted(([t, i] for t, i in vocab.items()), key=lambda x: (x[1], x[0].encode("utf-8")))
    return json.dumps(pairs, ensure_ascii=False, separators=(",", ":"))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for f in list(OUT.glob("*.msgpack")) + list(OUT.glob("*.json")):
        f.unlink()
    rows, digests = [], {}
    for name, (p, note) in valid_vectors().items():
        data = encode(p)
        assert decode(data) is not None
        (OUT / f"{name}.msgpack").write_bytes(data)
        text = spelled_json(p) if name == "float_spellings" else dumps(packet_to_json(p))
        (OUT / f"{name}.json").write_text(text + "\n", encoding="utf-8")
        digests[name] = digest(data)
        rows.append((name, "valid", f"`{digests[name]}`", len(data), note))
    for name, (data, code, note, extra) in invalid_vectors().items():
        (OUT / f"{name}.msgpack").write_bytes(data)
        (OUT / f"{name}.json").write_text(dumps({"error": code, "note": note, **extra}) + "\n", encoding="utf-8")
        also = "".join(f" (or `{c}`)" for c in extra.get("acceptable", ()))
        rows.append((name, "invalid", f"`{code}`{also}", len(data), note))
    (OUT / "digests.json").write_text(json.dumps(digests, indent=2) + "\n", encoding="utf-8")
    cases = fingerprint_cases()  # ASCII-only JSON: a lone surrogate can only travel as a \u escape
    (OUT / "tokenizer_fingerprint.json").write_text(json.dumps(cases, ensure_ascii=True, indent=2) + "\n", encoding="utf-8")
    lines = ["# Test vectors", "", "Generated by `protocol/make_vectors.py`; checked by `swarm-node protocol verify` (the reference)",
             "and `swarm-node protocol conformance --impl CMD` (any implementation). See SPEC.md section 10 for the formats.",
             "`too_large` has no file here: the harness generates it (a valid packet padded to 16 MiB + 1 byte).", "",
             "| name | kind | digest, or expected error | bytes | what it covers |", "|---|---|---|---|---|"]
    lines += [f"| `{n}` | {k} | {c} | {b} | {note} |" for n, k, c, b, note in rows]
    write_task_vectors(OUT / "tasks.json")  # the task contract (SPEC.md section 14)
    lines += ["", "`tokenizer_fingerprint.json`: " + ", ".join(f"`{c['name']}`" for c in cases)
              + " (vocabulary or tokenizer.json -> canonical JSON -> fingerprint, or an error).", "",
              "`tasks.json`: the task contract (SPEC.md section 14): arith examples generated from their ids,",
              "their prompts and reference completions, GSM8K's prompt, reward cases of the answer format,",
              "and a run manifest with its canonical JSON and digest.", ""]
    (OUT / "INDEX.md").write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {len(rows)} vectors + {len(cases)} fingerprint cases to {OUT}")


if __name__ == "__main__":
    main()

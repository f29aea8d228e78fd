"""Regenerate protocol/vectors/ (golden test vectors) deterministically.

    python protocol/make_vectors.py            # rewrite protocol/vectors/
    swarm-node protocol verify                 # check them against the codec

Valid vector NAME: NAME.msgpack (canonical bytes) + NAME.json (JSON form).
Invalid vector NAME: NAME.msgpack (bad bytes) + NAME.json {"error": code, "note": ..., ["vocab_size": N]}.
tokenizer_fingerprint.json: vocabularies and their expected fingerprints.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from swarm_node.codec import (MAX_COMPLETIONS, MAX_GROUPS, MAX_PROMPT_TOKENS, MAX_STR_BYTES, MAX_TOKENS, MAX_UINT,  # noqa: E402
                              Completion, Group, Packet, decode, encode, tokenizer_fingerprint)
from swarm_node.packet_json import dumps, packet_to_json  # noqa: E402

OUT = Path(__file__).resolve().parent / "vectors"
SENDER = "12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf"

FINGERPRINT_CASES = {
    "tiny": {"<eos>": 0, "a": 1, "b": 2, "ab": 3},
    "unsorted_with_gaps": {"z": 7, "<|endoftext|>": 100, "y": 3, "x": 0},
    "byte_level_bpe": {"Ġthe": 0, "Ċ": 1, "ĠĠ": 2, "é": 3, "中文": 4, "<|im_start|>": 5, "<|im_end|>": 6},
    "json_escapes": {'"': 0, "\\": 1, "\n": 2, "\t": 3, "\u0001": 4, "\u007f": 5, "/": 6, "\u2028": 7, "😀": 8, "": 9},
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
    return v


def wire(p: Packet) -> dict:
    """The msgpack map of a valid packet as plain Python objects, for mutation."""
    return msgpack.unpackb(encode(p), raw=False)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, (old, data.count(old))
    return data.replace(old, new)


def invalid_vectors() -> dict[str, tuple[bytes, str, dict]]:
    rng = np.random.default_rng(1)
    good = packet([group(rng, 2, 4)])
    gb = encode(good)
    v = {}

    def mut(f):
        d = wire(good)
        f(d)
        return pack(d)

    def comp(d):
        return d["groups"][0]["completions"][0]

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
    return {k: (x[0], x[1], x[2], x[3] if len(x) > 3 else {}) for k, x in v.items()}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for f in list(OUT.glob("*.msgpack")) + list(OUT.glob("*.json")):
        f.unlink()
    rows = []
    for name, (p, note) in valid_vectors().items():
        data = encode(p)
        assert decode(data) is not None
        (OUT / f"{name}.msgpack").write_bytes(data)
        (OUT / f"{name}.json").write_text(dumps(packet_to_json(p)) + "\n", encoding="utf-8")
        rows.append((name, "valid", "-", len(data), note))
    for name, (data, code, note, extra) in invalid_vectors().items():
        (OUT / f"{name}.msgpack").write_bytes(data)
        (OUT / f"{name}.json").write_text(dumps({"error": code, "note": note, **extra}) + "\n", encoding="utf-8")
        rows.append((name, "invalid", code, len(data), note))
    cases = [{"name": n, "vocab": v, "canonical_json": json.dumps(sorted(([t, i] for t, i in v.items()), key=lambda x: x[1]),
                                                                  ensure_ascii=False, separators=(",", ":")),
              "fingerprint": tokenizer_fingerprint(v)} for n, v in FINGERPRINT_CASES.items()]
    (OUT / "tokenizer_fingerprint.json").write_text(json.dumps(cases, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    lines = ["# Test vectors", "", "Generated by `protocol/make_vectors.py`; checked by `swarm-node protocol verify`.",
             "See SPEC.md \"Test vectors\" for the file formats. `too_large` has no file vector (it needs a 16 MiB + 1 byte file).",
             "", "| name | kind | expected error | bytes | what it covers |", "|---|---|---|---|---|"]
    lines += [f"| `{n}` | {k} | {c if c == '-' else f'`{c}`'} | {b} | {note} |" for n, k, c, b, note in rows]
    lines += ["", "`tokenizer_fingerprint.json`: " + ", ".join(f"`{n}`" for n in FINGERPRINT_CASES)
              + " (vocab -> canonical JSON -> fingerprint).", ""]
    (OUT / "INDEX.md").write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {len(rows)} vectors + {len(FINGERPRINT_CASES)} fingerprint cases to {OUT}")


if __name__ == "__main__":
    main()

"""Tests for `swarm-node protocol ...` (swarm_node.commands.protocol) via typer's CliRunner, and the JSON form's reading rules."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from swarm_node.commands.protocol import default_vectors_dir, protocol_app, vocab_from_tokenizer_json
from swarm_node.wire.codec import digest, tokenizer_fingerprint
from swarm_node.wire.packet_json import first_difference, loads, same_json_form

VECTORS = Path(__file__).resolve().parent.parent / "protocol" / "vectors"
runner = CliRunner()


def run(*args):
    return runner.invoke(protocol_app, [str(a) for a in args])


def test_decode_good_prints_json_form():
    r = run("decode", VECTORS / "unicode_ids.msgpack")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == json.loads((VECTORS / "unicode_ids.json").read_text(encoding="utf-8"))


def test_decode_bad_packet_one_line_error_exit_1():
    r = run("decode", VECTORS / "bad_enum_mode.msgpack")
    assert r.exit_code == 1
    assert r.stderr.startswith("error: bad_enum: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.output and r.stdout == ""


def test_decode_vocab_size_and_missing_file(tmp_path):
    r = run("decode", VECTORS / "basic.msgpack", "--vocab-size", "10")
    assert r.exit_code == 1 and "error: token_out_of_range:" in r.stderr
    r = run("decode", tmp_path / "nope.msgpack")
    assert r.exit_code == 2 and r.stderr.startswith("error: cannot read")  # could not run: 2; packet rejected: 1


def test_encode_round_trip(tmp_path):
    out = tmp_path / "out.msgpack"
    r = run("encode", VECTORS / "several_groups.json", "-o", out)
    assert r.exit_code == 0, r.output
    data = out.read_bytes()
    assert data == (VECTORS / "several_groups.msgpack").read_bytes() and digest(data) in r.stdout
    r = run("decode", out)
    assert r.exit_code == 0 and json.loads(r.stdout) == json.loads((VECTORS / "several_groups.json").read_text(encoding="utf-8"))


def test_encode_bad_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    r = run("encode", bad, "-o", tmp_path / "x")
    assert r.exit_code == 2 and r.stderr.startswith("error: invalid JSON")
    obj = json.loads((VECTORS / "basic.json").read_text(encoding="utf-8"))
    del obj["groups"][0]["completions"][0]["reward"]
    bad.write_text(json.dumps(obj), encoding="utf-8")
    r = run("encode", bad, "-o", tmp_path / "x")
    assert r.exit_code == 1 and r.stderr.startswith("error: missing_field:")
    obj = json.loads((VECTORS / "basic.json").read_text(encoding="utf-8"))
    obj["groups"][0]["completions"][0]["logprobs"][0] = 0.5
    bad.write_text(json.dumps(obj), encoding="utf-8")
    r = run("encode", bad, "-o", tmp_path / "x")
    assert r.exit_code == 1 and r.stderr.startswith("error: bad_logprob:") and not (tmp_path / "x").exists()


def test_digest_and_fingerprint(tmp_path):
    r = run("digest", VECTORS / "basic.msgpack")
    assert r.exit_code == 0 and r.stdout.strip() == digest((VECTORS / "basic.msgpack").read_bytes())
    case = json.loads((VECTORS / "tokenizer_fingerprint.json").read_text(encoding="utf-8"))[0]
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(case["vocab"]), encoding="utf-8")
    r = run("fingerprint", vocab)
    assert r.exit_code == 0 and r.stdout.strip() == case["fingerprint"]


def test_verify_default_dir_passes():
    assert default_vectors_dir() == VECTORS
    r = run("verify")
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    rows = lines[1:-1]
    assert lines[0].split()[:3] == ["result", "check", "vector"] and len(rows) > 100
    assert all(line.startswith("PASS") for line in rows)
    assert lines[-1] == f"{len(rows)} passed, 0 failed"
    assert {line.split()[1] for line in rows} == {"decode", "encode", "fingerprint", "digest", "task"}


def test_verify_detects_corrupted_vectors(tmp_path):
    d = tmp_path / "vectors"
    shutil.copytree(VECTORS, d)
    data = bytearray((d / "basic.msgpack").read_bytes())
    data[-1] ^= 0x01  # a different reward / log-prob bit: still decodes, but no longer matches basic.json
    (d / "basic.msgpack").write_bytes(bytes(data))
    (d / "bad_enum_mode.json").write_text('{"error": "bad_logprob"}', encoding="utf-8")  # wrong expected code
    order = json.loads((d / "order_canonical_last.json").read_text(encoding="utf-8"))
    order["error"], order["acceptable"] = order["acceptable"][0], [order["error"]]  # verify is strict: acceptable is not enough
    (d / "order_canonical_last.json").write_text(json.dumps(order), encoding="utf-8")
    r = run("verify", d)
    assert r.exit_code == 1
    failed = [line.split()[1:3] for line in r.stdout.splitlines() if line.startswith("FAIL")]
    # basic: decode, encode (its .json no longer encodes to the bytes) and digest fail
    assert sorted(failed) == sorted([["decode", "basic"], ["encode", "basic"], ["digest", "basic"], ["decode", "bad_enum_mode"],
                                     ["decode", "order_canonical_last"]])
    assert r.stdout.splitlines()[-1].endswith(" passed, 5 failed")


def test_verify_empty_dir_fails(tmp_path):
    r = run("verify", tmp_path)
    assert r.exit_code == 2 and "no *.msgpack vectors" in r.stderr


def nested_json(tmp_path: Path, depth: int = 100_000) -> Path:
    path = tmp_path / "deep.json"
    path.write_text("[" * depth + "]" * depth, encoding="utf-8")
    return path


@pytest.mark.parametrize("command", ["encode", "fingerprint"])
def test_deeply_nested_json_is_one_clear_error(tmp_path, command):
    args = [command, nested_json(tmp_path)] + (["-o", tmp_path / "out.msgpack"] if command == "encode" else [])
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: invalid JSON in ") and "nests too deeply" in r.stderr and r.stderr.count("\n") == 1
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)


def test_encode_to_stdout(tmp_path):
    r = run("encode", VECTORS / "float_spellings.json", "-o", "-")
    assert r.exit_code == 0, r.output
    assert r.stdout_bytes == (VECTORS / "float_spellings.msgpack").read_bytes()
    assert r.stderr.startswith("wrote ") and digest(r.stdout_bytes) in r.stderr


def test_fingerprint_tokenizer_json_and_rejected_vocabularies(tmp_path):
    cases = {c["name"]: c for c in json.loads((VECTORS / "tokenizer_fingerprint.json").read_text(encoding="utf-8"))}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(cases["tokenizer_json_collision"]["tokenizer_json"]), encoding="utf-8")
    r = run("fingerprint", path)
    assert r.exit_code == 0 and r.stdout.strip() == cases["tokenizer_json_collision"]["fingerprint"]
    for name in ("negative_id", "lone_surrogate"):
        path.write_text(json.dumps(cases[name]["vocab"]), encoding="utf-8")
        r = run("fingerprint", path)
        assert r.exit_code == 1 and r.stderr.startswith("error: tokenizer.json: "), (name, r.output)
    path.write_text("[1, 2]", encoding="utf-8")
    assert run("fingerprint", path).exit_code == 1


# ----------------------------------------------------------------------------- tokenizer.json ids, as Hugging Face loads them

def _hf_vocab(model: dict, added: list[tuple[int, str]]) -> dict:
    tokenizers = pytest.importorskip("tokenizers")
    obj = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None, "pre_tokenizer": None,
           "post_processor": None, "decoder": None, "model": model,
           "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, c in added]}
    hf = tokenizers.Tokenizer.from_str(json.dumps(obj)).get_vocab(with_added_tokens=True)
    return hf, vocab_from_tokenizer_json(obj)


def _bpe(vocab: dict) -> dict:
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}


texts = st.sampled_from(["a", "b", "c", "ab", "<s>", "</s>", "<pad>", "<x>", "", "é"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(texts.filter(bool), st.integers(0, 12), max_size=6), st.lists(st.tuples(st.integers(0, 20), texts), max_size=6))
def test_tokenizer_json_ids_match_hugging_face(model_vocab, added):
    """SPEC.md section 5 step 1 (reference: vocab_from_tokenizer_json) equals what `tokenizers` loads, for any file."""
    hf, ours = _hf_vocab(_bpe(model_vocab), added)
    assert ours == hf
    assert tokenizer_fingerprint(ours) == tokenizer_fingerprint(hf)


def test_tokenizer_json_unigram_ids_are_indices():
    model = {"type": "Unigram", "unk_id": 0, "byte_fallback": False, "vocab": [["<unk>", 0.0], ["▁a", -1.0], ["b", -2.0]]}
    hf, ours = _hf_vocab(model, [(7, "<s>"), (0, "b")])
    assert ours == hf == {"<unk>": 0, "▁a": 1, "b": 2, "<s>": 3}


# ----------------------------------------------------------------------------- JSON form reading rules (SPEC.md section 9)

def test_json_form_numbers():
    assert str(loads("-0")) == "-0.0" and str(loads("[-0.0, 0, -0e0]")) == "[-0.0, 0, -0.0]"
    with pytest.raises(ValueError):
        loads("[NaN]")
    with pytest.raises(ValueError, match="nests too deeply"):
        loads("[" * 100_000 + "]" * 100_000)
    expected = {"round": 3, "reward": -0.0, "logprobs": [-1.0, -0.5]}
    assert same_json_form(expected, loads('{"round": 3, "reward": -0, "logprobs": [-1, -5e-1]}'))
    assert not same_json_form(expected, loads('{"round": 3, "reward": 0, "logprobs": [-1, -0.5]}'))  # the sign of zero counts
    assert not same_json_form(expected, loads('{"round": 3.0, "reward": -0.0, "logprobs": [-1, -0.5]}'))  # ints stay ints
    assert not same_json_form({"x": 1}, {"x": True})
    assert first_difference(expected, loads('{"round": 3, "reward": -0.0, "logprobs": [-1, -0.25]}')).startswith("logprobs[1]")
    assert first_difference(expected, {"round": 3, "reward": -0.0}) == "logprobs (missing)"

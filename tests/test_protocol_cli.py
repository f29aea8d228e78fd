"""Tests for `swarm-node protocol ...` (swarm_node.protocol_cli) via typer's CliRunner."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from swarm_node.codec import digest
from swarm_node.protocol_cli import default_vectors_dir, protocol_app

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
    assert r.exit_code == 1 and r.stderr.startswith("error: cannot read")


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
    assert r.exit_code == 1 and r.stderr.startswith("error: invalid JSON")
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
    assert all(line.startswith("PASS") for line in lines[:-1]) and len(lines) > 18
    assert lines[-1].startswith(f"{len(lines) - 1}/{len(lines) - 1} passed")


def test_verify_detects_corrupted_vectors(tmp_path):
    d = tmp_path / "vectors"
    shutil.copytree(VECTORS, d)
    data = bytearray((d / "basic.msgpack").read_bytes())
    data[-1] ^= 0x01  # a different reward / log-prob bit: still decodes, but no longer matches basic.json
    (d / "basic.msgpack").write_bytes(bytes(data))
    (d / "bad_enum_mode.json").write_text('{"error": "bad_logprob"}', encoding="utf-8")  # wrong expected code
    r = run("verify", d)
    assert r.exit_code == 1
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 2 and any("basic" in f for f in failed) and any("bad_enum_mode" in f for f in failed)


def test_verify_empty_dir_fails(tmp_path):
    r = run("verify", tmp_path)
    assert r.exit_code == 1 and "no *.msgpack vectors" in r.stderr

"""Tests for the conformance harness (swarm_node.wire.conformance, `swarm-node protocol conformance`)."""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from swarm_node.commands.protocol import protocol_app
from swarm_node.wire import conformance
from swarm_node.wire.conformance import Case, Outcome, judge
from swarm_node.wire.packet_json import loads

VECTORS = Path(__file__).resolve().parent.parent / "protocol" / "vectors"
PY = sys.executable
REFERENCE_DECODER = f"{PY} -m swarm_node.commands.protocol decode {{file}} --vocab-size {{vocab_size}}"  # no torch import: fast


def run(*args):
    return CliRunner().invoke(protocol_app, [str(a) for a in args])


def subset(tmp_path: Path, names: list[str]) -> Path:
    d = tmp_path / "vectors"
    d.mkdir()
    for name in names:
        for suffix in (".msgpack", ".json"):
            shutil.copy(VECTORS / f"{name}{suffix}", d)
    return d


def case(name: str) -> Case:
    expected = loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))  # `-0` is negative zero
    return Case("decode", name, VECTORS / f"{name}.msgpack", expected)


# ----------------------------------------------------------------------------- judging

def test_judge_decode_rules():
    bad = case("order_canonical_last")  # reference: bad_logprob; not_canonical acceptable
    assert judge(bad, Outcome(1, b"", b"error: bad_logprob: x\n"), strict=True)[0]
    assert judge(bad, Outcome(1, b"error: not_canonical\n", b""))[0]  # stdout works too
    assert not judge(bad, Outcome(1, b"", b"error: not_canonical\n"), strict=True)[0]  # verify is strict
    assert not judge(bad, Outcome(1, b"", b"error: bad_type\n"))[0]  # not a fault of this packet
    assert not judge(bad, Outcome(0, b"{}", b""))[0]  # accepted
    assert not judge(bad, Outcome(134, b"", b"error: bad_logprob\n"))[0]  # a crash is not a rejection
    assert not judge(bad, Outcome(1, b"", b"Traceback ...\nKeyError\n"))[0]  # no error line
    assert judge(bad, Outcome(None, b"", b"")) == (False, "timed out")
    good = case("basic")
    text = (VECTORS / "basic.json").read_bytes()
    assert judge(good, Outcome(0, text, b""))[0]
    compact = json.dumps(json.loads(text), separators=(",", ":")).encode()  # whitespace is free
    assert judge(good, Outcome(0, compact, b""))[0]
    obj = json.loads(text)
    obj["groups"][0]["completions"][1]["reward"] = 0.0
    passed, detail = judge(good, Outcome(0, json.dumps(obj).encode(), b""))
    assert not passed and "groups[0].completions[1].reward" in detail
    assert not judge(good, Outcome(0, b"not json", b""))[0]
    assert not judge(good, Outcome(1, b"", b"error: bad_type\n"))[0]


def test_judge_float_spellings_and_negative_zero():
    c = case("float_spellings")  # its .json writes -0, 1, 1e16
    python_spelling = json.dumps(loads((VECTORS / "float_spellings.json").read_text(encoding="utf-8"))).encode()
    assert b'"reward": -0.0' in python_spelling and b"1e+16" in python_spelling
    assert judge(c, Outcome(0, python_spelling, b""))[0]  # other spellings, same values
    js_like = (VECTORS / "float_spellings.json").read_bytes().replace(b'"reward": -0', b'"reward": 0')  # JSON.stringify(-0)
    assert not judge(c, Outcome(0, js_like, b""))[0]


def test_judge_encode_and_fingerprint():
    data = (VECTORS / "basic.msgpack").read_bytes()
    enc = Case("encode", "basic", VECTORS / "basic.json", data)
    assert judge(enc, Outcome(0, data, b""))[0]
    passed, detail = judge(enc, Outcome(0, data[:-1] + bytes([data[-1] ^ 1]), b""))
    assert not passed and f"first difference at byte {len(data) - 1}" in detail
    fp = Case("fingerprint", "tiny", Path("x.json"), "sha256:" + "a" * 64)
    assert judge(fp, Outcome(0, b"sha256:" + b"a" * 64 + b"\n", b""))[0]
    assert not judge(fp, Outcome(0, b"sha256:" + b"b" * 64, b""))[0]
    rejected = Case("fingerprint", "negative_id", Path("x.json"), None)
    assert judge(rejected, Outcome(1, b"", b"error: negative id\n"))[0]
    assert not judge(rejected, Outcome(0, b"sha256:" + b"a" * 64, b""))[0]


# ----------------------------------------------------------------------------- external commands

def test_harness_passes_a_correct_decoder(tmp_path):
    d = subset(tmp_path, ["basic", "bad_enum_mode", "order_canonical_last", "token_out_of_range"])
    r = run("conformance", "--impl", REFERENCE_DECODER, "--vectors", d)
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "5 passed, 0 failed"  # 4 vectors + the generated too_large packet
    assert any("too_large (generated)" in line for line in lines)


def test_harness_reports_each_failure(tmp_path):
    d = subset(tmp_path, ["basic", "bad_enum_mode", "token_out_of_range"])
    stub = tmp_path / "stub.py"  # a decoder that rejects everything with the wrong code
    stub.write_text("import sys\nprint('error: bad_type: always')\nsys.exit(1)\n", encoding="utf-8")
    r = run("conformance", "--impl", f"{PY} {stub} {{file}}", "--vectors", d)
    assert r.exit_code == 1
    rows = {line.split()[2]: line for line in r.stdout.splitlines()[1:-1]}
    assert all(row.startswith("FAIL") for row in rows.values()) and len(rows) == 4
    assert "expected bad_enum" in rows["bad_enum_mode"] and "expected a valid packet" in rows["basic"]
    assert r.stdout.splitlines()[-1] == "0 passed, 4 failed"


def test_harness_passes_vocab_size_only_when_asked(tmp_path):
    d = subset(tmp_path, ["token_out_of_range"])
    without = REFERENCE_DECODER.replace(" --vocab-size {vocab_size}", "")
    r = run("conformance", "--impl", without, "--vectors", d)
    assert r.exit_code == 1 and "accepted (expected token_out_of_range)" in r.stdout


def test_harness_kills_a_hanging_decoder(tmp_path):
    d = subset(tmp_path, ["basic"])
    start = time.monotonic()
    r = run("conformance", "--impl", f"{PY} -c 'import time; time.sleep(60)' {{file}}", "--vectors", d, "--timeout", "1")
    assert r.exit_code == 1 and r.stdout.count("timed out") == 2
    assert time.monotonic() - start < 30


def test_harness_needs_vectors(tmp_path):
    r = run("conformance", "--impl", "true", "--vectors", tmp_path)
    assert r.exit_code == 2 and r.stderr.startswith("error: no *.msgpack vectors")


@pytest.mark.slow
def test_harness_passes_our_own_codec_run_as_external_commands():
    """The reference decoder run as a third party would (`python -m swarm_node protocol decode`), plus encoder and fingerprint."""
    r = run("conformance", "--impl", f"{PY} -m swarm_node protocol decode {{file}} --vocab-size {{vocab_size}}",
            "--encoder", f"{PY} -m swarm_node.commands.protocol encode {{file}} -o -",
            "--fingerprint", f"{PY} -m swarm_node.commands.protocol fingerprint {{file}}", "--timeout", "120")
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    n_vectors = len(list(VECTORS.glob("*.msgpack")))
    n_valid = len(json.loads((VECTORS / "digests.json").read_text(encoding="utf-8")))
    n_fingerprints = len(json.loads((VECTORS / "tokenizer_fingerprint.json").read_text(encoding="utf-8")))
    total = n_vectors + 1 + n_valid + n_fingerprints
    assert lines[-1] == f"{total} passed, 0 failed"
    assert {line.split()[1] for line in lines[1:-1]} == {"decode", "encode", "fingerprint"}


def test_external_runner_fills_in_file_and_vocab_size(tmp_path):
    weird = tmp_path / "a b'c.msgpack"  # shell-quoted
    weird.write_bytes(b"x")
    out = conformance.external_runner(f"{PY} -c 'import sys; print(sys.argv[1:])' {{file}} {{vocab_size}}", 30)(
        Case("decode", "x", weird, {}, 1000))
    assert out.status == 0 and out.stdout.decode().strip() == str([str(weird), "1000"])

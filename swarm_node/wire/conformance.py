"""Conformance harness: check any implementation of protocol/SPEC.md against the golden vectors.

    swarm-node protocol conformance --impl "node decode.js {file} {vocab_size}" \\
        [--encoder "node encode.js {file}"] [--fingerprint "node fingerprint.js {file}"]

Every check is a `Case` (one vector file and what must come out of it). A runner turns a case
into an `Outcome` (exit status, stdout, stderr) and `judge` compares that with the expectation.
`swarm-node protocol verify` runs the same cases through the reference codec in-process (strict:
the reference must give each vector's own error code); `conformance` runs them through external
commands that follow the convention of SPEC.md section 10.1:

    decoder      {file} a packet, {vocab_size} a vocabulary size (2^32 when the vector has none)
                 -> exit 0, the JSON form on stdout; or exit 1, a line `error: <code>` on stderr or stdout
    encoder      {file} a packet's JSON form -> exit 0, the canonical bytes on stdout
    fingerprint  {file} a {token: id} object or a tokenizer.json -> exit 0, `sha256:<hex>` on stdout;
                 or exit 1 and `error: ...` for a vocabulary that has no fingerprint
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from swarm_node.wire.codec import MAX_PACKET_BYTES
from swarm_node.wire.packet_json import first_difference, loads, same_json_form

NO_VOCAB_CHECK = 2**32  # every uint32 token id is below it: no token_out_of_range check
_ERROR_LINE = re.compile(r"^error:[ \t]*([^\s:]*)", re.MULTILINE)  # the code is the first word after "error:"


@dataclass
class Case:
    check: str  # "decode" | "encode" | "fingerprint" | "digest"
    name: str  # vector name
    file: Path  # what the implementation is given
    expected: object  # decode: JSON form or {"error", ...}; encode: bytes; fingerprint/digest: "sha256:..." (None: rejected)
    vocab_size: int = NO_VOCAB_CHECK


@dataclass
class Outcome:
    status: int | None  # exit status; None when it ran out of time
    stdout: bytes
    stderr: bytes


@dataclass
class Result:
    case: Case
    passed: bool
    detail: str


Runner = Callable[[Case], Outcome]


# ----------------------------------------------------------------------------- cases

def decode_cases(directory: Path, work: Path) -> list[Case]:
    """One case per NAME.msgpack (+ NAME.json), plus a generated 16 MiB + 1 byte packet (too_large)."""
    cases = []
    for path in sorted(directory.glob("*.msgpack")):
        expected = loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        vocab = expected.get("vocab_size", NO_VOCAB_CHECK) if isinstance(expected, dict) and "error" in expected else NO_VOCAB_CHECK
        cases.append(Case("decode", path.stem, path, expected, vocab))
    valid = [c for c in cases if "error" not in c.expected]
    if valid:  # a valid packet padded past the limit: a decoder that parses before checking the size says trailing_bytes
        big = work / "too_large.msgpack"
        with open(big, "wb") as f:
            f.write(valid[0].file.read_bytes())
            f.truncate(MAX_PACKET_BYTES + 1)
        cases.append(Case("decode", "too_large (generated)", big,
                          {"error": "too_large", "note": "a valid packet followed by zeros, 16 MiB + 1 byte in all"}))
    return cases


def encode_cases(directory: Path) -> list[Case]:
    """One case per valid vector: its JSON form must encode to exactly its .msgpack bytes."""
    cases = []
    for path in sorted(directory.glob("*.msgpack")):
        expected = loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        if "error" not in expected:
            cases.append(Case("encode", path.stem, path.with_suffix(".json"), path.read_bytes()))
    return cases


def fingerprint_cases(directory: Path, work: Path) -> list[Case]:
    """One case per entry of tokenizer_fingerprint.json, written to its own input file."""
    path = directory / "tokenizer_fingerprint.json"
    if not path.is_file():
        return []
    cases = []
    for entry in json.loads(path.read_text(encoding="utf-8")):
        source = entry["tokenizer_json"] if "tokenizer_json" in entry else entry["vocab"]
        file = work / f"fingerprint_{entry['name']}.json"
        file.write_text(json.dumps(source, ensure_ascii=True), encoding="ascii")  # \ud800 escapes survive
        cases.append(Case("fingerprint", entry["name"], file, entry.get("fingerprint")))
    return cases


def digest_cases(directory: Path) -> list[Case]:
    path = directory / "digests.json"
    if not path.is_file():
        return []
    return [Case("digest", name, directory / f"{name}.msgpack", d) for name, d in json.loads(path.read_text(encoding="utf-8")).items()]


# ----------------------------------------------------------------------------- judging

def error_code(out: Outcome) -> str | None:
    """The first word of the first `error: <code>[: message]` line, looked for on stderr, then stdout ("" if none follows)."""
    for stream in (out.stderr, out.stdout):
        match = _ERROR_LINE.search(stream.decode("utf-8", "replace"))
        if match:
            return match.group(1)
    return None


def _judge_decode(case: Case, out: Outcome, strict: bool) -> tuple[bool, str]:
    expected = case.expected
    if "error" in expected:
        if out.status == 0:
            return False, f"accepted (expected {expected['error']})"
        code = error_code(out)
        if out.status != 1 or code is None:
            return False, f"exit {out.status} without an `error: <code>` line (expected {expected['error']})"
        if code == expected["error"]:
            return True, code
        if not strict and code in expected.get("acceptable", ()):
            return True, f"{code} (acceptable; the reference gives {expected['error']})"
        return False, f"{code} (expected {expected['error']})"
    if out.status != 0:
        return False, f"exit {out.status}: {error_code(out) or 'no error line'} (expected a valid packet)"
    try:
        got = loads(out.stdout.decode("utf-8"))
    except ValueError as e:
        return False, f"stdout is not JSON: {e}"
    if not same_json_form(expected, got):
        return False, f"JSON form differs at {first_difference(expected, got)}"
    return True, "valid, same JSON form"


def judge(case: Case, out: Outcome, strict: bool = False) -> tuple[bool, str]:
    """(passed, detail) for one case; `strict`: only the vector's own error code passes."""
    if out.status is None:
        return False, "timed out"
    if case.check == "decode":
        return _judge_decode(case, out, strict)
    if case.check == "encode":
        if out.status != 0:
            return False, f"exit {out.status}: {error_code(out) or 'no error line'}"
        if out.stdout != case.expected:
            at = next((i for i, (a, b) in enumerate(zip(out.stdout, case.expected)) if a != b), min(len(out.stdout), len(case.expected)))
            return False, f"{len(out.stdout)} bytes, first difference at byte {at} (expected {len(case.expected)} bytes)"
        return True, f"same {len(out.stdout)} bytes"
    if case.expected is None:  # a vocabulary without fingerprint
        ok = out.status == 1 and error_code(out) is not None
        return ok, "rejected" if ok else f"exit {out.status} without an `error:` line (expected a rejection)"
    got = out.stdout.decode("utf-8", "replace").strip()
    return (out.status == 0 and got == case.expected), got if got == case.expected else f"{got[:80]!r} (expected {case.expected})"


# ----------------------------------------------------------------------------- running

def external_runner(template: str, timeout_s: float) -> Runner:
    """Run `template` through the shell with {file} and {vocab_size} filled in; kill it (and its children) at the timeout."""
    def run(case: Case) -> Outcome:
        command = template.replace("{file}", shlex.quote(str(case.file))).replace("{vocab_size}", str(case.vocab_size))
        proc = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Outcome(None, b"", b"")
        return Outcome(proc.returncode, stdout, stderr)
    return run


def run_cases(cases: list[Case], runners: dict[str, Runner], jobs: int = 2, strict: bool = False) -> list[Result]:
    """Judge every case whose check has a runner, `jobs` at a time, in the order given."""
    todo = [c for c in cases if c.check in runners]

    def one(case: Case) -> Result:
        return Result(case, *judge(case, runners[case.check](case), strict))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, todo))


def report(results: list[Result]) -> list[str]:
    """A table, one line per case, then the summary line `N passed, M failed`."""
    width = max((len(r.case.name) for r in results), default=4)
    lines = [f"{'result':<6}  {'check':<11}  {'vector':<{width}}  detail"]
    lines += [f"{'PASS' if r.passed else 'FAIL':<6}  {r.case.check:<11}  {r.case.name:<{width}}  {r.detail}" for r in results]
    failed = sum(not r.passed for r in results)
    return lines + [f"{len(results) - failed} passed, {failed} failed"]

"""`swarm-node protocol ...`: tools to inspect, produce and check rollout packets.

    swarm-node protocol decode PACKET.msgpack [--vocab-size N]   # -> JSON form on stdout
    swarm-node protocol encode PACKET.json -o PACKET.msgpack      # JSON form -> canonical msgpack
    swarm-node protocol verify [DIR]                              # run the golden vectors
    swarm-node protocol digest PACKET.msgpack                     # sha256:<hex> content address
    swarm-node protocol fingerprint VOCAB.json|TOKENIZER          # tokenizer fingerprint

A bad packet prints `error: <code>: <message>` on stderr and exits 1 (no traceback).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarm_node.codec import MAX_PACKET_BYTES, PacketError, decode, digest, encode, tokenizer_fingerprint
from swarm_node.packet_json import dumps, packet_from_json, packet_to_json

protocol_app = typer.Typer(help="Rollout packet wire protocol: decode, encode, digest and verify against protocol/vectors.",
                           no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _read_packet_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_PACKET_BYTES + 1)  # bounded: decode() reports too_large
    except OSError as e:
        raise _fail(f"cannot read {path}: {e.strerror or e}") from None


def _load_json(path: Path):
    def no_constants(name):
        raise ValueError(f"JSON constant {name} is not allowed")
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=no_constants)
    except OSError as e:
        raise _fail(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:  # JSONDecodeError, bad UTF-8, NaN/Infinity
        raise _fail(f"invalid JSON in {path}: {e}") from None


@protocol_app.command("decode")
def decode_cmd(file: Annotated[Path, typer.Argument(help="Packet bytes (.msgpack).")],
               vocab_size: Annotated[Optional[int], typer.Option(min=1, help="Also check token ids < N.")] = None):
    """Decode and validate a packet; print its JSON form."""
    try:
        packet = decode(_read_packet_file(file), vocab_size=vocab_size)
    except PacketError as e:
        raise _fail(f"{e.code}: {e.message}") from None
    typer.echo(dumps(packet_to_json(packet)))


@protocol_app.command("encode")
def encode_cmd(file: Annotated[Path, typer.Argument(help="Packet in JSON form (see protocol/SPEC.md).")],
               out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the canonical msgpack.")]):
    """Encode a JSON-form packet to canonical msgpack; print its digest."""
    try:
        data = encode(packet_from_json(_load_json(file)))
    except PacketError as e:
        raise _fail(f"{e.code}: {e.message}") from None
    try:
        out.write_bytes(data)
    except OSError as e:
        raise _fail(f"cannot write {out}: {e.strerror or e}") from None
    typer.echo(f"wrote {len(data)} bytes to {out} ({digest(data)})")


@protocol_app.command("digest")
def digest_cmd(file: Annotated[Path, typer.Argument(help="Packet bytes (.msgpack).")]):
    """Print the content digest of a valid packet."""
    data = _read_packet_file(file)
    try:
        decode(data)
    except PacketError as e:
        raise _fail(f"{e.code}: {e.message}") from None
    typer.echo(digest(data))


@protocol_app.command("fingerprint")
def fingerprint_cmd(source: Annotated[str, typer.Argument(help="A {token: id} JSON file, or a tokenizer name/path for transformers.")]):
    """Print the tokenizer fingerprint (protocol/SPEC.md "Tokenizer fingerprint")."""
    path = Path(source)
    if path.is_file() and path.suffix == ".json":
        vocab = _load_json(path)
        if not (isinstance(vocab, dict) and all(type(i) is int for i in vocab.values())):
            raise _fail(f"{path} is not a flat {{token: id}} JSON object")
    else:
        try:
            from transformers import AutoTokenizer
            vocab = AutoTokenizer.from_pretrained(source).get_vocab()
        except Exception as e:  # any load failure is a user error here
            raise _fail(f"cannot load tokenizer {source!r}: {e}") from None
    typer.echo(tokenizer_fingerprint(vocab))


def default_vectors_dir() -> Path:
    """protocol/vectors of the source checkout this package lives in, else ./protocol/vectors."""
    repo = Path(__file__).resolve().parent.parent / "protocol" / "vectors"
    return repo if repo.is_dir() else Path.cwd() / "protocol" / "vectors"


def check_vector(msgpack_path: Path) -> tuple[bool, str]:
    """Run one vector: (passed, detail)."""
    json_path = msgpack_path.with_suffix(".json")
    if not json_path.is_file():
        return False, f"missing {json_path.name}"
    try:
        expected = json.loads(json_path.read_text(encoding="utf-8"))
    except ValueError as e:
        return False, f"bad JSON: {e}"
    data = msgpack_path.read_bytes()
    if isinstance(expected, dict) and "error" in expected:
        try:
            decode(data, vocab_size=expected.get("vocab_size"))
        except PacketError as e:
            return (e.code == expected["error"]), f"{e.code}" + ("" if e.code == expected["error"] else f" (expected {expected['error']}: {e.message})")
        except Exception as e:  # a codec that leaks other exceptions fails the vector
            return False, f"raised {type(e).__name__}: {e} (expected {expected['error']})"
        return False, f"decoded fine (expected {expected['error']})"
    try:
        got = packet_to_json(decode(data))
    except PacketError as e:
        return False, f"{e.code}: {e.message} (expected a valid packet)"
    if got != expected:
        return False, "decoded JSON form differs from the .json file"
    try:
        reencoded = encode(packet_from_json(expected))
    except PacketError as e:
        return False, f"encoding the .json failed: {e.code}: {e.message}"
    if reencoded != data:
        return False, "encode(.json) differs from the .msgpack bytes"
    return True, f"valid, {len(data)} bytes"


def check_fingerprints(path: Path) -> list[tuple[str, bool, str]]:
    results = []
    for case in json.loads(path.read_text(encoding="utf-8")):
        got = tokenizer_fingerprint(case["vocab"])
        results.append((f"fingerprint:{case['name']}", got == case["fingerprint"], got))
    return results


@protocol_app.command("verify")
def verify_cmd(directory: Annotated[Optional[Path], typer.Argument(help="Vectors directory (default: protocol/vectors).")] = None):
    """Check the codec against every vector in DIR; exit 0 only if all pass."""
    directory = directory or default_vectors_dir()
    files = sorted(directory.glob("*.msgpack")) if directory.is_dir() else []
    if not files:
        raise _fail(f"no *.msgpack vectors in {directory}")
    results = [(f.stem, *check_vector(f)) for f in files]
    fp = directory / "tokenizer_fingerprint.json"
    if fp.is_file():
        try:
            results += check_fingerprints(fp)
        except (ValueError, KeyError, TypeError) as e:
            results.append(("fingerprint", False, f"malformed {fp.name}: {e}"))
    for name, ok, detail in results:
        typer.echo(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    failed = sum(not ok for _, ok, _ in results)
    typer.echo(f"{len(results) - failed}/{len(results)} passed ({directory})")
    if failed:
        raise typer.Exit(1)

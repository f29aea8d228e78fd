"""A hostile process that makes a libp2p node sign for free: the handshake flood (red team 26, session 36).

Each attempt opens a TCP connection to the node, selects `/noise` and sends one Noise XX first
message (32 random bytes, built once: no crypto on this side), reads the node's second message (two
X25519 products and a signature of its identity key on the node's side), and closes. See
net/firewall.py for what it costs and the limit that stops it.

    python -m swarm_node.harness.handshake_flood --host 127.0.0.1 --port 4001 --seconds 10

Prints one JSON line: attempts made, attempts the node answered within --timeout, seconds. An attempt the node
answers late (busy) still cost it the handshake: its CPU, not `answered`, is the flood's price.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import time

from swarm_node.net.identity import uvarint

ANSWER_BYTES = 96  # a Noise second message is 32 + 48 + a signed payload: this much proves the node answered


def _line(protocol: str) -> bytes:
    data = (protocol + "\n").encode()
    return uvarint(len(data)) + data


HELLO = _line("/multistream/1.0.0") + _line("/noise") + struct.pack(">H", 32) + os.urandom(32)


async def attempt(host: str, port: int, timeout_s: float) -> bool:
    """One half handshake; True if the node answered with its second Noise message within `timeout_s`."""
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(HELLO)
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


async def flood(host: str, port: int, seconds: float, concurrency: int, timeout_s: float, interval_s: float = 0.0) -> dict:
    """Attempts from `concurrency` loops for `seconds`, each loop waiting `interval_s` between its attempts."""
    tried = answered = 0
    deadline = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal tried, answered
        while time.monotonic() < deadline:
            tried += 1
            answered += await attempt(host, port, min(timeout_s, max(0.05, deadline - time.monotonic())))
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
    args = ap.parse_args()
    print(json.dumps(asyncio.run(flood(args.host, args.port, args.seconds, args.concurrency, args.timeout, args.interval))),
          flush=True)


if __name__ == "__main__":
    main()

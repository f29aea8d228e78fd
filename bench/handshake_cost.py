"""What a stranger's connection costs a node's p2pd, by security protocol: half and full handshakes (issue 27).

Red team 26 found that each inbound connection made p2pd sign a Noise handshake with the node's identity
key, RSA-2048, for 32 bytes the stranger sends without any crypto of its own; red team 29 that a TLS 1.3
ClientHello offering only P-521 costs p2pd more still (Go 1.20's P-521 is slow). A stranger picks the handshake
that costs the node most, so a node offers one. This measures, on a bare p2pd with an RSA identity (as a node
has), p2pd's CPU per try for each of `harness/handshake_flood.py`'s first messages (built once and replayed,
read the answer, close) and for a full connection (a hivemind P2P client with default flags connects, then is
disconnected), against three daemons:

    noise+tls  hivemind's flags (a node before session 37)
    tls        TLS only (`-noise=0`, a node for one commit of session 37)
    node       what a node runs now (`net/hivemind_internals.NodeP2P`: Noise only)

Tries run one after another, so the p2pd under test is the only busy process besides this one.

    .venv/bin/python bench/handshake_cost.py                   # ~4 min (3 repeats)
    .venv/bin/python bench/handshake_cost.py --tries 100 --repeats 1 --results /tmp/x.json

Results go to bench/results/handshake_cost.json.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine_info, print_table, process_cpu_s as cpu_s, write_results  # noqa: E402
from swarm_node.harness.handshake_flood import HELLOS, attempt  # noqa: E402

DAEMONS = {"noise+tls": None, "tls": {"noise": False}, "node": "NodeP2P"}  # extra p2pd flags, or a node's own


async def measure(flags: dict | str | None, tries: int, full_tries: int, key_file: str) -> list[dict]:
    from hivemind.p2p import P2P

    from swarm_node.net.hivemind_internals import NodeP2P

    class Daemon(P2P):
        @staticmethod
        def _make_process_args(*args, **kwargs) -> list[str]:
            return P2P._make_process_args(*args, **{**kwargs, **flags})

    kind = NodeP2P if flags == "NodeP2P" else Daemon if flags else P2P
    node = await kind.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key_file, check_if_identity_free=False)
    client = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], dht_mode="client")
    try:
        addrs = [m.decapsulate(f"/p2p/{node.peer_id}") for m in await node.get_visible_maddrs()]
        port = int(str(addrs[0]).split("/tcp/")[1].split("/")[0])
        pid = node._child.pid
        await asyncio.sleep(1.0)
        rows = []
        for security in sorted(HELLOS):
            hello = HELLOS[security]()
            cpu0, t0, answered = cpu_s(pid), time.perf_counter(), 0
            for _ in range(tries):
                answered += await attempt("127.0.0.1", port, 2.0, hello)
            rows.append({"try": f"half {security}", "tries": tries, "answered": answered,
                         "p2pd_ms": 1000 * (cpu_s(pid) - cpu0) / tries, "wall_ms": 1000 * (time.perf_counter() - t0) / tries})
        cpu0, t0 = cpu_s(pid), time.perf_counter()
        for _ in range(full_tries):
            await client._client.connect(node.peer_id, addrs)
            await client._client.disconnect(node.peer_id)
        rows.append({"try": "full", "tries": full_tries, "answered": full_tries,
                     "p2pd_ms": 1000 * (cpu_s(pid) - cpu0) / full_tries,
                     "wall_ms": 1000 * (time.perf_counter() - t0) / full_tries})
        return rows
    finally:
        await client.shutdown()
        await node.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=600, help="half handshakes of each kind")
    ap.add_argument("--full-tries", type=int, default=100, help="full connections")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every daemon and try, for the spread")
    ap.add_argument("--results", default=None)
    args = ap.parse_args()
    started, info = time.time(), machine_info()
    from swarm_node.net.identity import load_or_create_identity
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        key_file = os.path.join(tmp, "id.key")
        Path(key_file).write_bytes(load_or_create_identity(None)[1])  # RSA-2048, as a node's
        for run in range(args.repeats):
            for name, flags in DAEMONS.items():
                rows = asyncio.run(measure(flags, args.tries, args.full_tries, key_file))
                results += [{"run": run, "daemon": name, **row} for row in rows]
    print_table("p2pd CPU per try (RSA-2048 identity)", ["run", "daemon", "try", "answered", "p2pd ms", "wall ms"],
                [[r["run"], r["daemon"], r["try"], f"{r['answered']}/{r['tries']}", r["p2pd_ms"], r["wall_ms"]]
                 for r in results])
    print(f"results: {write_results('handshake_cost', results, args, info, started, args.results)}")


if __name__ == "__main__":
    main()

"""What one refused libp2p stream costs the node it is sent to, split between p2pd and our Python (issue 27's flood).

A flooding peer is graylisted within a second (`scores.PeerLimiter`), and every stream it opens after that is closed
before anything is read. What it still costs is the transport's work before our code decides: p2pd accepts the
stream, negotiates its protocol, dials our handler's unix socket, and hivemind's handler reads the stream's header.
This measures that per stream, for the ways a node could be reached:

    stream        a stream handler that closes at once (what a graylisted id's announcement stream meets today)
    unregistered  no handler for the protocol: p2pd refuses in multistream-select, our Python never sees it
    unary         a unary handler over p2pd's persistent connection, raising at once

The victim is a bare hivemind P2P with an RSA identity (as a node has); the attacker, pinned to the last core,
opens streams in --loops concurrent loops for --seconds. --gogc sets the victim p2pd's GOGC (Go's GC target).

    .venv/bin/python bench/stream_cost.py --modes stream unregistered unary --gogc 100 400   # ~3 min
    .venv/bin/python bench/stream_cost.py --quick --results /tmp/x.json                         # smoke run

Results append to bench/results/stream_cost.json (one row per mode and GOGC).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import process_cpu_s as cpu_s  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "stream_cost.json"
PROTO = "/swarm-node/bench-stream-cost/1"


def rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


async def victim(mode: str, seconds: float, addr_file: Path) -> dict:
    from hivemind.p2p import P2P

    from swarm_node.net.identity import load_or_create_identity
    key_file = addr_file.with_suffix(".key")
    key_file.write_bytes(load_or_create_identity(None)[1])
    p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=str(key_file))
    handled = [0]

    async def close_at_once(info, reader, writer):
        handled[0] += 1
        writer.close()

    async def refuse(request: bytes, remote) -> bytes:
        handled[0] += 1
        raise ValueError("refused")

    if mode == "stream":
        await p2p.add_binary_stream_handler(PROTO, close_at_once)
    elif mode == "unary":
        await p2p._client.add_unary_handler(PROTO, refuse)
    addr_file.write_text(str((await p2p.get_visible_maddrs())[0]))
    pid = p2p._child.pid
    while not addr_file.with_suffix(".go").exists():
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # the attacker's loops are running
    py0, d0, t0 = time.process_time(), cpu_s(pid), time.time()
    await asyncio.sleep(seconds)
    py1, d1, t1 = time.process_time(), cpu_s(pid), time.time()
    out = {"python_cores": (py1 - py0) / (t1 - t0), "p2pd_cores": (d1 - d0) / (t1 - t0), "p2pd_rss_mb": rss_mb(pid),
           "handled": handled[0]}
    await p2p.shutdown()
    return out


async def attacker(target: str, seconds: float, loops: int, mode: str, go: Path) -> dict:
    from hivemind.p2p import P2P, PeerID
    from hivemind.utils.multiaddr import Multiaddr
    p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    maddr = Multiaddr(target)
    peer = PeerID.from_base58(maddr["p2p"])
    await p2p._client.connect(peer, [maddr.decapsulate(Multiaddr(f"/p2p/{maddr['p2p']}"))])
    while not go.exists():
        await asyncio.sleep(0.05)
    tries, end = [0], time.time() + seconds

    async def loop() -> None:
        while time.time() < end:
            tries[0] += 1
            try:
                if mode == "unary":
                    await p2p._client.call_unary_handler(peer, PROTO, b"x")
                else:
                    _, reader, writer = await p2p._client.stream_open(peer, (PROTO,))
                    await reader.read(1)
                    writer.close()
            except Exception:
                pass  # refused: what the victim does; the next try follows at once

    await asyncio.gather(*[loop() for _ in range(loops)])
    await p2p.shutdown()
    return {"tries": tries[0]}


def trial(mode: str, gogc: int, seconds: float, loops: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="stream-cost-"))
    addr_file, out_file = tmp / "victim.addr", tmp / "victim.json"
    env = {**os.environ, "GOGC": str(gogc)}
    me = [sys.executable, str(Path(__file__).resolve())]
    v = subprocess.Popen([*me, "--role", "victim", "--modes", mode, "--seconds", str(seconds), "--file", str(addr_file),
                          "--out", str(out_file)], env=env, cwd=ROOT)
    for _ in range(600):
        if addr_file.exists() and addr_file.read_text():
            break
        time.sleep(0.1)
    last = str((os.cpu_count() or 1) - 1)
    a = subprocess.Popen(["taskset", "-c", last, *me, "--role", "attacker", "--modes", mode, "--seconds",
                          str(seconds + 2), "--loops", str(loops), "--file", addr_file.read_text(), "--out",
                          str(tmp / "attacker.json"), "--go", str(addr_file.with_suffix(".go"))], cwd=ROOT)
    time.sleep(3.0)  # the attacker's host is up and connected
    addr_file.with_suffix(".go").touch()
    v.wait(seconds + 120)
    a.wait(seconds + 120)
    res = {**json.loads(out_file.read_text()), **json.loads((tmp / "attacker.json").read_text())}
    # streams in the victim's window: those its handler saw; unregistered, the attacker's tries (steady rate)
    per = max(1, res["handled"] if mode != "unregistered" else res["tries"] * seconds / (seconds + 2))
    return {"mode": mode, "gogc": gogc, "seconds": seconds, "loops": loops, **res,
            "python_us_per_stream": round(1e6 * res["python_cores"] * seconds / per, 1),
            "p2pd_us_per_stream": round(1e6 * res["p2pd_cores"] * seconds / per, 1),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", default=["stream", "unregistered", "unary"],
                    choices=["stream", "unregistered", "unary"])
    ap.add_argument("--gogc", nargs="+", type=int, default=[100])
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--loops", type=int, default=16)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--quick", action="store_true", help="smoke run: one trial of 4 s per mode")
    ap.add_argument("--role", choices=["bench", "victim", "attacker"], default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--go", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role != "bench":
        run = (victim(args.modes[0], args.seconds, Path(args.file)) if args.role == "victim" else
               attacker(args.file, args.seconds, args.loops, args.modes[0], Path(args.go)))
        Path(args.out).write_text(json.dumps(asyncio.run(run)))
        return 0
    path = Path(args.results)
    if args.quick:
        args.trials, args.seconds = 1, 4.0
    for _ in range(args.trials):  # modes and GOGC values alternate: each sees the same background load
        for gogc in args.gogc:
            for mode in args.modes:
                row = trial(mode, gogc, args.seconds, args.loops)
                print(json.dumps({k: row[k] for k in ("mode", "gogc", "python_us_per_stream", "p2pd_us_per_stream",
                                                       "p2pd_rss_mb", "handled", "tries")}), flush=True)
                old = json.loads(path.read_text())["runs"] if path.exists() else []
                path.write_text(json.dumps({"runs": old + [row]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

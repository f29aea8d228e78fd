"""Benchmark 4 — transport scale: discovery v1 ("dht-key") and v2 ("push") side by side, N = 4 .. 32 nodes.

Transport-only nodes on 127.0.0.1, no models: each node is a `HivemindTransport` with its own p2pd;
a worker process hosts up to --per-proc of them (one thread each) so that N = 32 fits on 2 cores.
All nodes bootstrap from node 0. Rounds run on a shared wall clock: at the start of round r every
node offers a synthetic packet of realistic size (2 prompts x 12 completions x ~200 tokens, built
by the real codec), then `collect`s round r's packets with min_peers = k (the node default, 1)
until they arrived or the round deadline passed. For each N and design we report, per node and
steady-state round (rounds 2+):

  discovery msgs   messages the node sent + received to find offers: DHT RPC requests and responses
                   (client and server side, counted at hivemind's protobuf handlers) and announcement
                   frames (v2)
  discovery bytes  their bytes (protobuf / msgpack frame sizes, no libp2p framing)
  non-payload TCP  everything the node's p2pd sent + received over TCP (kernel tcp_info via `ss`)
                   minus packet bytes: discovery + libp2p/yamux/noise overhead
  delivered        node-rounds that got >= min(k, N-1) packets of the round within the deadline
  latency          receiver's fetch completion - sender's offer, p50 / p95 over delivered packets

Every worker and p2pd is checked gone at the end (psutil), and killed by pid if not.

    .venv/bin/python bench/scale.py                 # N = 4 8 16 32, both designs (~10 min on 2 cores)
    .venv/bin/python bench/scale.py --quick         # N = 4 8, 3 rounds
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402

DESIGNS = ("dht-key", "push")
_SS_PID = re.compile(r"pid=(\d+)")
_SS_SENT = re.compile(r"bytes_acked:(\d+)")
_SS_RECV = re.compile(r"bytes_received:(\d+)")


def tcp_bytes(pids: list[int]) -> dict[int, tuple[int, int]]:
    """pid -> (bytes acked out, bytes received) summed over its TCP sockets (one `ss -tinpH` call)."""
    out = {pid: (0, 0) for pid in pids}
    try:
        text = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return out
    owner = None
    for line in text.splitlines():
        if line and not line[0].isspace():  # a socket line; its tcp_info may follow on indented lines
            owner = next((int(p) for p in _SS_PID.findall(line) if int(p) in out), None)
        if owner is not None:
            m1, m2 = _SS_SENT.search(line), _SS_RECV.search(line)
            sent, recv = out[owner]
            out[owner] = (sent + (int(m1.group(1)) if m1 else 0), recv + (int(m2.group(1)) if m2 else 0))
    return out


def cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


# ------------------------------------------------------------------------------------------ worker
def count_discovery_messages() -> dict[int, Counter]:
    """Count DHT RPCs per P2P instance (id) at hivemind's protobuf layer: client calls and served requests."""
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.p2p import P2P

    counters: dict[int, Counter] = {}
    call = P2P._call_unary_protobuf_handler

    async def counted_call(self, peer_id, name, request, output_type):
        c = counters.setdefault(id(self), Counter())
        c["msgs"] += 1
        c["bytes"] += request.ByteSize()
        response = await call(self, peer_id, name, request, output_type)
        c["msgs"] += 1
        c["bytes"] += response.ByteSize()
        return response
    P2P._call_unary_protobuf_handler = counted_call

    def served(method):
        @functools.wraps(method)  # hivemind reads the handler's type hints
        async def wrapper(self, request, context):
            response = await method(self, request, context)
            c = counters.setdefault(id(self.p2p), Counter())
            c["msgs"] += 2
            c["bytes"] += request.ByteSize() + response.ByteSize()
            return response
        return wrapper
    for name in ("rpc_ping", "rpc_store", "rpc_find"):
        setattr(DHTProtocol, name, served(getattr(DHTProtocol, name)))
    return counters


def worker(args) -> None:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally: shut p2pd down
    from swarm_node.config import SwarmConfig
    from swarm_node.net.hivemind import HivemindTransport
    from swarm_node.wire.codec import encode

    dht_counters = count_discovery_messages()
    arrivals: dict[tuple[str, str], float] = {}  # (receiver, digest) -> when the bytes were in
    fetch = HivemindTransport._afetch

    async def timed_fetch(self, peer_id, key, *a, **kw):
        result = await fetch(self, peer_id, key, *a, **kw)
        if result[0] is not None:
            arrivals.setdefault((self.peer_id, key), time.time())
        return result
    HivemindTransport._afetch = timed_fetch

    d = Path(args.dir)
    indices = list(range(args.index, min(args.n, args.index + args.per_proc)))
    nodes = []
    try:
        for i in indices:
            cfg = SwarmConfig(run_id=args.run_id, peers=[args.peer] if args.peer else [], host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                              fetch_timeout_s=args.deadline, min_peers=args.k, start_timeout_s=args.start_timeout)
            nodes.append(HivemindTransport(cfg, model_id="bench/synthetic", tokenizer="sha256:" + "ab" * 32, protocol=1,
                                           discovery=args.design, mesh_k=args.k))
            nodes[-1].start()
        t0 = ready_then_go(d, indices, nodes, 2 * args.start_timeout)
        results: dict[int, dict] = {i: {"index": i, "peer_id": n.peer_id, "rounds": [], "snapshots": []}
                                    for i, n in zip(indices, nodes)}

        def snapshot(label: str) -> None:
            tcp = tcp_bytes([n._p2pd_pid for n in nodes])
            cpu = cpu_seconds([os.getpid()] + [n._p2pd_pid for n in nodes]) / len(nodes)
            for i, n in zip(indices, nodes):
                dht = dht_counters.get(id(n._p2p), Counter())
                results[i]["snapshots"].append({"at": label, "stats": n.stats(), "tcp": tcp[n._p2pd_pid], "cpu": cpu,
                                                "dht_msgs": dht["msgs"], "dht_bytes": dht["bytes"],
                                                "degree": len(n.peers()) if args.design == "push" else None})

        def run_rounds(i: int, node) -> None:
            for r in range(1, args.rounds + 1):
                t_start = t0 + (r - 1) * args.period
                time.sleep(max(0.0, t_start - time.time()))
                packet, _ = C.synthetic_packet(seed=1000 * i + r, round=r, sender=node.peer_id, mean_tokens=args.tokens)
                data = encode(packet)
                t_offer = time.time()
                key = node.offer(r, r, data)
                got = node.collect(r, r, min_peers=args.k, deadline_s=max(0.0, t_start + args.deadline - time.time()))
                results[i]["rounds"].append({
                    "round": r, "digest": key, "packet_bytes": len(data), "t_start": t_start, "t_offer": t_offer,
                    "offer_s": time.time() - t_offer, "collect_end": time.time(),
                    "received": [{"digest": x.digest, "peer": x.peer_id, "arrival": arrivals.get((node.peer_id, x.digest))}
                                 for x in got.packets]})

        for r in range(args.rounds + 1):  # snapshots at each round start (by the shared clock) and at the end
            time.sleep(max(0.0, t0 + r * args.period - 0.05 - time.time()))
            if r == 0:
                snapshot("round 1 start")
                threads = [threading.Thread(target=run_rounds, args=(i, n)) for i, n in zip(indices, nodes)]
                for t in threads:
                    t.start()
            elif r < args.rounds:
                snapshot(f"round {r + 1} start")
        for t in threads:
            t.join()
        snapshot("end")
        for i in indices:
            (d / f"result{i}.json").write_text(json.dumps(results[i]))
        (d / f"done{args.index}").write_text("1")
        give_up = time.time() + 60  # keep serving until every worker is done
        while time.time() < give_up and len(list(d.glob("result*.json"))) < args.n:
            time.sleep(0.1)
    finally:
        for n in nodes:
            n.close()


def ready_then_go(d: Path, indices: list[int], nodes: list, timeout: float) -> float:
    """Tell the parent our nodes are up (their addresses and pids), then wait for its start time t0."""
    for i, node in zip(indices, nodes):
        (d / f"ready{i}.tmp").write_text(json.dumps({"maddr": node.join_addrs()[0], "peer_id": node.peer_id,
                                                      "pid": os.getpid(), "p2pd_pid": node._p2pd_pid}))
        os.replace(d / f"ready{i}.tmp", d / f"ready{i}.json")
    give_up = time.time() + timeout
    while not (d / "go.json").exists():
        if time.time() > give_up:
            raise SystemExit("no go signal")
        time.sleep(0.05)
    return json.loads((d / "go.json").read_text())["t0"]


# ------------------------------------------------------------------------------------------ parent
def run_one(args, n: int, design: str) -> dict:
    run_id = f"bench-scale-{os.getpid()}-{design}-{n}"
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-{n}-") as tmp:
        d = Path(tmp)
        procs: list[subprocess.Popen] = []
        logs = []

        def spawn(first: int, peer: str | None):
            argv = [C.PYTHON, __file__, "--worker", "--index", str(first), "--n", str(n), "--dir", tmp, "--run-id", run_id,
                    "--rounds", str(args.rounds), "--period", str(args.period), "--deadline", str(args.deadline),
                    "--tokens", str(args.tokens), "--start-timeout", str(args.start_timeout), "--design", design,
                    "--k", str(args.k), "--per-proc", str(1 if first == 0 else args.per_proc)]
            if peer:
                argv += ["--peer", peer]
            log = open(d / f"worker{first}.log", "w")
            logs.append(log)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=C.REPO))

        def wait_files(pattern: str, count: int, timeout: float) -> None:
            end = time.time() + timeout
            while len(list(d.glob(pattern))) < count:
                if time.time() > end or any(p.poll() not in (None, 0) for p in procs):
                    raise RuntimeError(f"N={n} {design}: workers did not get ready:\n" + tail_logs(d))
                time.sleep(0.1)

        ready: list[dict] = []
        t_spawn = time.time()
        try:
            spawn(0, None)
            wait_files("ready0.json", 1, args.start_timeout)
            maddr0 = json.loads((d / "ready0.json").read_text())["maddr"]
            for first in range(1, n, args.per_proc):
                spawn(first, maddr0)
            wait_files("ready*.json", n, 2 * args.start_timeout)
            startup_s = time.time() - t_spawn
            ready = [json.loads((d / f"ready{i}.json").read_text()) for i in range(n)]
            (d / "go.tmp").write_text(json.dumps({"t0": time.time() + args.settle}))
            os.replace(d / "go.tmp", d / "go.json")
            end = time.time() + args.settle + args.rounds * args.period + 90
            for p in procs:
                try:
                    p.wait(max(1.0, end - time.time()))
                except subprocess.TimeoutExpired:
                    pass
            results = [json.loads((d / f"result{i}.json").read_text()) for i in range(n) if (d / f"result{i}.json").exists()]
            if len(results) < n:
                raise RuntimeError(f"N={n} {design}: only {len(results)} of {n} nodes reported:\n" + tail_logs(d))
        finally:
            leftovers = cleanup(procs, ready)
            for log in logs:
                log.close()
    started = [p.pid for p in procs] + [r["p2pd_pid"] for r in ready if r.get("p2pd_pid")]
    return {"n": n, "design": design, "startup_s": startup_s, "workers": results, "started_pids": started,
            "leftover_processes_killed": leftovers, **analyze(results, n, args)}


def tail_logs(d: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text()[-1500:]}" for f in sorted(d.glob("worker*.log")))


def cleanup(procs: list[subprocess.Popen], ready: list[dict]) -> list[int]:
    """Terminate our workers (by pid) and make sure no p2pd they started outlives them."""
    import psutil

    descendants = []  # p2pd daemons of workers that never reported ready
    for p in procs:
        try:
            descendants += [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        except psutil.Error:
            pass
    for p in procs:
        if p.poll() is None:
            p.terminate()  # the worker's SIGTERM handler closes its transports (and p2pd)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    killed = []
    for pid in [r.get("p2pd_pid") for r in ready] + descendants + [p.pid for p in procs]:
        if pid is None:
            continue
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() >= START_TIME - 1:
                proc.kill()
                killed.append(pid)
        except psutil.Error:
            pass
    return killed


def analyze(results: list[dict], n: int, args) -> dict:
    offers = {r["digest"]: r["t_offer"] for w in results for r in w["rounds"]}
    want = min(args.k, n - 1)

    def phase(rounds: list[int]) -> dict:
        node_rounds = delivered_rounds = packets = 0
        latency = []
        for w in results:
            for r in w["rounds"]:
                if r["round"] not in rounds:
                    continue
                node_rounds += 1
                in_time = [x for x in r["received"] if x["arrival"] is not None
                           and x["arrival"] <= r["t_start"] + args.deadline + 0.05]
                delivered_rounds += len(in_time) >= want
                packets += len(r["received"])
                latency += [x["arrival"] - offers[x["digest"]] for x in in_time]
        per = {key: [] for key in ("dht_msgs", "dht_bytes", "ann_msgs", "ann_bytes", "tcp", "payload", "cpu", "degree")}
        for w in results:
            a, b = w["snapshots"][rounds[0] - 1], w["snapshots"][rounds[-1]]
            k = len(rounds)
            s0, s1 = a["stats"], b["stats"]
            per["dht_msgs"].append((b["dht_msgs"] - a["dht_msgs"]) / k)
            per["dht_bytes"].append((b["dht_bytes"] - a["dht_bytes"]) / k)
            frames = lambda s: 2 * (s.get("announces_sent", 0) + s.get("announces_received", 0))  # noqa: E731
            per["ann_msgs"].append((frames(s1) - frames(s0)) / k)
            per["ann_bytes"].append(sum(s1.get(x, 0) - s0.get(x, 0) for x in ("announce_bytes_out", "announce_bytes_in")) / k)
            payload = sum(s1[x] - s0[x] for x in ("bytes_in", "bytes_out"))
            per["payload"].append(payload / k)
            per["tcp"].append((sum(b["tcp"]) - sum(a["tcp"]) - payload) / k)
            per["cpu"].append((b["cpu"] - a["cpu"]) / k)
            if b.get("degree") is not None:
                per["degree"].append(b["degree"])
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        out = {"rounds": rounds, "node_rounds": node_rounds, "delivered_frac": delivered_rounds / max(1, node_rounds),
               "packets_per_node_round": packets / max(1, node_rounds), "latency_p50_s": C.median(latency),
               "latency_p95_s": C.percentile(latency, 95), "latency_max_s": max(latency) if latency else float("nan"),
               **{f"{key}_per_node_round": mean(v) for key, v in per.items() if key != "degree"},
               "degree_mean": mean(per["degree"]), "degree_max": max(per["degree"]) if per["degree"] else None}
        out["discovery_msgs_per_node_round"] = out["dht_msgs_per_node_round"] + out["ann_msgs_per_node_round"]
        out["discovery_bytes_per_node_round"] = out["dht_bytes_per_node_round"] + out["ann_bytes_per_node_round"]
        return out

    return {"first_round": phase([1]), "steady": phase(list(range(2, args.rounds + 1)) or [1]),
            "packet_bytes": results[0]["rounds"][0]["packet_bytes"]}


START_TIME = time.time()
COLUMNS = ["N", "design", "discovery msgs", "discovery KB", "non-payload TCP KB", "delivered %", "round-1 delivered %",
           "latency p50 s", "latency p95 s", "packets", "neighbors", "CPU s", "startup s"]
CAPTION = ("per node per steady round. discovery = DHT RPC requests+responses (both sides) + announcement frames; "
           "non-payload TCP = all p2pd TCP bytes - packet bytes; packets = packets of the round a node collected; "
           "neighbors = v2 mesh degree; CPU = the node's share of its worker process + its p2pd")


def table_rows(results: list[dict]) -> list[list]:
    rows = []
    for r in sorted(results, key=lambda x: (x["n"], x["design"])):
        s = r["steady"]
        rows.append([r["n"], r["design"], s["discovery_msgs_per_node_round"], s["discovery_bytes_per_node_round"] / 1e3,
                     s["tcp_per_node_round"] / 1e3, 100 * s["delivered_frac"], 100 * r["first_round"]["delivered_frac"],
                     s["latency_p50_s"], s["latency_p95_s"], s["packets_per_node_round"],
                     s["degree_mean"] if r["design"] == "push" else "-", s["cpu_per_node_round"], r["startup_s"]])
    return rows


def title(results: list[dict], a: dict) -> str:
    return (f"transport-only nodes on 127.0.0.1, packet {results[0]['packet_bytes']:,} B, k = min_peers = {a['k']}, "
            f"deadline {a['deadline']:g} s, {a['rounds']} rounds (steady = rounds 2+)")


def markdown(d: dict, md) -> str:
    """The docs/BENCHMARKS.md table of a results file (`md(columns, rows)` renders one; bench/report.py)."""
    lines = [title(d["results"], d["args"]), "", md(COLUMNS, table_rows(d["results"])), "", CAPTION + "."]
    for design, g in (d.get("growth") or {}).items():
        lo, hi = g["from_to"]
        lines.append(f"\n{design}: N = {lo} -> {hi}: discovery messages x{g['discovery_msgs_per_node_round']:.2f}, "
                     f"discovery bytes x{g['discovery_bytes_per_node_round']:.2f}, non-payload TCP x{g['tcp_per_node_round']:.2f}.")
    lines.append(f"\nProcesses left running after cleanup: {d.get('leftover_processes') or 'none'}.")
    return "\n".join(lines)


def report(results: list[dict], args) -> dict:
    C.print_table("Discovery v1 (dht-key) vs v2 (push): " + title(results, vars(args)), COLUMNS, table_rows(results),
                  caption=CAPTION)
    growth = {}
    for design in DESIGNS:
        by_n = {r["n"]: r["steady"] for r in results if r["design"] == design}
        if len(by_n) >= 2:
            lo, hi = min(by_n), max(by_n)
            growth[design] = {key: by_n[hi][key] / by_n[lo][key] if by_n[lo][key] else math.nan
                              for key in ("discovery_msgs_per_node_round", "discovery_bytes_per_node_round",
                                          "tcp_per_node_round", "latency_p50_s")}
            growth[design]["from_to"] = [lo, hi]
            print(f"{design}: N={lo} -> N={hi}: discovery msgs x{growth[design]['discovery_msgs_per_node_round']:.2f}, "
                  f"bytes x{growth[design]['discovery_bytes_per_node_round']:.2f}, non-payload TCP "
                  f"x{growth[design]['tcp_per_node_round']:.2f}, latency p50 x{growth[design]['latency_p50_s']:.2f}")
    return growth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32], help="swarm sizes, one after the other")
    ap.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=DESIGNS)
    ap.add_argument("--rounds", type=int, default=4, help="rounds per run; round 1 is reported apart (cold)")
    ap.add_argument("--deadline", type=float, default=5.0, help="round deadline in seconds (the node default is 30)")
    ap.add_argument("--period", type=float, default=6.0, help="seconds between round starts (>= deadline)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between the last node's start and round 1")
    ap.add_argument("--k", type=int, default=1, help="min_peers: packets each node waits for (v2 degree k + 3 sqrt k)")
    ap.add_argument("--per-proc", type=int, default=4, help="nodes per worker process (node 0 is alone in its own)")
    ap.add_argument("--tokens", type=int, default=200, help="mean completion tokens of the synthetic packets")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--quick", action="store_true", help="smoke run: N = 4 8, 3 rounds")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for a in ("--index", "--n"):
        ap.add_argument(a, type=int, default=0, help=argparse.SUPPRESS)
    for a in ("--dir", "--run-id", "--peer", "--design"):
        ap.add_argument(a, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.nodes, args.rounds = [4, 8], 3
    if args.period < args.deadline:
        ap.error("--period must be >= --deadline")

    import psutil

    started, info = time.time(), C.machine_info()
    print(C.describe_load(info))
    results = []
    for n in args.nodes:
        for design in args.designs:
            t = time.time()
            r = run_one(args, n, design)
            results.append(r)
            s = r["steady"]
            print(f"  N={n:2d} {design:8s}: delivered {100 * s['delivered_frac']:.0f}%, discovery "
                  f"{s['discovery_msgs_per_node_round']:.0f} msgs {s['discovery_bytes_per_node_round'] / 1e3:.1f} KB per node-round, "
                  f"latency p50 {s['latency_p50_s']:.2f} s p95 {s['latency_p95_s']:.2f} s, startup {r['startup_s']:.0f} s "
                  f"({time.time() - t:.0f} s)", flush=True)
    alive = []
    for pid in [pid for r in results for pid in r["started_pids"]]:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() >= START_TIME - 1 and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    children = [c.pid for c in psutil.Process().children(recursive=True)]
    growth = report(results, args)
    print(f"processes started: {sum(len(r['started_pids']) for r in results)} (workers + p2pd); still running after "
          f"cleanup: {alive or 'none'}; children of this script left: {children or 'none'}")
    path = C.write_results("scale", results, args, info, started, out=args.out, growth=growth,
                           leftover_processes=alive, leftover_children=children)
    print(f"wrote {C.shown(path)} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())

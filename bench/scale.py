"""Benchmark 4 — transport scale: N = 2, 4, 8, 16 node processes on 127.0.0.1, no models.

Each node is its own process with its own `swarm_node.swarm.Swarm` (and p2pd child); all
bootstrap from node 0. Rounds run on a shared wall clock: at the start of round r every node
offers a synthetic packet of realistic size (2 prompts x 12 completions x ~200 tokens, ~40 KB,
built by the real codec), then `collect`s the round's packets from all N-1 peers until they all
arrived or the round deadline passed. Per N we report:

  delivered   share of the N x (N-1) packets of a round that arrived within the deadline
  latency     arrival (fetch completed at the receiver) minus the sender's offer time;
              median and p95 over delivered packets
  offer       time for `Swarm.offer` to return (DHT record publish)
  bytes       per node per round: packet payload fetched/served (Swarm.stats), and everything
              the node's p2pd sent/received over TCP (payload + DHT + libp2p framing; from the
              kernel's tcp_info via `ss`)
  CPU         CPU seconds per node per round (Python process + its p2pd)

Round 1 is reported separately (routing tables are cold); the rest are the steady state.
Every worker and p2pd is checked gone at the end (psutil), and killed by pid if not.

    .venv/bin/python bench/scale.py                       # N = 2 4 8 16, ~4 min on 2 cores
    .venv/bin/python bench/scale.py --quick               # N = 2 4, 2 rounds
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as C

_SS_PID = re.compile(r"pid=(\d+)")
_SS_SENT = re.compile(r"bytes_acked:(\d+)")
_SS_RECV = re.compile(r"bytes_received:(\d+)")


def tcp_bytes(pid: int | None) -> tuple[int, int]:
    """(bytes acked out, bytes received) summed over the TCP sockets of process `pid` (via `ss -tinpH`)."""
    if pid is None:
        return 0, 0
    try:
        out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0, 0
    sent = recv = 0
    mine = False
    for line in out.splitlines():
        if line and not line[0].isspace():  # a socket line; its tcp_info follows on indented lines
            mine = any(int(p) == pid for p in _SS_PID.findall(line))
            rest = line
        else:
            rest = line
        if mine:
            m1, m2 = _SS_SENT.search(rest), _SS_RECV.search(rest)
            sent += int(m1.group(1)) if m1 else 0
            recv += int(m2.group(1)) if m2 else 0
    return sent, recv


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
def worker(args) -> None:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally: shut p2pd down
    from swarm_node.codec import digest, encode
    from swarm_node.swarm import Swarm, SwarmSettings

    arrivals: dict[str, float] = {}
    first_try: dict[str, float] = {}
    fetch = Swarm._afetch

    async def timed_fetch(self, peer_id, key, *a, **kw):  # stamp the first fetch attempt and when the bytes are in
        first_try.setdefault(key, time.time())
        result = await fetch(self, peer_id, key, *a, **kw)
        data = result[0] if isinstance(result, tuple) else result
        if data is not None:
            arrivals.setdefault(key, time.time())
        return result
    Swarm._afetch = timed_fetch

    d = Path(args.dir)
    settings = SwarmSettings(run_id=args.run_id, initial_peers=[args.peer] if args.peer else [],
                             host_maddrs=["/ip4/127.0.0.1/tcp/0"], fetch_timeout_s=args.deadline)
    swarm = Swarm(settings, model_id="bench/synthetic", tokenizer="sha256:" + "ab" * 32, protocol=1)
    swarm.start()
    try:
        p2pd = swarm._p2pd_pid
        (d / f"ready{args.index}.tmp").write_text(json.dumps({"maddr": swarm.visible_maddrs()[0], "peer_id": swarm.peer_id,
                                                              "pid": os.getpid(), "p2pd_pid": p2pd}))
        os.replace(d / f"ready{args.index}.tmp", d / f"ready{args.index}.json")
        give_up = time.time() + args.start_timeout
        while not (d / "go.json").exists():
            if time.time() > give_up:
                raise SystemExit("no go signal")
            time.sleep(0.05)
        t0 = json.loads((d / "go.json").read_text())["t0"]
        rounds, snaps = [], []

        def snapshot(label: str) -> None:
            snaps.append({"at": label, "t": time.time(), "stats": dict(swarm.stats), "tcp": tcp_bytes(p2pd),
                          "cpu": cpu_seconds([os.getpid(), p2pd])})

        for r in range(1, args.rounds + 1):
            t_start = t0 + (r - 1) * args.period
            time.sleep(max(0.0, t_start - time.time()))
            snapshot(f"round {r} start")
            packet, n_tokens = C.synthetic_packet(seed=1000 * args.index + r, round=r, sender=swarm.peer_id,
                                                  mean_tokens=args.tokens)
            data = encode(packet)
            key = digest(data)
            t_offer = time.time()
            swarm.offer(r, r, data, key)
            t_offered = time.time()
            seen = {key}
            received = swarm.collect({r}, seen, min_packets=args.n - 1, deadline_s=max(0.0, t_start + args.deadline - time.time()))
            t_done = time.time()
            rounds.append({
                "round": r, "digest": key, "packet_bytes": len(data), "tokens": n_tokens, "t_start": t_start,
                "t_offer": t_offer, "offer_s": t_offered - t_offer, "collect_end": t_done,
                "received": [{"digest": x.digest, "peer": x.peer_id, "round": x.round, "arrival": arrivals.get(x.digest),
                              "first_try": first_try.get(x.digest)} for x in received],
            })
        # keep serving until everyone is done (a node that leaves early would starve slower peers)
        (d / f"done{args.index}").write_text("1")
        give_up = time.time() + 30
        while time.time() < give_up and len(list(d.glob("done*"))) < args.n:
            time.sleep(0.1)
        time.sleep(0.5)  # let the last serves finish before the final snapshot
        snapshot("end")
        (d / f"result{args.index}.json").write_text(json.dumps({"index": args.index, "peer_id": swarm.peer_id,
                                                                "rounds": rounds, "snapshots": snaps}))
        (d / f"final{args.index}").write_text("1")
        give_up = time.time() + 30
        while time.time() < give_up and len(list(d.glob("final*"))) < args.n:
            time.sleep(0.1)
    finally:
        swarm.shutdown()


# ------------------------------------------------------------------------------------------ parent
def run_n(args, n: int) -> dict:
    import psutil

    run_id = f"bench-scale-{os.getpid()}-{n}"
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-{n}-") as tmp:
        d = Path(tmp)
        procs: list[subprocess.Popen] = []
        logs = []

        def spawn(i: int, peer: str | None):
            argv = [C.PYTHON, __file__, "--worker", "--index", str(i), "--n", str(n), "--dir", tmp, "--run-id", run_id,
                    "--rounds", str(args.rounds), "--period", str(args.period), "--deadline", str(args.deadline),
                    "--tokens", str(args.tokens), "--start-timeout", str(args.start_timeout)]
            if peer:
                argv += ["--peer", peer]
            log = open(d / f"worker{i}.log", "w")
            logs.append(log)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=C.REPO))

        def wait_files(pattern: str, count: int, timeout: float) -> None:
            end = time.time() + timeout
            while len(list(d.glob(pattern))) < count:
                if time.time() > end or any(p.poll() not in (None, 0) for p in procs):
                    raise RuntimeError(f"N={n}: workers did not get ready:\n" + tail_logs(d))
                time.sleep(0.1)

        ready: list[dict] = []
        t_spawn = time.time()
        try:
            spawn(0, None)
            wait_files("ready0.json", 1, args.start_timeout)
            maddr0 = json.loads((d / "ready0.json").read_text())["maddr"]
            for i in range(1, n):
                spawn(i, maddr0)
            wait_files("ready*.json", n, args.start_timeout)
            startup_s = time.time() - t_spawn
            ready = [json.loads((d / f"ready{i}.json").read_text()) for i in range(n)]
            (d / "go.tmp").write_text(json.dumps({"t0": time.time() + 1.0}))
            os.replace(d / "go.tmp", d / "go.json")
            end = time.time() + 1.0 + args.rounds * args.period + 60
            for p in procs:
                try:
                    p.wait(max(1.0, end - time.time()))
                except subprocess.TimeoutExpired:
                    pass
            failed = [i for i, p in enumerate(procs) if p.poll() != 0]
            results = [json.loads((d / f"result{i}.json").read_text()) for i in range(n) if (d / f"result{i}.json").exists()]
            if len(results) < n:
                raise RuntimeError(f"N={n}: only {len(results)} of {n} workers reported (failed: {failed}):\n" + tail_logs(d))
        finally:
            leftovers = cleanup(procs, ready)
            for log in logs:
                log.close()
    started_pids = [p.pid for p in procs] + [r["p2pd_pid"] for r in ready if r.get("p2pd_pid")]
    return {"n": n, "startup_s": startup_s, "workers": results, "leftover_processes_killed": leftovers,
            "started_pids": started_pids,
            **analyze(results, n, args.deadline)}


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
            p.terminate()  # the worker's SIGTERM handler shuts its Swarm (and p2pd) down
    for p in procs:
        try:
            p.wait(15)
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


def analyze(results: list[dict], n: int, deadline: float) -> dict:
    offers = {}  # digest -> (sender index, offer time)
    for w in results:
        for r in w["rounds"]:
            offers[r["digest"]] = (w["index"], r["t_offer"])

    def phase(rounds: set[int]) -> dict:
        expected = delivered = 0
        lat, discovery, transfer, offer_s, failures = [], [], [], [], 0
        for w in results:
            for r in w["rounds"]:
                if r["round"] not in rounds:
                    continue
                expected += n - 1
                for x in r["received"]:
                    if x["arrival"] is not None and x["arrival"] <= r["t_start"] + deadline + 0.05:
                        delivered += 1
                        lat.append(x["arrival"] - offers[x["digest"]][1])
                        if x.get("first_try") is not None:
                            discovery.append(x["first_try"] - offers[x["digest"]][1])
                            transfer.append(x["arrival"] - x["first_try"])
                offer_s.append(r["offer_s"])
        # bytes and CPU: from the snapshot at the start of the phase's first round to the one after it
        # (the next round's start, or the end once every node finished), per node per round
        first, last = min(rounds), max(rounds)
        cpu, pay_in, pay_out, tcp_in, tcp_out = [], [], [], [], []
        for w in results:
            snaps = w["snapshots"]
            a = snaps[first - 1]
            b = snaps[last] if last < len(snaps) else snaps[-1]
            k = len(rounds)
            cpu.append((b["cpu"] - a["cpu"]) / k)
            pay_in.append((b["stats"]["bytes_in"] - a["stats"]["bytes_in"]) / k)
            pay_out.append((b["stats"]["bytes_out"] - a["stats"]["bytes_out"]) / k)
            tcp_out.append((b["tcp"][0] - a["tcp"][0]) / k)
            tcp_in.append((b["tcp"][1] - a["tcp"][1]) / k)
            failures += b["stats"]["fetch_failures"] - a["stats"]["fetch_failures"]
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        return {"rounds": sorted(rounds), "expected": expected, "delivered": delivered,
                "delivered_frac": delivered / expected if expected else float("nan"),
                "latency_median_s": C.median(lat), "latency_p95_s": C.percentile(lat, 95),
                "latency_max_s": max(lat) if lat else float("nan"),
                "discovery_median_s": C.median(discovery), "transfer_median_s": C.median(transfer),
                "offer_median_s": C.median(offer_s), "offer_p95_s": C.percentile(offer_s, 95),
                "cpu_s_per_node_round": mean(cpu),
                "payload_in_per_node_round": mean(pay_in), "payload_out_per_node_round": mean(pay_out),
                "tcp_in_per_node_round": mean(tcp_in), "tcp_out_per_node_round": mean(tcp_out),
                "overhead_per_node_round": mean(tcp_in) + mean(tcp_out) - mean(pay_in) - mean(pay_out),
                "fetch_failures": failures}

    all_rounds = sorted({r["round"] for w in results for r in w["rounds"]})
    return {"first_round": phase({all_rounds[0]}), "steady": phase(set(all_rounds[1:]) or set(all_rounds)),
            "packet_bytes": results[0]["rounds"][0]["packet_bytes"]}


START_TIME = time.time()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8, 16], help="swarm sizes to run, one after the other")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per swarm size; round 1 is reported apart (cold)")
    ap.add_argument("--deadline", type=float, default=5.0, help="round deadline in seconds (the node default is 30)")
    ap.add_argument("--period", type=float, default=6.0, help="seconds between round starts (>= deadline)")
    ap.add_argument("--tokens", type=int, default=200, help="mean completion tokens of the synthetic packets")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--quick", action="store_true", help="smoke run: N = 2 4, 2 rounds")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for a in ("--index", "--n"):
        ap.add_argument(a, type=int, default=0, help=argparse.SUPPRESS)
    for a in ("--dir", "--run-id", "--peer"):
        ap.add_argument(a, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.nodes, args.rounds = [2, 4], 2
    if args.period < args.deadline:
        ap.error("--period must be >= --deadline")

    import psutil

    started, info = time.time(), C.machine_info()
    print(C.describe_load(info))
    results = []
    for n in args.nodes:
        t = time.time()
        r = run_n(args, n)
        results.append(r)
        s = r["steady"]
        print(f"  N={n:2d}: delivered {100 * s['delivered_frac']:.0f}%, latency p50 {s['latency_median_s']:.2f} s "
              f"p95 {s['latency_p95_s']:.2f} s, startup {r['startup_s']:.0f} s ({time.time() - t:.0f} s)", flush=True)
    # nothing we started may survive: the workers and the p2pd daemons they started (by pid, and
    # only if that pid is still the process we started: created after this script began)
    alive = []
    for pid in [pid for r in results for pid in r["started_pids"]]:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() >= START_TIME - 1 and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    children = [c.pid for c in psutil.Process().children(recursive=True)]
    rows = []
    for r in results:
        s, f = r["steady"], r["first_round"]
        rows.append([r["n"], 100 * s["delivered_frac"], 100 * f["delivered_frac"], s["latency_median_s"], s["latency_p95_s"],
                     s["discovery_median_s"], s["transfer_median_s"], s["offer_median_s"],
                     s["payload_in_per_node_round"] / 1e3,
                     (s["tcp_in_per_node_round"] + s["tcp_out_per_node_round"]) / 1e3,
                     s["overhead_per_node_round"] / 1e3, s["cpu_s_per_node_round"]])
    C.print_table(f"Transport scale on 127.0.0.1: one process + p2pd per node, packet {results[0]['packet_bytes']:,} B "
                  f"(2 x 12 x ~{args.tokens} tokens), deadline {args.deadline:g} s, {args.rounds} rounds (steady = rounds 2+)",
                  ["N", "delivered %", "round-1 delivered %", "latency p50 s", "latency p95 s", "discovery p50 s",
                   "transfer p50 s", "offer p50 s", "payload in KB", "TCP in+out KB", "non-payload KB", "CPU s"], rows,
                  caption="per node per round. latency = receiver's fetch completion - sender's offer = discovery (offer -> "
                          "receiver's first fetch attempt: DHT publish + polling) + transfer; TCP = all p2pd traffic "
                          "(tcp_info); non-payload = TCP - packet bytes in and out (DHT records, RPCs, libp2p framing); "
                          "CPU = node process + its p2pd")
    growth = {}
    if len(results) >= 2:
        import math

        def slope(key):
            pts = [(math.log(r["n"]), math.log(r["steady"][key])) for r in results if r["steady"][key] > 0]
            if len(pts) < 2:
                return None
            mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
            return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        for key in ("latency_median_s", "latency_p95_s", "discovery_median_s", "transfer_median_s", "offer_median_s",
                    "payload_in_per_node_round", "tcp_in_per_node_round", "overhead_per_node_round", "cpu_s_per_node_round"):
            growth[key] = slope(key)
        print("growth with N (least-squares exponent k in value ~ N^k): "
              + ", ".join(f"{k} {v:.2f}" for k, v in growth.items() if v is not None))
    print(f"processes started: {sum(len(r['started_pids']) for r in results)} (workers + p2pd); still running after "
          f"cleanup: {alive or 'none'}; children of this script left: {children or 'none'}")
    path = C.write_results("scale", results, args, info, started, out=args.out, growth_exponents=growth,
                           leftover_processes=alive,
                           leftover_children=children)
    print(f"wrote {C.shown(path)} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())

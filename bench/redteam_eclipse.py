"""Issue 27's eclipse campaign with real processes: live Sybils (swarm_node/harness/sybils.py) against an
honest pair V + H, both join orders, several trials, beside no-attack baselines; `--kind liar`: Sybils that
offer made-up packets (a producer's look, until fetched); `--kind busy`: Sybils that offer made-up packets
and answer every fetch `busy` (never found out by a fetch); `--kind stall`: Sybils that offer made-up
packets and hold every fetch open without a byte (found out only by the fetch timeout); `--kind wrongkeep`: Sybils that deliver valid
packets of all-wrong groups instead (red team 2).

Every node is a real `swarm-node join` process on 127.0.0.1 at the project defaults for tiny-s
(harness/poisoner.victim_args: 16 prompts a round, G = 12, deadline 20 s), and the Sybils are one
process holding k libp2p hosts that announce degree 0, take everyone, never prune and never deliver.

  order sybils-first   V starts, the Sybils join V and fill its slots, then H joins V
  order honest-first   V starts, H joins, then the Sybils join V

With --prestart the Sybil hosts start before V (64 hosts beside a running V took minutes, or did not
start at all) and idle, knowing each other but not linked, until the join order names V to them.
With --subnets, V, H and every Sybil (one process each, prestarted) run in network namespaces of their
own, each in a /24 of its own (harness/netns.py), so no connection is loopback and the per-subnet
neighbour limit applies but never binds: k Sybils from k subnets; the baselines run there too.

Per trial, from V's log, metrics and status.json (polled twice a second): the share of V's rounds
(2 .. end) in which V trained on H's groups, and of those V began while H had a packet to give (after H's
first round ended: 64 Sybils take V's first ~4 rounds to start; before H's last did), V's median round time, whether V and H
were ever out of each other's neighbours after they first linked, and the most consecutive rounds
any Sybil held a slot at V. The baseline row is the same pair without Sybils.

    PYTHONPATH=. .venv/bin/python bench/redteam_eclipse.py --k 6 16 --trials 3 --rounds 30

Results append to bench/results/redteam_eclipse.json (resumable: a (k, order, trial) present is skipped).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from swarm_node.harness.poisoner import VICTIM_WARMSTART_STEPS, victim_args  # noqa: E402
from bench._common import load_runs, machine_info, percentile  # noqa: E402
from bench.redteam_network import pinned  # noqa: E402
from bench.redteam_poisoning import guard_figures  # noqa: E402
from swarm_node.fsutil import write_atomic  # noqa: E402
from swarm_node.harness.netns import Internet  # noqa: E402
from swarm_node.harness.process import NodeProcess  # noqa: E402
from swarm_node.harness.warmstart import public_warm_start  # noqa: E402
from swarm_node.status import read_status  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "redteam_eclipse.json"
SYBIL_FLAGS = {"empty": [], "liar": ["--lie"], "busy": ["--busy"], "stall": ["--stall"]}  # sybils.py's flag per kind
HOST_KINDS = tuple(SYBIL_FLAGS)  # Sybils as hosts of harness/sybils.py (the rest: poisoner processes)
SYBILS_START_S = 900  # 64 Sybil hosts in one process beside V on 2 cores: ~80 s, over 300 s when V fetches from them


class Watch:
    """Polls V's status.json: the neighbour set V reports at each of its rounds."""

    def __init__(self, out: Path):
        self.out, self.by_round, self.stop = out, {}, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            status = read_status(self.out) or {}
            if status.get("round") is not None and status.get("neighbours") is not None:
                self.by_round[int(status["round"])] = sorted(status["neighbours"])
            time.sleep(0.5)


def pin_tree(pid: int, cores: str) -> None:
    """Move process `pid`, every thread of it and every descendant (its p2pd daemons) onto `cores`."""
    todo = [pid]
    while todo:
        p = todo.pop()
        subprocess.run(["taskset", "-a", "-p", "-c", cores, str(p)], check=True, capture_output=True)
        children = Path(f"/proc/{p}/task/{p}/children")
        todo += [int(c) for c in children.read_text().split()] if children.exists() else []


def longest_run(rounds: dict[int, list[str]], peer: str) -> int:
    best = cur = 0
    for r in sorted(rounds):
        cur = cur + 1 if peer in rounds[r] else 0
        best = max(best, cur)
    return best


def round_ends(log: str) -> dict[int, float]:
    """Each round's end, in seconds of the day, from a node's log ("HH:MM:SS ... round N | ...")."""
    ends = {}
    for m in re.finditer(r"^(\d\d):(\d\d):(\d\d) INFO swarm_node.node: round (\d+) \|", log, re.M):
        ends[int(m.group(4))] = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
    return ends


def after_h_spread(rows: list[dict]) -> dict:
    """V's rounds after H's first: round and exchange p90 and max, and the failed fetches per round
    (refused, timed out, broken; rows of older runs lack the key)."""
    if not rows:
        return {}
    rounds, exchanges = [r["time/round_s"] for r in rows], [r["time/exchange_s"] for r in rows]
    failures = [r.get("swarm/fetch_failures", 0) for r in rows]
    return {"round_p90_after_h_s": percentile(rounds, 90), "round_max_after_h_s": max(rounds),
            "exchange_p90_after_h_s": percentile(exchanges, 90), "exchange_max_after_h_s": max(exchanges),
            "fetch_failures_per_round_after_h": statistics.mean(failures)}


def trial(k: int, order: str, seed: int, rounds: int, model: str, kind: str = "empty", pin: bool = False,
          prestart: bool = False, subnets: bool = False, one_process: bool = False, eval_every: int = 0) -> dict:
    """One trial; `prestart` as main() resolved it (asked for, or implied by `subnets`, for Sybil hosts only);
    `one_process`: delivering Sybils as k ids of one poisoner process (else a process each); `eval_every`: V and H
    evaluate every this many rounds too (0: at the start and the end only)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"eclipse-{k}-{order}-{seed}-"))
    run, procs, t0 = f"eclipse-{k}-{order}-{seed}", [], time.time()
    n = os.cpu_count() or 1  # pinned: V and H on all cores but the last, the Sybils (and their p2pd) on the last
    honest_cores, sybil_cores = (f"0-{max(0, n - 2)}", str(n - 1)) if pin and n > 1 else (None, None)
    hosts = kind in HOST_KINDS  # k hosts in one process that never deliver (liar: offer made-up packets;
    #   busy: offer them and answer every fetch `busy`; stall: hold every fetch open); else k delivering poisoners
    net = Internet(f"ecl{os.getpid() % 1000}") if subnets else None  # V, H, each Sybil: a namespace, a /24 of its own
    victims_file, sybil_ids, sybil_addrs = tmp / "victims.txt", [], []
    evaluate = ["--set", f"train.eval_every={eval_every}"] if eval_every else []

    def node(name: str, args: list[str]) -> NodeProcess:
        """`swarm-node join` as V or H: on 127.0.0.1, or in a namespace host of its own."""
        if net is None:
            return NodeProcess.join(args, tmp / name)
        host = net.host(name)
        proc = NodeProcess.join(args, tmp / name, listen=["--host-maddrs", f"/ip4/{host.ip}/tcp/0"])
        proc.argv = host.cmd(proc.argv)
        return proc

    def launch_hosts(join: list[str]) -> None:
        started = []
        for name, count in [(f"sybil{i}", 1) for i in range(k)] if net else [("sybils", k)]:
            host = net.host(name) if net else None
            argv = [sys.executable, "-m", "swarm_node.harness.sybils", "--k", str(count), *join, "--run-id", run,
                    "--model", model, "--seconds", str(SYBILS_START_S + 1500), "--summary", str(tmp / f"{name}.json"),
                    *(["--host", host.ip] if host else []), *SYBIL_FLAGS[kind]]
            started.append(NodeProcess(host.cmd(argv) if host else argv, log=tmp / f"{name}.log"))
            procs.append(started[-1].start())  # started on every core: starting 64 hosts on one took over 900 s
        for s in started:
            sybil_ids.extend(s.wait_line("SYBILS ", SYBILS_START_S).split()[1:])
            sybil_addrs.extend(s.wait_line("ADDRS ", 60).split()[1:])
            if sybil_cores is not None:  # then, with their daemons, on the last core only
                pin_tree(s.pid, sybil_cores)

    try:
        if prestart:  # up before V starts; they dial V only once sybils() names it
            launch_hosts(["--peers-file", str(victims_file)])
        v = node("victim", [*victim_args(rounds), *evaluate, "--run-id", run, "--set", f"train.seed={2 * seed}"])
        procs.append(pinned(v, honest_cores).start())
        watch = Watch(tmp / "victim")

        def sybils() -> None:
            if prestart:  # V, and the Sybils of every process: they name each other, never dial each other
                write_atomic(victims_file, v.address() + "\n" + "".join(f"sybil {a}\n" for a in sybil_addrs),
                             durable=False)
            elif hosts:
                launch_hosts(["--peers", v.address()])
            else:  # poisoners that deliver valid packets of `kind` (wrongkeep: all-wrong groups): k processes, or k ids
                evils = []  # of one; with `subnets`, each process in a namespace and a /24 of its own (one process: one /24)
                for i in range(1 if one_process else k):
                    host = net.host(f"sybil{i}") if net else None
                    argv = [sys.executable, "-m", "swarm_node.harness.poisoner", "--kind", kind, "--peers", v.address(),
                            "--run-id", run, "--model", model, "--groups", "16", "--seconds", "1500",
                            "--seed", str(10 * seed + i), "--ids", str(k if one_process else 1),
                            *(["--host", host.ip] if host else [])]
                    evils.append(NodeProcess(host.cmd(argv) if host else argv, log=tmp / f"sybil{i}.log"))
                procs.extend(pinned(e, sybil_cores).start() for e in evils)
                sybil_ids.extend(i for e in evils for i in e.wait_line("ATTACKER ", 600).split()[1:])
            time.sleep(5)  # let them dial V and take its slots

        def honest() -> NodeProcess:
            h = node("honest", [*victim_args(rounds), *evaluate, "--run-id", run, "--set", f"train.seed={2 * seed + 1}",
                                "--peers", v.address()])
            procs.append(pinned(h, honest_cores).start())
            return h

        if k and order == "sybils-first":
            sybils()
        h = honest()
        if k and order == "honest-first":
            h.address()
            sybils()
        for node in (v, h):
            assert node.wait(1500) == 0, node.text()
        watch.stop.set()
        v_all, h_all = v.rows(), h.rows()
        v_rows = [r for r in v_all if r["round"] >= 2]
        h_id = (read_status(tmp / "honest") or {}).get("peer_id") or h.address().rsplit("/", 1)[-1]
        seen = watch.by_round
        linked = [r for r in sorted(seen) if h_id in seen[r]]
        unlinked_after = [r for r in sorted(seen) if linked and r > linked[0] and h_id not in seen[r]]
        # the rounds in which V trained on H's groups (with delivering Sybils, an accepted packet is not H's)
        log = (tmp / "victim" / "node.log").read_text()
        with_h = {int(m.group(1)) for m in re.finditer(r"round (\d+) trains on peer groups (\{[^}]*\})", log)
                  if h_id in m.group(2)}
        # the rounds V began while H had a packet to give: after H's first round ended, before its last did
        h_ends, v_ends = round_ends((tmp / "honest" / "node.log").read_text()), round_ends(log)
        h_first, h_last = h_ends.get(1, float("inf")), max(h_ends.values(), default=0)
        after_h = [r for r in v_rows if h_first <= v_ends.get(r["round"] - 1, -1) < h_last]
        # V and H apart after they first linked, while H still ran (H leaves when its last round is done)
        unlinked_after = [r for r in unlinked_after if v_ends.get(r - 1, 0) < h_last]
        return {"k": k, "kind": kind, "order": order, "seed": seed, "rounds": rounds, "pinned": pin, "prestart": prestart,
                "subnets": subnets, "one_process": one_process, "eval_every": eval_every,
                "honest_delivery": sum(r["round"] in with_h for r in v_rows) / len(v_rows),
                "honest_delivery_after_h": sum(r["round"] in with_h for r in after_h) / max(1, len(after_h)),
                "rounds_after_h": len(after_h),
                "median_round_after_h_s": statistics.median(r["time/round_s"] for r in after_h) if after_h else None,
                "median_round_s": statistics.median(r["time/round_s"] for r in v_rows),
                **after_h_spread(after_h),
                "first_linked_round": linked[0] if linked else None, "unlinked_rounds_after_link": unlinked_after,
                "sybil_longest_slot_rounds": max((longest_run(seen, s) for s in sybil_ids), default=0),
                "sybil_longest_slot_id": max(sybil_ids, key=lambda s: longest_run(seen, s), default=None),
                "sybil_slot_rounds_total": sum(s in seen[r] for r in seen for s in sybil_ids), "sybil_ids_up": len(sybil_ids),
                "rounds_watched": len(seen), "neighbors_evicted": sum(r.get("swarm/neighbors_evicted", 0) for r in v_rows),
                "peers_graylisted": sum(r.get("swarm/peers_graylisted", 0) for r in v_rows),
                **node_outcome("victim", v_all), **node_outcome("honest", h_all),
                **{key: x for key, x in guard_figures(v_all, h_all).items() if key.endswith("_late_eval")},
                "wall_s": round(time.time() - t0, 1), "work": str(tmp)}
    finally:
        for p in procs:
            p.kill()
        if net is not None:
            net.close()
        print("work dir:", tmp, flush=True)


def table(runs: list[dict]) -> str:
    lines = ["| CPU | Sybils | kind | order | trials | honest packets in V's rounds (min) | ... in V's rounds after H's first "
             "(min) | median round s (max) | ... after H's first (max) | V-H unlinked after linking | longest Sybil slot, "
             "rounds (max) | round p90 after H's first (max) | exchange after H's first, max s | failed fetches a round "
             "(max) |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r.get("cpu") or "-", r["k"], r.get("kind", "empty") if r["k"] else "-",
                           r["order"] if r["k"] else "-", r.get("pinned", False), r.get("prestart", False),
                           r.get("subnets", False), r.get("one_process", False)), []).append(r)
    def worst(rs: list[dict], key: str, pick) -> str:  # "-" where a run did not record `key` (older runs)
        vals = [r.get(key) for r in rs]
        return "-" if None in vals else f"{pick(vals):.2f}"
    for (cpu, k, kind, order, pin, pre, nets, one), rs in sorted(groups.items()):
        how = ", ".join(w for w, on in (("pinned", pin), ("prestarted", pre), ("a /24 each", nets), ("one process", one))
                        if on)
        lines.append(f"| {cpu} | {k} | {kind}{f' ({how})' if how else ''} | {order} | {len(rs)} | "
                     f"{min(r['honest_delivery'] for r in rs):.2f} | "
                     f"{worst(rs, 'honest_delivery_after_h', min)} | "
                     f"{max(r['median_round_s'] for r in rs):.2f} | "
                     f"{worst(rs, 'median_round_after_h_s', max)} | "
                     f"{sum(len(r['unlinked_rounds_after_link']) for r in rs)} | "
                     f"{max(r['sybil_longest_slot_rounds'] for r in rs)} | "
                     f"{worst(rs, 'round_p90_after_h_s', max)} | {worst(rs, 'exchange_max_after_h_s', max)} | "
                     f"{worst(rs, 'fetch_failures_per_round_after_h', max)} |")
    return "\n".join(lines)


def node_outcome(name: str, rows: list[dict]) -> dict:
    """A node's held-out pass@1 at its first and last evaluation, and what its guard did: the resets and
    the most peers vouched for at once (in the poisoning campaigns: did tenure go to Sybils?)."""
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    return {f"{name}_acc": [evals[0], evals[-1]] if evals else None,
            f"{name}_guard_resets": max((r.get("guard/resets", 0) for r in rows), default=0),
            f"{name}_vouched_max": max((r.get("guard/vouched_peers", 0) for r in rows), default=0)}


def accuracy_table(runs: list[dict]) -> str:
    """Delivering (poisoning) Sybils: V's and H's held-out pass@1 against the no-attack run of the same seed,
    length and evaluation schedule on the same kind of CPU (another CPU kind warm-starts V elsewhere: same
    seeds, other floats), the poisoning issue's bound: mean within 3 points, no seed more than 6 below. A
    run's score is the mean of its evaluations at rounds 80-100 where it evaluated every 5 rounds (one
    snapshot of a tiny model swings by several points), else its last evaluation."""
    def pairing(r: dict) -> tuple:
        return r.get("cpu"), r["seed"], r["rounds"], r.get("eval_every", 0)
    def score(r: dict, node: str) -> float | None:
        return r.get(f"{node}_late_eval") or (r.get(f"{node}_acc") or [None, None])[1]

    base = {pairing(r): r for r in runs if not r["k"] and r.get("victim_acc")}
    cells: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["k"] and r.get("kind", "empty") not in HOST_KINDS and r.get("victim_acc") and pairing(r) in base:
            cells.setdefault((r.get("cpu") or "-", r["k"], r["kind"], r["order"], r["rounds"],
                              r.get("one_process", False), r.get("eval_every", 0)), []).append(r)
    lines = ["| CPU | Sybils | kind | order | rounds | scored on | V pass@1 (no attack) | V - no attack: per seed; mean, "
             "worst | H - no attack: per seed; mean, worst |", "|---|---|---|---|---:|---|---:|---|---|"]
    for (cpu, k, kind, order, rounds, one, every), rs in sorted(cells.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        cols = []
        for node in ("victim", "honest"):
            diffs = [score(r, node) - score(base[pairing(r)], node) for r in rs
                     if score(r, node) is not None and score(base[pairing(r)], node) is not None]
            cols.append(f"{', '.join(f'{100 * d:+.1f}' for d in diffs)}; {100 * statistics.mean(diffs):+.1f}, "
                        f"{100 * min(diffs):+.1f}" if diffs else "-")
        lines.append(f"| {cpu} | {k} | {kind}{' (one process)' if one else ''} | {order} | {rounds} | "
                     f"{'rounds 80-100' if every else 'the end'}, {len(rs)} seeds | "
                     f"{statistics.mean(score(r, 'victim') for r in rs):.3f} "
                     f"({statistics.mean(score(base[pairing(r)], 'victim') for r in rs):.3f}) | {cols[0]} | {cols[1]} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", nargs="+", type=int, default=[6, 16])
    ap.add_argument("--orders", nargs="+", default=["sybils-first", "honest-first"])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--kind", default="empty", help="empty (never deliver), liar (offer packets nobody serves), busy "
                                                     "(offer them, answer every fetch busy), stall (offer them, hold every fetch open) or "
                                                     "a poisoner kind that delivers (wrongkeep)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--pin", action="store_true", help="V and H on all cores but the last, the Sybils on the last: "
                                                       "what the attack costs V, not the CPU its daemons take")
    ap.add_argument("--prestart", action="store_true", help="start the Sybil hosts before V, idle until the join "
                                                            "order names V (64 hosts take minutes to start under load)")
    ap.add_argument("--subnets", action="store_true", help="V, H and every Sybil process in a network namespace and a "
                                                           "/24 of its own (one Sybil process each, prestarted; with "
                                                           "--one-process, k delivering ids in one /24); baselines too")
    ap.add_argument("--one-process", action="store_true", help="delivering Sybils (a poisoner kind) as k ids of one "
                                                               "process, not a process each (k = 64)")
    ap.add_argument("--eval-every", type=int, default=0, help="V and H also evaluate every this many rounds; the "
                                                               "accuracy table then scores rounds 80-100 (default: the end)")
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args()
    path = Path(args.results)
    if args.table:
        print(table(load_runs(path)), accuracy_table(load_runs(path)), sep="\n\n")
        return 0
    model = public_warm_start(VICTIM_WARMSTART_STEPS)
    cpu = machine_info()["cpu_model"]  # part of every result and its resume key: other CPU kinds, other floats
    cells = [(0, "none", s) for s in range(args.trials)]
    cells += [(k, o, s) for s in range(args.trials) for k in args.k for o in args.orders]
    for k, order, seed in cells:
        kind = args.kind if k else "empty"
        prestart = (args.prestart or args.subnets) and kind in HOST_KINDS and k > 0
        one_process = args.one_process and kind not in HOST_KINDS and k > 0
        if any((r["k"], r.get("kind", "empty"), r["order"], r["seed"], r["rounds"], r.get("pinned", False),
                r.get("prestart", False), r.get("subnets", False), r.get("one_process", False), r.get("cpu"),
                r.get("eval_every", 0)) ==
               (k, kind, order, seed, args.rounds, args.pin, prestart, args.subnets, one_process, cpu, args.eval_every)
               for r in load_runs(path)):
            continue
        res = {**trial(k, order, seed, args.rounds, model, kind, args.pin, prestart, args.subnets, one_process,
                       args.eval_every),
               "cpu": cpu}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"runs": load_runs(path) + [res]}, indent=1) + "\n")
        print(f"{time.strftime('%H:%M:%S')} k={k} {order} seed {seed}: delivery {res['honest_delivery']:.2f}, "
              f"median {res['median_round_s']:.2f} s, unlinked {res['unlinked_rounds_after_link']}, "
              f"longest Sybil slot {res['sybil_longest_slot_rounds']} ({res['wall_s']} s)", flush=True)
    print(table(load_runs(path)), accuracy_table(load_runs(path)), sep="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

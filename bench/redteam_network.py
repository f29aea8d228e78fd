"""Issue 27's network attacks with real processes: the verify bomb, the cache fill and the announcement
flood (swarm_node/harness/dht_attacker.py), each against an honest pair V + H of real `swarm-node join`
processes on 127.0.0.1 at the project defaults for tiny-s (harness/poisoner.victim_args).

Per trial the attacker builds its bytes first. Bomb and flood are then switched on and off in turns
of 15 s (the attack's seconds on in all), so V's rounds with and without it share the machine's
background load (this machine is shared: a baseline taken before the attack was off by 2x once);
the cache fill is one shot, after --before seconds of baseline. From V's metrics.jsonl rows as they
appear (polled 5 times a second), by the window each round ended in:

    median and p99 of V's round time (time/round_s), V's rounds per 10 s, without and with
    V's CPU (its python and its p2pd) without and with; V's RSS before and after
    flood: seconds from the first flooding stream to V's log line that ignores the id (graylist)
    cachefill: records the target stored through each storage path, how many a `find` of the key
               returns, and how long the find took (the attacker's summary)

    PYTHONPATH=. .venv/bin/python bench/redteam_network.py --attacks bomb cachefill flood flood64

Results append to bench/results/redteam_network.json (a run per attack and trial; resumable).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from swarm_node.harness.poisoner import victim_args  # noqa: E402
from bench._common import load_runs  # noqa: E402
from swarm_node.harness.process import NodeProcess  # noqa: E402
from swarm_node.status import read_status  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "redteam_network.json"
# attack name -> (dht_attacker arguments, seconds of attack); what issue 27 asked for
ATTACKS = {
    "bomb": (["--mode", "bomb", "--inflight", "8", "--request-mb", "3.8"], 90),
    "cachefill": (["--mode", "cachefill", "--records", "3000"], 0),
    "cachefill100k": (["--mode", "cachefill", "--records", "100000"], 0),
    "flood": (["--mode", "flood", "--ids", "1", "--loops", "16"], 30),
    "flood64": (["--mode", "flood", "--ids", "64", "--loops", "4"], 30),
    "fetchflood": (["--mode", "flood", "--ids", "1", "--loops", "16", "--streams", "fetch"], 30),  # session 34:
    "dhtflood": (["--mode", "flood", "--ids", "1", "--loops", "16", "--streams", "dht"], 30),  # the adaptive floods
}
CYCLE_S = 15.0  # bomb and flood: the attack is switched on and off in turns of this long
GRAYLIST_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d) (?:INFO|WARN(?:ING)?) \S+: peer (\S+) opened streams over its rate")


class Rows:
    """V's metrics rows with the wall time each appeared (polled every 0.2 s)."""

    def __init__(self, node: NodeProcess):
        self.node, self.seen, self.stop = node, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            rows = self.node.rows()
            now = time.time()
            self.seen += [(now, r) for r in rows[len(self.seen):]]
            time.sleep(0.2)

    def window(self, spans: list[tuple]) -> dict:
        """V's rounds that ended within any of `spans` (start, end, ...)."""
        times = [r["time/round_s"] for t, r in self.seen if any(s[0] <= t < s[1] for s in spans)]
        q, total = sorted(times), sum(s[1] - s[0] for s in spans)
        return {"rounds": len(times), "rounds_per_10s": round(10 * len(times) / max(total, 1e-9), 2),
                "median_round_s": round(statistics.median(q), 3) if q else None,
                "p99_round_s": round(q[min(len(q) - 1, int(0.99 * len(q)))], 3) if q else None}


def tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def rss_mb(out: Path) -> float:
    """The node's RSS with its children (p2pd), MB."""
    return round(sum(p.memory_info().rss for p in tree((read_status(out) or {})["pid"])) / 1e6, 1)


def cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of a process and of its p2pd children."""
    out = {"python": 0.0, "p2pd": 0.0}
    for p in tree(pid):
        try:
            t = p.cpu_times()
            out["p2pd" if "p2pd" in p.name() else "python"] += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def cpu_share(spans: list[tuple]) -> dict[str, float]:
    """Cores V used over windows (start, end, cpu_s at start, cpu_s at end)."""
    total = sum(t1 - t for t, t1, _, _ in spans)
    return {k: round(sum(b[k] - a[k] for _, _, a, b in spans) / max(total, 1e-9), 2) for k in ("python", "p2pd")}


def graylisted_after(log: Path, t_attack: float) -> float | None:
    """Seconds from the attack's start to V's first graylist line (log times are HH:MM:SS, local)."""
    day = time.localtime(t_attack)
    for line in log.read_text().splitlines():
        m = GRAYLIST_LINE.match(line)
        if m:
            t = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, int(m[1]), int(m[2]), int(m[3]), 0, 0, -1))
            if t >= int(t_attack):
                return round(t - t_attack, 1)
    return None


def pinned(node: NodeProcess, cores: str | None) -> NodeProcess:
    """`node` run on these CPU cores only (taskset), or as it is (None)."""
    if cores is not None:
        node.argv = ["taskset", "-c", cores, *node.argv]
    return node


def trial(name: str, seed: int, before_s: float, pin: bool = False) -> dict:
    extra, seconds = ATTACKS[name]
    n = os.cpu_count() or 1
    victim_cores, attacker_cores = (f"0-{max(0, n - 2)}", str(n - 1)) if pin and n > 1 else (None, None)
    tmp = Path(tempfile.mkdtemp(prefix=f"rtnet-{name}-{seed}-"))
    run, procs, t0 = f"rtnet-{name}-{seed}", [], time.time()
    try:
        v = NodeProcess.join([*victim_args(100_000), "--run-id", run, "--set", f"train.seed={2 * seed}"], tmp / "victim")
        procs.append(pinned(v, victim_cores).start())
        h = NodeProcess.join([*victim_args(100_000), "--run-id", run, "--set", f"train.seed={2 * seed + 1}",
                              "--peers", v.address()], tmp / "honest")
        procs.append(pinned(h, victim_cores).start())
        rows = Rows(v)
        v.wait_rows(lambda r: len(r) >= 5, 900, "V's first rounds with H")
        go = tmp / "go"
        attacker = NodeProcess([sys.executable, "-m", "swarm_node.harness.dht_attacker", *extra, "--target",
                                v.address(), "--run-id", run, "--seconds", str(2 * seconds + 5), "--go-file", str(go),
                                "--summary", str(tmp / "attacker.json")], log=tmp / "attacker.log")
        procs.append(pinned(attacker, attacker_cores).start())
        attacker.wait_line("ATTACKER up", 1800)
        v_pid = (read_status(tmp / "victim") or {})["pid"]
        rss_before = rss_mb(tmp / "victim")
        windows: dict[str, list] = {"off": [], "on": []}  # (start, end, V's CPU at start, at end)
        grew = {"off": 0.0, "on": 0.0}  # V's RSS growth within the windows, MB

        def window(state: str, until) -> None:
            t, c, m = time.time(), cpu_s(v_pid), rss_mb(tmp / "victim")
            until()
            windows[state].append((t, time.time(), c, cpu_s(v_pid)))
            grew[state] += rss_mb(tmp / "victim") - m

        if seconds:  # on and off in turns of CYCLE_S, `seconds` on in all: both see the same background load
            for _ in range(max(1, round(seconds / CYCLE_S))):
                window("off", lambda: time.sleep(CYCLE_S))
                go.touch()
                window("on", lambda: time.sleep(CYCLE_S))
                go.unlink()
        else:  # one shot (cachefill): the baseline right before, then the attack to its end
            window("off", lambda: time.sleep(before_s))
            go.touch()
            window("on", lambda: attacker.wait(3600))
        t_attack = float(attacker.wait_line("ATTACKING ", 60).split()[1])
        assert attacker.wait(120) == 0, attacker.text()[-3000:]
        time.sleep(2.0)
        rows.stop.set()
        summary = json.loads((tmp / "attacker.json").read_text())
        answers = summary.pop("answer_s")
        on_s = sum(t1 - t for t, t1, _, _ in windows["on"])
        res = {"attack": name, "seed": seed, "args": extra, "attack_s": round(on_s, 1), "pinned": pin,
               "windows": len(windows["on"]), "before": rows.window(windows["off"]), "during": rows.window(windows["on"]),
               "rss_before_mb": rss_before, "rss_after_mb": rss_mb(tmp / "victim"),
               "rss_growth_mb": {k: round(v, 1) for k, v in grew.items()},
               "victim_cores_before": cpu_share(windows["off"]), "victim_cores_during": cpu_share(windows["on"]),
               "attacker": {**summary, "answer_s_median": statistics.median(answers) if answers else None},
               "wall_s": round(time.time() - t0, 1)}
        if summary["mode"] == "flood":
            res["graylisted_after_s"] = graylisted_after(tmp / "victim" / "node.log", t_attack)
            res["attacker"].pop("ids", None)
        return res
    finally:
        for p in procs:
            p.kill()
        print("work dir:", tmp, flush=True)


def growth(r: dict) -> str:
    g = r.get("rss_growth_mb")
    return "?" if not g else f"{g['off']:+.1f} / {g['on']:+.1f}"


def cores(c: dict | None) -> str:
    return "?" if not c else f"{c['python']:.2f} + {c['p2pd']:.2f}"


def table(runs: list[dict]) -> str:
    lines = ["| attack | trial | attack s (windows) | V median round s without / with | p99 without / with | "
             "rounds per 10 s without / with | V cores (python + p2pd) without / with | "
             "V RSS MB before / after (growth without / with) | attacker: sent, answered | other |",
             "|---|---:|---:|---|---|---|---|---|---|---|"]
    for r in runs:
        b, d, a = r["before"], r["during"], r["attacker"]
        other = (f"graylisted after {r.get('graylisted_after_s')} s" if a["mode"] == "flood" else
                 f"stored (cache, store) {a.get('stored_in_cache_true')}, {a.get('stored_in_cache_false')}; "
                 f"find {a.get('served')} records in {a.get('find_s')} s" if a["mode"] == "cachefill" else
                 f"{a.get('records_per_request')} records, {a.get('request_bytes', 0) / 1e6:.1f} MB a request; "
                 f"answer median {a.get('answer_s_median')} s")
        lines.append(f"| {r['attack']}{' (pinned)' if r.get('pinned') else ''} | {r['seed']} | {r['attack_s']} ({r.get('windows', 1)}) | "
                     f"{b['median_round_s']} / {d['median_round_s']} | "
                     f"{b['p99_round_s']} / {d['p99_round_s']} | {b['rounds_per_10s']} / {d['rounds_per_10s']} | "
                     f"{cores(r.get('victim_cores_before'))} / {cores(r.get('victim_cores_during'))} | "
                     f"{r['rss_before_mb']} / {r['rss_after_mb']} ({growth(r)}) | {a['sent']}, {a['answered']} | {other} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attacks", nargs="+", default=["bomb", "cachefill", "flood", "flood64"], choices=list(ATTACKS))
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--before", type=float, default=45.0, help="seconds of V's baseline right before each attack")
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--pin", action="store_true", help="V and H on all cores but the last, the attacker on the "
                                                        "last (taskset): on one machine, what a remote attacker "
                                                        "costs V rather than what its own CPU takes from V")
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args()
    path = Path(args.results)
    if args.table:
        print(table(load_runs(path)))
        return 0
    for seed in range(args.trials):
        for name in args.attacks:
            if any((r["attack"], r["seed"], r.get("pinned", False)) == (name, seed, args.pin) for r in load_runs(path)):
                continue
            res = trial(name, seed, args.before, args.pin)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"runs": load_runs(path) + [res]}, indent=1) + "\n")
            print(table([res]).splitlines()[-1], flush=True)
    print(table(load_runs(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

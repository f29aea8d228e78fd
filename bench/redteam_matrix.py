"""Issue 26's poisoning red-team matrix: every attacker kind of swarm_node/harness/poisoner.py against
V + H at the project defaults (redteam_poisoning.run_swarm), >= 3 seeds each, beside paired no-attack
baselines with the same seeds, so a kind's effect is its difference from the baseline of its seed.

    PYTHONPATH=. .venv/bin/python bench/redteam_matrix.py --seeds 0 1 2 --rounds 100 --until 11:15

Resumable: each cell (kind, seed) is appended to bench/results/redteam_matrix.json as soon as it ends
and a rerun skips the cells already there, so the run may be killed at any time (a killed cell is
redone). Polite on a shared machine: the process lowers its priority to nice 10 (its nodes inherit it),
runs one cell at a time, and before each cell waits, polling every 30 s, while a process of someone
else's CI, demo or pytest runs. No cell starts after --until (UTC, HH:MM). `--table` prints the table
of what exists and exits. The table, per kind: V's and H's held-out pass@1 at the last round minus the
baseline of the same seed (mean over the seeds, and the worst seed), the attack's and the honest
peer's shares of the groups V trained on from peers, V's implausible-positive fraction, and how many
neighbours V's mesh credited (mean over rounds of swarm/mesh_credited; H alone is 1).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench._common import load_runs  # noqa: E402
from bench.redteam_poisoning import guard_figures, honest_shares, run_swarm  # noqa: E402
from swarm_node.metrics import read_metrics  # noqa: E402
from swarm_node.status import read_status  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "redteam_matrix.json"
# kind -> (attacker processes, extra poisoner arguments), in the order the matrix runs them
KINDS = {
    "none": (0, ""),
    # the no-attack run again (the same ids, prompts and seeds, another secret reserve): how far two honest runs
    # of one seed land apart, the noise every other kind's difference carries
    "control": (0, ""),
    "forged": (2, ""),
    "skew": (2, ""), "slotkeep": (4, ""),
    "zeros": (2, ""), "noncanonical": (2, ""), "synonyms": (2, ""), "onepositive": (2, ""), "padded": (2, ""),
    "late": (2, ""), "junk": (2, ""),
    "format": (2, ""), "needle": (2, ""), "decoy": (2, ""),
    "ratchet": (2, "--safety 0 --floor -1.65 --floor2 -2.5 --switch-round 40"),
    # red team 2 (harness/poison_kinds.py): slot-keeping with all-wrong groups, correct-but-biased
    # teaching, and a peer that delivers one packet in 4 rounds
    "wrongkeep": (4, ""), "nocarry": (4, ""), "laggard": (1, "--ahead 2"),
    # session 27, against the guard's tenure: honest until round 40, then decoy's groups a pair of ids at a time
    "tagteam": (4, "--late-round 40"),
}
# kind+variant: the kind against V and H run with other settings (e.g. skew+cap), paired with the plain none
VARIANTS = {"cap": ["loss.peer_max_advantage=1.0"],
            # the demo-like batch (2 prompts a round, lr 2e-5), with the cap: compare with none+demo
            "demo": ["loss.peer_max_advantage=1.0", "rollout.prompts_per_round=2", "train.lr=2e-5"]}
BUSY = "ci/run|swarm-node demo|pytest"  # other people's work this machine is shared with
POLL_S = 30


def ours() -> set[int]:
    """This process and its descendants."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(c.pid for c in me.children(recursive=True))}


def others_busy() -> list[str]:
    out = subprocess.run(["pgrep", "-af", BUSY], capture_output=True, text=True, timeout=30).stdout.splitlines()
    mine = ours()
    return [line for line in out if int(line.split()[0]) not in mine]


def wait_for_quiet(until: dt.datetime) -> bool:
    """Sleep-poll every POLL_S while others' CI/demo/pytest run; False if `until` came first."""
    while (busy := others_busy()):
        if dt.datetime.now(dt.timezone.utc) >= until:
            return False
        print(f"{time.strftime('%H:%M:%S')} waiting: {busy[0][:100]}", flush=True)
        time.sleep(POLL_S)
    return dt.datetime.now(dt.timezone.utc) < until


def key(cell: dict) -> tuple:
    return cell["kind"], cell["seed"], cell["rounds"], cell["attackers"], cell["attacker_args"], cell.get("eval_limit", 200)


def backfill(path: Path, work_root: Path) -> int:
    """Add `honest_shares` and `guard_figures` to cells run before they were recorded, from the cell's
    work directory (the `redteam-<kind>-<seed>-*` under work_root whose victim log was last written
    nearest the cell's end)."""
    runs, done = load_runs(path), 0
    for cell in runs:
        if "honest_share_ge_25_frac" in cell and "victim_late_alone" in cell:
            continue
        end = dt.datetime.strptime(cell["finished"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()
        dirs = [d for d in work_root.glob(f"redteam-{cell['kind']}-{cell['seed']}-*") if (d / "victim" / "node.log").exists()]
        if not dirs:
            continue
        best = min(dirs, key=lambda d: abs((d / "victim" / "node.log").stat().st_mtime - end))
        if abs((best / "victim" / "node.log").stat().st_mtime - end) > 120:
            continue
        honest_id = (read_status(best / "honest") or {}).get("peer_id", "")
        cell.update(honest_shares((best / "victim" / "node.log").read_text(), honest_id))
        cell.update(guard_figures(*(read_metrics(best / node / "metrics.jsonl") for node in ("victim", "honest"))))
        done += 1
    path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return done


def late(cells: list[dict], base: list[dict], key: str) -> str:
    """Mean and worst paired difference of a node's late accuracy (guard_figures), in points."""
    d = [100 * (r[key] - b[key]) for r, b in zip(cells, base) if r.get(key) is not None and b.get(key) is not None]
    return f"{np.mean(d):+.1f}, {min(d):+.1f}" if d else "?"


def table(runs: list[dict], rounds: int, eval_limit: int = 200, base_kind: str = "none") -> str:
    """The markdown table of the matrix (kinds in KINDS order, then any others), each cell against
    `base_kind` of the same seed."""
    runs = [r for r in runs if r["rounds"] == rounds and r.get("eval_limit", 200) == eval_limit]
    base = {r["seed"]: r for r in runs if r["kind"] == base_kind}
    lines = ["| kind | seeds | V pass@1 end (baseline) | V - baseline: mean, worst | H pass@1 end (baseline) | "
             "H - baseline: mean, worst | attacker share | honest share | V steps honest >= 25 % (worst seed) | "
             "V steps without honest (most) | V implausible frac | V credited | V held-out, rounds 80-100 - baseline: "
             "mean, worst | H held-out, rounds 80-100 - baseline: mean, worst | V guard checks 80-100 - baseline: mean, worst | "
             "H guard checks - baseline: mean, worst | V guard checks, its alone copy's (mean) | V guard resets, rounds locked (mean) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    kinds = [k for k in KINDS if any(r["kind"] == k for r in runs)]
    kinds += sorted({r["kind"] for r in runs} - set(kinds))
    for kind in kinds:
        cells = [r for r in runs if r["kind"] == kind and (kind == base_kind or r["seed"] in base)]
        if not cells:
            continue
        b = [base[r["seed"]] if kind != base_kind else r for r in cells]
        v, vb = np.array([r["victim"][1] for r in cells]), np.array([r["victim"][1] for r in b])
        h, hb = np.array([r["honest"][1] for r in cells]), np.array([r["honest"][1] for r in b])
        shares = [(sum(n for p, n in r["groups_per_peer"].items() if p != "honest"), r["groups_per_peer"].get("honest", 0))
                  for r in cells]
        total = [max(a + o, 1) for a, o in shares]
        attack = np.mean([a / t for (a, _), t in zip(shares, total)])
        honest = np.mean([o / t for (_, o), t in zip(shares, total)])
        lines.append(f"| {kind} | {len(cells)} ({', '.join(str(r['seed']) for r in cells)}) | {v.mean():.3f} ({vb.mean():.3f}) | "
                     f"{(v - vb).mean():+.3f}, {(v - vb).min():+.3f} | {h.mean():.3f} ({hb.mean():.3f}) | "
                     f"{(h - hb).mean():+.3f}, {(h - hb).min():+.3f} | {attack:.2f} | {honest:.2f} | "
                     f"{min((r.get('honest_share_ge_25_frac', np.nan) for r in cells), default=np.nan):.2f} | "
                     f"{max((len(r['steps_without_honest']) for r in cells if 'steps_without_honest' in r), default='?')} | "
                     f"{np.mean([r['peer_implausible_frac_mean'] for r in cells]):.3f} | "
                     f"{np.mean([r.get('mesh_credited_mean', np.nan) for r in cells]):.2f} | "
                     f"{late(cells, b, 'victim_late_eval')} | {late(cells, b, 'honest_late_eval')} | "
                     f"{late(cells, b, 'victim_late')} | {late(cells, b, 'honest_late')} | "
                     f"{np.mean([r.get('victim_late', np.nan) for r in cells]):.3f}, "
                     f"{np.mean([r.get('victim_late_alone', np.nan) for r in cells]):.3f} | "
                     f"{np.mean([r.get('victim_guard_resets', np.nan) for r in cells]):.1f}, "
                     f"{np.mean([r.get('victim_lockdown_rounds', np.nan) for r in cells]):.0f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", nargs="+", default=list(KINDS),
                    choices=[*KINDS, *(f"{k}+{v}" for k in KINDS for v in VARIANTS)])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--until", default="23:59", help="UTC HH:MM: no cell starts after it")
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--eval-limit", type=int, default=200, help="held-out problems each node is scored on (the "
                                                                 "paired difference of one seed: SE ~0.05 at 200)")
    ap.add_argument("--base", default="none", help="the no-attack kind every cell is paired with (run first); "
                                                   "none+cap: the session-25 default cap under its old name")
    ap.add_argument("--table", action="store_true", help="print the table of the results and exit")
    ap.add_argument("--backfill", default=None, help="add the honest peer's per-step shares to cells run before "
                                                     "they were recorded, from their work dirs under this path")
    args = ap.parse_args()
    path = Path(args.results)
    if args.backfill:
        print(f"{backfill(path, Path(args.backfill))} cells backfilled")
    if args.table or args.backfill:
        print(table(load_runs(path), args.rounds, args.eval_limit, args.base))
        return 0
    os.nice(max(0, 10 - os.nice(0)))
    now = dt.datetime.now(dt.timezone.utc)
    hh, mm = map(int, args.until.split(":"))
    until = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    cells = [(kind, seed) for kind in [args.base, *[k for k in args.kinds if k != args.base]] for seed in args.seeds]
    for kind, seed in cells:
        base, _, variant = kind.partition("+")
        attackers, extra = KINDS[base]
        cell = {"kind": kind, "seed": seed, "rounds": args.rounds, "attackers": attackers, "attacker_args": extra,
                "eval_limit": args.eval_limit}
        if key(cell) in {key(r) for r in load_runs(path)}:
            continue
        if not wait_for_quiet(until):
            print(f"--until {args.until} reached: stopping before {kind} seed {seed}", flush=True)
            break
        print(f"{time.strftime('%H:%M:%S')} cell {kind} seed {seed}", flush=True)
        res = {**run_swarm(base, args.rounds, attackers, extra, seed, args.eval_limit, VARIANTS.get(variant, [])),
               "kind": kind, "eval_limit": args.eval_limit}
        runs = load_runs(path) + [res]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
        tmp.replace(path)
        print(f"{time.strftime('%H:%M:%S')} {kind} seed {seed}: V {res['victim']} H {res['honest']} "
              f"groups {res['groups_per_peer']} ({res['wall_s']} s)", flush=True)
    print(table(load_runs(path), args.rounds, args.eval_limit, args.base))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Red team of the un-teaching defences (loss.peer_negative_weight = 0, loss.peer_plausibility_margin = 1,
swarm.fair_wait_s = 2): tests/test_poisoning.py's swarm at the project defaults (tiny-s, 16 prompts a
round, lr 1e-4, G = 12, 800-step warm start, held-out n = 200: `poisoner.victim_args`) with an
adaptive attacker kind of swarm_node/harness/poisoner.py.

    PYTHONPATH=. SWARM_NODE_CACHE=/tmp/redteam-cache .venv/bin/python bench/redteam_poisoning.py --kind needle --rounds 80

Prints V's and H's held-out pass@1 at round 0 and at the end, the means of train/peer_negatives_frac and
train/peer_implausible_frac over V's steps, and the per-peer group counts of V's "trains on peer groups"
log lines; appends the result to bench/results/redteam_poisoning.json. bench/redteam_matrix.py runs
`run_swarm` over kinds and seeds.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from swarm_node.harness.poisoner import VICTIM_WARMSTART_STEPS, victim_args
from swarm_node.harness.process import NodeProcess, kept_identity
from swarm_node.harness.warmstart import public_warm_start
from swarm_node.status import read_status

ROOT = Path(__file__).resolve().parents[1]


def honest_shares(log: str, honest_id: str) -> dict:
    """From V's node.log: in how many of V's steps that trained on peer groups the honest peer supplied
    at least 25 % of them (issue 26: >= 90 % of steps), and the steps in which it supplied none."""
    steps = []
    for m in re.finditer(r"round (\d+) trains on peer groups (\{[^}]*\})", log):
        groups = {pid: int(n) for pid, n in re.findall(r"'?([\w]+)'?\s*:\s*(\d+)", m.group(2))}
        if sum(groups.values()):
            steps.append((int(m.group(1)), groups.get(honest_id, 0) / sum(groups.values())))
    return {"steps_with_peer_groups": len(steps),
            "honest_share_ge_25_frac": round(sum(s >= 0.25 for _, s in steps) / max(len(steps), 1), 3),
            "steps_without_honest": [r for r, s in steps if s == 0]}


LATE_CHECKS = 5  # the last guard checks and held-out evaluations averaged (rounds 80-100 of 100)
# V's and H's peer ids, one per seed, kept across cells: a node's prompts are its public schedule (its peer
# id, the run id and the round: SPEC 14.5), so a fixed id and run id give paired cells the same prompts
IDENTITIES = ROOT / "runs" / "redteam-identities"
LINGER_S = 1500  # V and H keep serving after their last round until both are done (then stopped); a cell fails after this


def guard_figures(v_rows: list[dict], h_rows: list[dict]) -> dict:
    """V's guard resets and rounds locked down, and each node's mean accuracy over its guard's last
    LATE_CHECKS checks and over its last LATE_CHECKS held-out evaluations (rounds 80-100): where
    training ended, steadier than one evaluation (a tiny model's score swings by 10 points from one
    check to the next); and that of V's alone copy."""
    def late(rows, key):  # the mean of the last LATE_CHECKS values of `key` after round 0, if there are as many
        values = [r[key] for r in rows if key in r and r["round"] > 0][-LATE_CHECKS:]
        return round(float(np.mean(values)), 4) if len(values) == LATE_CHECKS else None

    return {"victim_late_eval": late(v_rows, "eval/accuracy"), "honest_late_eval": late(h_rows, "eval/accuracy"),
            "victim_guard_resets": max((r.get("guard/resets", 0) for r in v_rows), default=0),
            "victim_lockdown_rounds": sum(1 for r in v_rows if r.get("guard/lockdown_rounds", 0) > 0),
            "victim_late": late(v_rows, "guard/mixed_accuracy"), "honest_late": late(h_rows, "guard/mixed_accuracy"),
            "victim_late_alone": late(v_rows, "guard/alone_accuracy")}


def run_swarm(kind: str, rounds: int, attackers: int, attacker_args: str = "", seed: int = 0,
              eval_limit: int | None = None, victim_sets: list[str] = ()) -> dict:
    """V + H + `attackers` poisoner processes of `kind` for `rounds` rounds; V's and H's held-out pass@1 at
    round 0 and at the end (on `eval_limit` problems; None: victim_args' 200), V's defence metrics and the
    groups per peer of V's steps. Seed s: V trains with train.seed 2s, H with 2s + 1, attacker k with
    --seed 10s + k (s = 0: this script's old runs); V and H keep one peer id per seed (IDENTITIES) and the
    run id is the seed's, so every kind's V and H answer the same prompts as in the no-attack cell.
    `victim_sets`: config settings of both V and H (`key=value`, a variant of the defences)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"redteam-{kind}-{seed}-"))
    run, model = f"redteam-{seed}", public_warm_start(VICTIM_WARMSTART_STEPS)
    ident = lambda role: ["--set", f"swarm.identity={kept_identity(IDENTITIES, f'{role}-{seed}')}"]  # noqa: E731
    started, t0 = [], time.time()
    # every 5 rounds: the mean of the last 5 evaluations is where a run ended, without one snapshot's swing
    evaluate = ["--set", "train.eval_every=5", *(["--set", f"task.eval_limit={eval_limit}"] if eval_limit is not None else [])]
    # V and H serve their last packet until both are done: the one left alone used to wait the 20 s deadline
    # for the other each round (alone_wait_s=null, so that V waits for H at the start): 766-863 s cells
    evaluate += ["--set", f"swarm.linger_s={LINGER_S}", *(x for s in victim_sets for x in ("--set", s))]
    try:
        v = NodeProcess.join([*victim_args(rounds), *evaluate, *ident("victim"), "--run-id", run,
                              "--set", f"train.seed={2 * seed}"], tmp / "victim")
        started.append(v.start())
        h = NodeProcess.join([*victim_args(rounds), *evaluate, *ident("honest"), "--run-id", run,
                              "--set", f"train.seed={2 * seed + 1}", "--peers", v.address()], tmp / "honest")
        started.append(h.start())
        evils = []
        for k in range(attackers):
            e = NodeProcess([sys.executable, "-m", "swarm_node.harness.poisoner", "--kind", kind, "--peers",
                             v.address(), "--run-id", run, "--model", model, "--groups", "16", "--seconds", "1500",
                             "--seed", str(10 * seed + k), "--summary", str(tmp / f"attacker{k}.json"),
                             *attacker_args.split()], log=tmp / f"attacker{k}.log")
            started.append(e.start())
            evils.append(e)
        ids = [e.wait_line("ATTACKER ", 300).split()[1] for e in evils]
        for node in (v, h):
            node.wait_rows(lambda rows: len(rows) > rounds, LINGER_S, f"{node.name}'s {rounds} rounds")
        for node in (v, h):
            node.stop()
        for e in evils:
            e.popen.terminate()
            e.wait(60)
        v_rows, h_rows = v.rows(), h.rows()
        summaries = [json.loads((tmp / f"attacker{k}.json").read_text()) for k in range(attackers)]
        log = (tmp / "victim" / "node.log").read_text() if (tmp / "victim" / "node.log").exists() else ""
        per_peer: collections.Counter = collections.Counter()
        n_lines = 0
        for m in re.finditer(r"round \d+ trains on peer groups (\{[^}]*\})", log):
            n_lines += 1
            for pid, n in re.findall(r"'?([\w]+)'?\s*:\s*(\d+)", m.group(1)):
                per_peer[pid] += int(n)
        label = {i: f"attacker{k}" for k, i in enumerate(ids)}
        per_peer_named = {label.get(p, "honest"): n for p, n in per_peer.items()}
        mean = lambda key: float(np.mean([r.get(key, 0.0) for r in v_rows[1:]]))  # noqa: E731
        return {"kind": kind, "seed": seed, "attackers": attackers, "attacker_args": attacker_args, "rounds": rounds,
                "victim": [v_rows[0]["eval/accuracy"], v_rows[-1]["eval/accuracy"]],
                "honest": [h_rows[0]["eval/accuracy"], h_rows[-1]["eval/accuracy"]],
                "victim_rounds": len(v_rows) - 1,
                "peer_negatives_frac_mean": mean("train/peer_negatives_frac"),
                "peer_implausible_frac_mean": mean("train/peer_implausible_frac"),
                "peer_groups_used": int(sum(r.get("swarm/peer_groups_used", 0) for r in v_rows[1:])),
                "mesh_credited_mean": mean("swarm/mesh_credited"),
                "trains_on_lines": n_lines, "groups_per_peer": per_peer_named,
                **honest_shares(log, (read_status(tmp / "honest") or {}).get("peer_id", "")),
                **guard_figures(v_rows, h_rows),
                "attacker_screen": [s.get("screen") for s in summaries],
                "attacker_floor_estimate": [s.get("floor_estimate") for s in summaries],
                "attacker_rounds_offered": [len(s["rounds"]) for s in summaries],
                "wall_s": round(time.time() - t0, 1), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    finally:
        for p in started:
            p.kill()
        print("work dir:", tmp)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", required=True)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--attackers", type=int, default=1, help="attacker processes (distinct peer ids)")
    ap.add_argument("--attacker-args", default="", help="extra arguments for swarm_node.harness.poisoner")
    ap.add_argument("--seed", type=int, default=0, help="run_swarm's seed")
    ap.add_argument("--results", default=str(ROOT / "bench" / "results" / "redteam_poisoning.json"))
    args = ap.parse_args()
    res = run_swarm(args.kind, args.rounds, args.attackers, args.attacker_args, args.seed)
    print(json.dumps(res, indent=1))
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    allres = json.loads(path.read_text()) if path.exists() else []
    (allres["runs"] if isinstance(allres, dict) else allres).append(res)
    path.write_text(json.dumps(allres, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

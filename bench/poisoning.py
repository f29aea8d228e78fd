"""Benchmark — poisoning with packets that pass every check (issue 18, point 1), and the defences.

Real processes on 127.0.0.1: a victim `swarm-node join` node (tiny-s, arith, warm start 600, the
tiny presets' lr 2e-5, G = 12, 2 prompts per round), an honest peer of the same kind, and the
attacker (swarm_node/harness/poisoner.py): one peer offering, every round, a packet of 24 groups with
one correct completion claiming generator log-prob 0 and 11 wrong ones (right answer line + junk)
claiming log-probs just below the victim's own (full TIS weight C = 2, divergence ~10 < g = 50).

Configurations (the loss settings apply to both honest nodes):
    baseline            no attacker, default loss
    a_share             attacker; defence (a) only: the bounded peer share (already the default)
    b_neg_cap           attacker; (b) loss.C_negative = 1: a negative sample is never up-weighted
    b_sign_weights      attacker; (b) C_negative = 1 and loss.positive_floor = 1: negatives never
                        up-weighted, positives never down-weighted
    c_certain           attacker; (c) loss.check_certain_claims: all-zero claimed log-probs -> on-policy
    bc                  attacker; C_negative = 1 and check_certain_claims
    baseline_<name>     no attacker, the defence <name>: what it costs honest learning
    unbounded           attacker, the earlier peer-heavy mix (peer_groups_per_own 12, max_peer_share 1):
                        the issue's setting, to show the attack works at all
    unbounded_sign_weights  the same with the (b) sign-aware weights

Exposure: with an attacker both honest nodes set swarm.min_peers = 2, so each step waits for the
attacker's packet as well as the honest peer's (with min_peers = 1 the first packet ends the wait and
the attacker's group reached only 8-17 of 100 steps); without one, min_peers = 1 (one peer exists).
The attacker offers 3 rounds ahead, so it is never the one that is late.

Per run: held-out pass@1 (n = 200) of both honest nodes at round 0 and after the last round.
Results are cached per (config, seed) in the results file as soon as a run ends, so an interrupted
benchmark resumes where it stopped.

    .venv/bin/python bench/poisoning.py --seeds 0 1 2 --rounds 100          # ~10 min per run on 2 cores
    .venv/bin/python bench/poisoning.py --configs baseline a_share --seeds 0 --rounds 30
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402
from swarm_node.harness.process import NodeProcess  # noqa: E402
from swarm_node.harness.warmstart import public_warm_start  # noqa: E402
from swarm_node.metrics import read_metrics  # noqa: E402

CONFIGS: dict[str, tuple[bool, list[str]]] = {  # name -> (attacker?, config overrides of both honest nodes)
    "baseline": (False, []),
    "a_share": (True, []),
    "b_neg_cap": (True, ["loss.C_negative=1.0"]),
    "b_sign_weights": (True, ["loss.C_negative=1.0", "loss.positive_floor=1.0"]),
    "c_certain": (True, ["loss.check_certain_claims=true"]),
    "bc": (True, ["loss.C_negative=1.0", "loss.check_certain_claims=true"]),
}
# the mix before the bounded share (24 peer slots against 2 own groups, one peer may fill them all):
# shows the attack itself works, and whether a loss defence holds without the share bound
UNBOUNDED = ["swarm.peer_groups_per_own=12", "swarm.max_peer_share=1.0"]
CONFIGS["unbounded"] = (True, UNBOUNDED)
CONFIGS["unbounded_sign_weights"] = (True, UNBOUNDED + CONFIGS["b_sign_weights"][1])
for _name in ("b_neg_cap", "b_sign_weights", "c_certain", "bc"):
    CONFIGS[f"baseline_{_name}"] = (False, CONFIGS[_name][1])

NODE = ["--model", "tiny-s", "--task", "arith", "--set", "train.lr=2e-5", "--set", "train.warmstart_steps=600",
        "--set", "task.eval_limit=200", "--set", "train.eval_every=0", "--set", "train.checkpoint_every=0",
        "--set", "threads=1", "--set", "swarm.deadline_s=20",
        "--set", "swarm.fetch_timeout_s=5", "--set", "swarm.linger_s=5"]


def summarize_node(out: Path) -> dict:
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "ood/accuracy" not in r]
    trained = [r for r in rows if r["round"] > 0]
    mean = lambda key: statistics.fmean([r.get(key, 0.0) for r in trained]) if trained else None  # noqa: E731
    return {"acc_start": rows[0].get("eval/accuracy"), "acc_end": rows[-1].get("eval/accuracy"),
            "rounds": rows[-1]["round"], "peer_groups_used_mean": mean("swarm/peer_groups_used"),
            "train_reward_mean": mean("reward/mean"), "peer_reward_mean": mean("peer/reward/mean"),
            "truncated_frac_mean": mean("is/truncated_frac"), "certain_claims_frac_mean": mean("filter/certain_claims_frac"),
            "round_s_mean": mean("time/round_s"),
            # rounds whose batch held a group with most tokens' claimed ratio above C: the attacker's
            # (honest peers' groups almost never do); a proxy, the metrics do not name a group's source
            "forged_rounds": sum(r.get("is/truncated_frac", 0.0) >= 0.2 for r in trained)}


def run_one(name: str, seed: int, rounds: int, work: Path, model: str) -> dict:
    """Victim + honest peer (+ attacker) for `rounds` rounds; both honest nodes' summaries."""
    attack, loss = CONFIGS[name]
    tmp = work / f"{name}-s{seed}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    run_id = f"poison-{name}-{seed}-{os.getpid()}"
    overrides = [*loss, f"swarm.min_peers={2 if attack else 1}"]
    common = [*NODE, "--rounds", str(rounds), "--run-id", run_id, *[a for kv in overrides for a in ("--set", kv)]]
    procs = []
    t0 = time.time()
    try:
        victim = NodeProcess.join([*common, "--set", f"train.seed={2 * seed}"], tmp / "victim").start()
        procs.append(victim)
        addr = victim.address(300)
        honest = NodeProcess.join([*common, "--set", f"train.seed={2 * seed + 1}", "--peers", addr], tmp / "honest").start()
        procs.append(honest)
        if attack:  # both honest nodes wait for 2 peers: the attacker's packet is in every step it can be
            procs.append(NodeProcess([sys.executable, "-m", "swarm_node.harness.poisoner", "--peers", addr, "--run-id",
                                      run_id, "--model", model, "--seed", str(seed), "--summary", str(tmp / "attacker.json")],
                                     log=tmp / "attacker.log").start())
        for proc in (victim, honest):
            if proc.wait(rounds * 60 + 600) != 0:
                raise RuntimeError(f"{proc.name} exited {proc.popen.returncode}: {proc.text(30)}")
    finally:
        for proc in reversed(procs):
            proc.stop(grace_term=30)
    result = {"config": name, "seed": seed, "rounds": rounds, "attack": attack, "overrides": loss,
              "wall_s": round(time.time() - t0, 1),
              "victim": summarize_node(tmp / "victim"), "honest": summarize_node(tmp / "honest")}
    if attack and (tmp / "attacker.json").exists():
        result["attacker"] = {"packets": len(json.loads((tmp / "attacker.json").read_text())["rounds"])}
    return result


def aggregate(runs: list[dict]) -> list[dict]:
    """Per config: mean over seeds of the two honest nodes' final accuracy, and the gap to baseline."""
    by: dict[tuple[str, int], list[dict]] = {}
    for r in runs:
        by.setdefault((r["config"], r["rounds"]), []).append(r)
    rows = []
    for (name, rounds), rs in sorted(by.items()):
        ends = [statistics.fmean([r["victim"]["acc_end"], r["honest"]["acc_end"]]) for r in rs]
        starts = [statistics.fmean([r["victim"]["acc_start"], r["honest"]["acc_start"]]) for r in rs]
        row = {"config": name, "rounds": rounds, "seeds": [r["seed"] for r in rs],
               "acc_start": round(statistics.fmean(starts), 4), "acc_end": round(statistics.fmean(ends), 4),
               "victim_end": [r["victim"]["acc_end"] for r in rs], "honest_end": [r["honest"]["acc_end"] for r in rs],
               "forged_rounds": [r["victim"].get("forged_rounds") for r in rs]}
        # paired by seed: against the plain no-attack run, and against the no-attack run with the same defence
        for key, base_name in (("vs_baseline", "baseline"), ("vs_same_loss_no_attack", f"baseline_{name}")):
            base = {b["seed"]: statistics.fmean([b["victim"]["acc_end"], b["honest"]["acc_end"]])
                    for b in runs if b["config"] == base_name and b["rounds"] == rounds}
            paired = [e - base[r["seed"]] for r, e in zip(rs, ends) if r["seed"] in base]
            row[key] = round(statistics.fmean(paired), 4) if paired else None
            row[key + "_seeds"] = len(paired)
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", nargs="+", default=["baseline", "a_share", "unbounded",
                    "unbounded_sign_weights", "b_sign_weights", "baseline_b_sign_weights"], choices=sorted(CONFIGS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--work", default="/tmp/swarm-node-poisoning", help="node output directories (not kept)")
    ap.add_argument("--out", default=str(C.RESULTS_DIR / "poisoning.json"))
    ap.add_argument("--stop-at", type=float, default=None, help="unix time: start no run after it")
    ap.add_argument("--resummarize", action="store_true", help="recompute the cached runs' summaries from --work")
    args = ap.parse_args()
    C.single_thread()
    started, info = time.time(), C.machine_info()
    path = Path(args.out)
    previous = json.loads(path.read_text()) if path.exists() else {}
    runs = previous.get("runs", [])
    kept = {k: previous[k] for k in ("earlier_runs_min_peers_1",) if k in previous}  # the weaker exposure, kept
    if args.resummarize:
        for r in runs:
            tmp = Path(args.work) / f"{r['config']}-s{r['seed']}"
            for who in ("victim", "honest"):
                rows = tmp / who / "metrics.jsonl"
                if rows.exists() and summarize_node(tmp / who)["rounds"] == r["rounds"]:
                    r[who] = summarize_node(tmp / who)
        args.configs = []
    model = public_warm_start(600)
    for seed in args.seeds:  # seed-major: every config gets a seed before any gets a second
        for name in args.configs:
            if any(r["config"] == name and r["seed"] == seed and r["rounds"] == args.rounds for r in runs):
                continue
            if args.stop_at is not None and time.time() > args.stop_at:
                print(f"stop time reached: {name} seed {seed} not run", flush=True)
                continue
            print(f"{time.strftime('%H:%M:%S')} run {name} seed {seed} ({args.rounds} rounds)", flush=True)
            result = run_one(name, seed, args.rounds, Path(args.work), model)
            print(f"  -> victim {result['victim']['acc_start']} -> {result['victim']['acc_end']}, "
                  f"honest {result['honest']['acc_start']} -> {result['honest']['acc_end']} ({result['wall_s']} s)", flush=True)
            runs.append(result)
            C.write_results("poisoning", {"summary": aggregate(runs)}, args, info, started, out=path, runs=runs, **kept)
    summary = aggregate(runs)
    C.write_results("poisoning", {"summary": summary}, args, info, started, out=path, runs=runs, **kept)
    C.print_table("held-out pass@1 (n=200), mean of both honest nodes", ["config", "rounds", "seeds", "start", "end",
                  "vs baseline", "vs same loss, no attack"],
                  [[s["config"], s["rounds"], s["seeds"], s["acc_start"], s["acc_end"], s["vs_baseline"],
                    s["vs_same_loss_no_attack"]] for s in summary])
    return 0


if __name__ == "__main__":
    sys.exit(main())

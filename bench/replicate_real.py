"""The paper's claims on a real pretrained model: SmolLM2-135M-Instruct in two pairs of nodes.

`--pair smollm2` is the paper's trainable-parameter pair (arXiv 2605.22537): one node fine-tunes
every weight (lr 1e-5), the other trains LoRA r = 128 on the query and value projections (lr 1e-4,
alpha = 2r); no warm start, the instruct model is prompted with arith's worked exchange
(tasks/arith.py). `--pair smollm2-expertise`: two full fine-tunes (lr 1e-5), each first given
REAL_WARM_STEPS (100) supervised steps on addition only or on subtraction only, then RL-trained on both. Same
settings as bench/replicate.py where they apply: G = 12, a step of 24 sequences (alone: 2 own
groups; in a swarm: 1 own + 1 peer group, vertical; horizontal as the paper's, each node half of
every group), C = 2, g = 50 unless varied, the paper's TIS weights and every peer's negatives
(loss.C_negative = None, positive_floor = 0, peer_negative_weight = 1, no plausibility check, each
node trusting the other: ids as sampled, never retokenized), 50 rounds, greedy pass@1 on held-out
arith problems at rounds 0, 25 and 50, and after round 50 on out-of-distribution ones (sums and
differences of two 2-digit numbers; training has a 1-digit second operand: OOD as bench/replicate.py's).

One worker process per (arm, seed) holds both nodes, each `swarm_node.node.run` on its own
thread. A swarm arm's nodes exchange packets over `MemoryTransport` (net/memory.py): the wire
format, admission, mesh and collect loop of the libp2p transport, without sockets, so the study
runs where hivemind is not installed (the GPU machine lent to this project has none). The second
node starts once the first has loaded (transformers' loading is not thread-safe).

    python bench/replicate_real.py --device cuda --jobs 21 --eval-limit 500   # the plan, claims 1 and 4 first
    python bench/replicate_real.py --device cuda --pair smollm2-expertise --arms alone nois f-tis --seeds 0 1 2
    python bench/replicate_real.py --device cpu --rounds 2 --seeds 0 --arms alone f-tis --eval-limit 8  # smoke
    (the same with --pair smollm2-expertise --warm-steps 2 --results /tmp/x: the expertise pair's smoke)
    python bench/replicate_real.py --summary                           # tables from the results only
    bash bench/gpu_loan.sh stash | study ARGS    # on a lent GPU that reaches no registry: the model in two calls
    python bench/replicate.py --render          # docs/REPLICATION.md, the real-model section included

Results: bench/results/replication/real/ (real-expertise/ for the expertise pair), one JSON per
(arm, seed): per node, evaluations and the per-round off-policy statistics. Resumable: a run whose
JSON exists is skipped. A run cut off by --budget-s keeps the evaluations it reached (marked
"complete": false); the report counts only runs whose nodes reached round 50.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench.replicate import KEEP  # noqa: E402
from bench.replicate_study import (ARMS, OOD, PAPER_HORIZONTAL, REAL_FOLDERS, REAL_PAIRS, REAL_ROUNDS,  # noqa: E402
                                   REAL_WARM_STEPS, REPO, G)

RUNS = REPO / "runs" / "replicate_real"
MODEL = "smollm2-135m"
# node name -> recipe: learning rate, LoRA rank (0: every weight), seed index, and for the expertise
# pair the operations of its supervised warm start (--warm-steps on them alone, before RL on both)
NODES = {"smollm2": {"full": {"lr": 1e-5, "lora_r": 0, "index": 1}, "lora": {"lr": 1e-4, "lora_r": 128, "index": 2}},
         "smollm2-expertise": {"plus": {"lr": 1e-5, "lora_r": 0, "index": 3, "warm_ops": ["plus"]},
                               "minus": {"lr": 1e-5, "lora_r": 0, "index": 4, "warm_ops": ["minus"]}}}
WARM = {"train.warmstart_lr": 3e-5, "train.warmstart_batch": 16}  # and --warm-steps (REAL_WARM_STEPS)
# claims 1 (NoIS < alone) and 4 (F-TIS ~ alone) need the most seeds: they run first
PLAN = [("alone", 8), ("nois", 8), ("f-tis", 8), ("f-nois", 8), ("f-vis", 5),
        ("horizontal", 5), ("g5", 5), ("g10", 3), ("g100", 3)]


def overrides(args, node: str, arm: str, seed: int, out: Path, model: str = MODEL) -> list[str]:
    variant, mode, g = ARMS[arm]
    spec = NODES[args.pair][node]
    sets = {"name": node, "threads": 1, "out": str(out), "model.name": model, "model.device": args.device,
            "model.lora_r": spec["lora_r"], "train.lr": spec["lr"], "train.seed": 100 * seed + spec["index"],
            "train.rounds": args.rounds, "train.eval_every": args.eval_every, "train.checkpoint_every": 0,
            "train.warmstart_steps": 0, "task.name": "arith", "task.eval_limit": args.eval_limit,
            "task.ood_task": "arith", "task.ood_options": OOD,
            "rollout.group_size": G, "rollout.max_new_tokens": 24, "rollout.temperature": 1.0,
            "rollout.prompts_per_round": 2 if mode is None else 1,
            "loss.variant": variant, "loss.g": g, "loss.C": 2.0, "loss.C_negative": None, "loss.positive_floor": 0.0,
            "loss.peer_negative_weight": 1.0, "loss.peer_plausibility_margin": None, "loss.peer_max_advantage": None}
    if mode == "horizontal":
        sets.update(PAPER_HORIZONTAL)
    if mode is not None:
        sets.update({"swarm.mode": mode, "swarm.run_id": f"real-{arm}-s{seed}", "swarm.peer_groups_per_own": 1.0,
                     "swarm.min_peers": 1, "swarm.deadline_s": 120.0, "swarm.linger_s": 5.0,
                     "swarm.alone_wait_s": None,
                     # the paper's peers are trusted: their ids as sampled, no retokenization (swarm/admit.py)
                     "swarm.trusted_peers": [f"Qm{other}" for other in NODES[args.pair] if other != node]})
    return [f"{k}={json.dumps(v)}" for k, v in sets.items()]


def warm_model(args, node: str) -> str:
    """The node's starting model: the instruct model, or for the expertise pair its warm start
    (--warm-steps supervised steps on the node's operations alone; cached: every run shares it)."""
    ops = NODES[args.pair][node].get("warm_ops")
    if ops is None:
        return MODEL
    from swarm_node.config import load_config
    from swarm_node.tasks import load_task
    from swarm_node.train.warmstart import warmstarted_model

    sets = {"model.name": MODEL, "model.device": args.device, "task.name": "arith", "task.options": {"ops": ops},
            "train.warmstart_steps": args.warm_steps, **WARM}
    cfg = load_config(None, [f"{k}={json.dumps(v)}" for k, v in sets.items()])
    return warmstarted_model(cfg, load_task("arith", **cfg.task.options))


# ------------------------------------------------------------------------------------------ worker
def worker(args, arm: str, seed: int) -> None:
    """Both nodes of one (arm, seed), one thread each; a swarm arm shares one MemoryNetwork."""
    from swarm_node.config import load_config
    from swarm_node.net.memory import MemoryNetwork, MemoryTransport
    from swarm_node.node import run
    from swarm_node.status import read_status

    network, errors, threads = MemoryNetwork(), [], []
    run_dir = RUNS / args.pair / f"{arm}-s{seed}"
    for node in NODES[args.pair]:
        cfg = load_config(None, overrides(args, node, arm, seed, run_dir / node, warm_model(args, node)))
        connect = None if ARMS[arm][1] is None else (
            lambda model_id, tok, name=node, swarm=cfg.swarm: MemoryTransport(network, f"Qm{name}", model_id, tok,
                                                                              cfg=swarm))

        def target(cfg=cfg, connect=connect):
            try:
                run(cfg, connect=connect)
            except BaseException as e:  # noqa: BLE001 - reported by the worker's exit code
                errors.append(f"{cfg.name}: {type(e).__name__}: {e}")
        thread = threading.Thread(target=target, name=node, daemon=True)
        thread.start()
        threads.append(thread)
        deadline = time.time() + 600
        while thread.is_alive() and time.time() < deadline:  # the next node loads once this one runs
            if (read_status(run_dir / node) or {}).get("state") == "running":
                break
            time.sleep(0.5)
    for thread in threads:
        thread.join()
    if errors:
        raise SystemExit("; ".join(errors))


# ------------------------------------------------------------------------------------------ parent
def run_path(results: Path, arm: str, seed: int) -> Path:
    return results / f"{arm}-s{seed}.json"


def record(pair: str, arm: str, seed: int, seconds: float, complete: bool) -> dict | None:
    """The run's JSON from its nodes' metrics.jsonl (None if no node reached an evaluation)."""
    from swarm_node.metrics import read_metrics

    nodes = []
    for node in NODES[pair]:
        path = RUNS / pair / f"{arm}-s{seed}" / node / "metrics.jsonl"
        rows = [r for r in read_metrics(path) if "round" in r] if path.exists() else []
        ood = [r["ood/accuracy"] for r in rows if "ood/accuracy" in r]
        rows = [r for r in rows if "ood/accuracy" not in r]
        evals = [(r["round"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
        if len(evals) < 2:
            return None
        nodes.append({"node": node, "start": evals[0][1], "final": evals[-1][1], "final_round": evals[-1][0],
                      "curve": evals, "eval_n": rows[0].get("eval/n"), **({"ood": ood[0]} if ood else {}),
                      "rows": [{k: round(r[k], 4) if isinstance(r[k], float) else r[k] for k in KEEP if k in r}
                               for r in rows]})
    variant, mode, g = ARMS[arm]
    return {"arm": arm, "seed": seed, "model": MODEL, "variant": variant, "mode": mode or "alone", "g": g,
            "seconds": round(seconds, 1), "complete": complete, "nodes": nodes}


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else device


def study(args) -> None:
    todo = [(arm, seed) for arm, n in PLAN if arm in args.arms for seed in range(n) if seed in args.seeds
            and not run_path(args.results, arm, seed).exists()]
    print(f"{len(todo)} runs to do, {args.jobs} at a time", flush=True)
    deadline = time.time() + args.budget_s
    running: dict[tuple[str, int], tuple[subprocess.Popen, float]] = {}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "study.json").write_text(json.dumps({  # where and how, for the report's setup line
        "device": device_name(args.device), "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python bench/replicate_real.py " + " ".join(sys.argv[1:])}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    for node in NODES[args.pair] if todo else []:  # warm starts once, here, not in every worker at once
        print(f"{node} starts from {warm_model(args, node)}", flush=True)
    runs = RUNS / args.pair
    while todo or running:
        while todo and len(running) < args.jobs and time.time() < deadline:
            arm, seed = todo.pop(0)
            (runs / f"{arm}-s{seed}").mkdir(parents=True, exist_ok=True)
            log = open(runs / f"{arm}-s{seed}" / "worker.log", "w")
            argv = [sys.executable, __file__, "--worker", arm, str(seed), *sys.argv[1:]]
            running[(arm, seed)] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO),
                                    time.time())
        if time.time() >= deadline:
            todo = []
        for key, (proc, started) in list(running.items()):
            out_of_time = time.time() >= deadline
            if proc.poll() is None and not out_of_time:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            del running[key]
            rec = record(args.pair, *key, time.time() - started, complete=proc.returncode == 0)
            if rec is None:
                print(f"  {key[0]}/seed {key[1]}: no result (exit {proc.returncode})", flush=True)
                continue
            run_path(args.results, *key).write_text(json.dumps(rec, separators=(",", ":")))
            print(f"  {key[0]}/seed {key[1]}: " + ", ".join(
                f"{n['node']} {100 * n['start']:.1f}->{100 * n['final']:.1f}% (round {n['final_round']})"
                for n in rec["nodes"]) + f" [{rec['seconds']:.0f} s]", flush=True)
        time.sleep(1)


# ------------------------------------------------------------------------------------------ summary
def t_interval(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{100 * xs[0]:+.1f}" if xs else "-"
    half = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}.get(len(xs) - 1, 2.0) * statistics.stdev(xs) / math.sqrt(len(xs))
    m = statistics.mean(xs)
    return f"{100 * m:+.1f} [{100 * (m - half):+.1f}, {100 * (m + half):+.1f}] (n={len(xs)})"


def paired(run: dict, alone: dict, i: int) -> float | None:
    """Node i's pass@1 in `run` minus alone's, at the last evaluation round both reached (a run cut
    by --budget-s is compared where it stopped, not with alone's later rounds)."""
    ours, theirs = dict(map(tuple, run["nodes"][i]["curve"])), dict(map(tuple, alone["nodes"][i]["curve"]))
    common = sorted(set(ours) & set(theirs) - {0})
    return ours[common[-1]] - theirs[common[-1]] if common else None


def summary(results: Path) -> None:
    """Per node: each arm's final pass@1, and its seed-paired difference from alone (claims 1-4)."""
    runs = {(r["arm"], r["seed"]): r for r in (json.loads(p.read_text()) for p in sorted(results.glob("*-s*.json")))}
    for i, node in enumerate(next(iter(runs.values()))["nodes"] if runs else []):
        node = node["node"]
        print(f"\n{node}: final pass@1 by arm, and seed-paired difference from alone (points, 95% t-interval)")
        for arm, _ in PLAN:
            finals = {s: r["nodes"][i]["final"] for (a, s), r in runs.items() if a == arm}
            if not finals:
                continue
            diffs = [d for s in finals if ("alone", s) in runs
                     for d in [paired(runs[(arm, s)], runs[("alone", s)], i)] if d is not None]
            ratio = [row["is/ratio_mean"] for (a, s), r in runs.items() if a == arm
                     for row in r["nodes"][i]["rows"] if "is/ratio_mean" in row]
            print(f"  {arm:7s} mean {100 * statistics.mean(finals.values()):5.1f}% over {len(finals)} seeds; "
                  f"vs alone {t_interval(diffs) if arm != 'alone' else '-'}; "
                  f"is/ratio_mean {statistics.mean(ratio) if ratio else float('nan'):.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--rounds", type=int, default=REAL_ROUNDS)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-limit", type=int, default=200)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--arms", nargs="+", default=[a for a, _ in PLAN], choices=[a for a, _ in PLAN])
    p.add_argument("--jobs", type=int, default=2, help="worker processes at once (each holds two nodes)")
    p.add_argument("--budget-s", type=float, default=7200, help="kill what runs after this many seconds")
    p.add_argument("--pair", default="smollm2", choices=list(REAL_PAIRS),
                   help="smollm2: full fine-tuning + LoRA r = 128 (the paper's trainable pair); smollm2-expertise: "
                        "two full fine-tunes warm-started on addition only and on subtraction only")
    p.add_argument("--warm-steps", type=int, default=REAL_WARM_STEPS, help="the expertise pair's supervised steps "
                   "(fewer only for a smoke run: the report describes the default)")
    p.add_argument("--results", type=Path, help="where each run's JSON goes (default: the pair's folder in "
                                                 "bench/results/replication/)")
    p.add_argument("--summary", action="store_true", help="only print the tables from the results")
    p.add_argument("--worker", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    args = p.parse_args()
    args.results = args.results or REAL_FOLDERS[args.pair]
    if args.worker:
        return worker(args, args.worker[0], int(args.worker[1]))
    if not args.summary:
        study(args)
    summary(args.results)


if __name__ == "__main__":
    main()

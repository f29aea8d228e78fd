"""The paper's six claims (F-TIS, arXiv 2605.22537) re-tested in miniature on this CPU.

Every arm is real: a swarm arm is two `swarm-node join` processes on 127.0.0.1 (the first starts
the swarm, the second joins with --peers read from the first one's OUT/status.json), an "alone"
arm is one `swarm-node train` process per node. Same seeds in every arm (paired design), the
paper's batch of 24 sequences per step (in a swarm 1 own + 1 peer group of G = 12:
prompts_per_round=1, swarm.peer_groups_per_own=1; alone 2 own groups), held-out greedy pass@1
on the 500 arith test problems, and an
out-of-distribution set (second operand 10..99, never trained on) evaluated here from each
node's final checkpoint.

    python bench/replicate.py --quick      # smoke run, <= 10 min: 1 seed, 3 arms, size pair
    python bench/replicate.py              # the study (resumes: finished runs are skipped)
    python bench/replicate.py --render     # only re-render docs/REPLICATION.md from the JSON
    python bench/replicate.py --seeds 5 --arms alone,f-tis,f-tis-open   # more seeds for some arms
    python bench/replicate.py --arms alone,f-tis,f-tis-open --seeds 5 --results bench/results/replication_s26
                                           # the same arms again on newer code, beside the study (its own page)

Scale (full): 3 seeds x (9 size arms + 4 trainable + 4 expertise), 100 rounds, evaluation on 500
every 25 rounds, OOD on 500: 42 swarm runs of 45-135 s and 9 alone runs of 25-70 s, 60 min of run
wall time measured on the shared 2-core machine (load 7-10), plus 4 cached warm starts (~1 min each
alone; 4-8 min under that load): within the 90-minute budget. --quick: 154 s with cached warm starts.

Results: bench/results/replication/<run>.json, one per run (the metrics rows the tables use);
node outputs under runs/replicate/. At most two node processes run at once, each on 1 thread.
`render` turns whatever results exist into docs/REPLICATION.md and docs/img/replication_*.png
(tables of mean +- standard error over seeds, seed-paired differences, a verdict per claim);
arms without results are marked "not run yet".
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench.replicate_report import render  # noqa: E402
from bench.replicate_study import (ARMS, FULL, MAX_NEW_TOKENS, NODES, OOD, OPEN_ARM, PAIRS, PAPER_HORIZONTAL,  # noqa: E402
                                   QUICK, REPO, RUNS, TASK, WARM_STEPS, G, Node, Scale)
from swarm_node.harness.process import NodeFailed, NodeProcess, child_env, kept_identity, swarm_node_argv  # noqa: E402

KEEP = ("round", "eval/accuracy", "reward/mean", "peer/reward/mean", "filter/dropped_frac", "is/truncated_frac",
        "is/ratio_mean", "is/ratio_min", "is/ratio_max", "swarm/peer_groups_used", "train/sequences",
        "train/groups", "time/round_s", "guard/resets", "guard/lockdown_rounds")  # kept per round in a run's results


# ---------------------------------------------------------------------------------- warm starts

def warm_config(node: Node):
    from swarm_node.config import ModelConfig, NodeConfig, TaskConfig, TrainConfig

    options = {**TASK, "ops": list(node.warm_ops)} if node.warm_ops != ("plus", "minus") else dict(TASK)
    return NodeConfig(model=ModelConfig(name=node.model), task=TaskConfig(name="arith", options=options),
                      train=TrainConfig(warmstart_steps=WARM_STEPS, warmstart_lr=1e-3, warmstart_batch=64))


def warm_path(node: Node) -> Path:
    from swarm_node.train.warmstart import warmstart_path

    return warmstart_path(warm_config(node))


def warm_up(nodes: list[Node]) -> None:
    """Warm-start every recipe once (cached under $SWARM_NODE_CACHE), two worker processes at a time."""
    todo = list({warm_path(n): n for n in nodes if not (warm_path(n) / "recipe.json").exists()}.values())
    for i in range(0, len(todo), 2):
        batch = todo[i:i + 2]
        print(f"warm start: {', '.join(n.name for n in batch)} ({WARM_STEPS} supervised steps)", flush=True)
        procs = [subprocess.Popen([sys.executable, __file__, "--warm-one", n.name], env=child_env()) for n in batch]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("warm start failed")


def warm_one(name: str) -> None:
    import torch

    from swarm_node.tasks import load_task
    from swarm_node.train.warmstart import warmstarted_model

    torch.set_num_threads(1)
    cfg = warm_config(NODES[name])
    print(warmstarted_model(cfg, load_task("arith", **cfg.task.options)), flush=True)


# ---------------------------------------------------------------------------------- node processes
def node_argv(node: Node, arm: str, seed: int, scale: Scale, out: Path, run_id: str, peer: str | None) -> list[str]:
    variant, mode, g = ARMS[arm]
    sets = {"name": node.name, "threads": 1, "model.name": str(warm_path(node)), "model.lora_r": node.lora_r,
            "train.lr": node.lr, "train.seed": 100 * seed + node.index, "train.warmstart_steps": 0,
            "train.rounds": scale.rounds, "train.eval_every": scale.eval_every, "train.checkpoint_every": 0,
            "task.name": "arith", "task.options": TASK, "task.eval_limit": scale.eval_limit,
            "rollout.group_size": G, "rollout.max_new_tokens": MAX_NEW_TOKENS,
            # the paper's batch of 24: alone, 2 own groups; in a swarm, 1 own + 1 peer group
            "rollout.prompts_per_round": 2 if mode is None else 1,
            "loss.variant": variant, "loss.g": g, "loss.C": 2.0}
    if arm != OPEN_ARM:  # the open-swarm arm keeps the project's defaults for everything below
        # the paper's TIS weights (one cap C for every sample), not the sign-aware default, and every
        # peer's negatives and claimed log-probs, as the paper trains on them (the open-swarm
        # defaults, loss.peer_negative_weight = 0 and the plausibility check, came later)
        sets.update({"loss.C_negative": None, "loss.positive_floor": 0.0, "loss.peer_negative_weight": 1.0,
                     "loss.peer_plausibility_margin": None, "loss.peer_max_advantage": None,
                     "swarm.guard_every": 0})  # and no guard (train/guard.py)
    if mode == "horizontal":
        sets.update(PAPER_HORIZONTAL)
    command = "train"
    if mode is not None:
        command = "join"
        sets.update({"swarm.mode": mode, "swarm.run_id": run_id, "swarm.peer_groups_per_own": 1.0,
                     "swarm.min_peers": 1, "swarm.deadline_s": 30.0, "swarm.linger_s": 5.0,
                     "swarm.alone_wait_s": None,  # the first node waits for the second from round 1
                     # one peer id for every arm of the run id: the arms answer the same public schedule
                     "swarm.identity": str(kept_identity(out.parent.parent / "identities", f"{run_id}-{node.name}")),
                     "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
                     "swarm.peers": [peer] if peer else []})
    argv = swarm_node_argv(command, "--out", str(out))
    for key, value in sets.items():
        argv += ["--set", f"{key}={json.dumps(value)}"]
    return argv


def run_nodes(nodes: list[Node], arm: str, seed: int, scale: Scale, run_dir: Path, run_id: str) -> None:
    """Start the nodes (a swarm: the first one's join address is the second one's --peers) and wait."""
    procs: list[NodeProcess] = []
    timeout = time.monotonic() + 240 + 12 * scale.rounds + 3 * scale.eval_limit
    try:
        peer = None
        for node in nodes:
            out = run_dir / node.name
            shutil.rmtree(out, ignore_errors=True)  # a retry starts clean (metrics.jsonl would append)
            procs.append(NodeProcess(node_argv(node, arm, seed, scale, out, run_id, peer), out).start(cwd=REPO))
            if ARMS[arm][1] is not None and peer is None:
                peer = procs[0].address(180)
        for proc in procs:
            code = proc.wait(max(1.0, timeout - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"{proc.name} exited {code}:\n{proc.text(15)}")
    finally:
        for proc in procs:
            proc.kill()


# ---------------------------------------------------------------------------------- evaluation
def ood_examples(limit: int) -> list:
    """The first `limit` held-out problems whose second operand has two digits."""
    from swarm_node.tasks import load_task

    task = load_task("arith", **OOD, test_size=10 * limit)
    picked, split = [], task.split("test")
    for i in range(len(split)):
        if int(re.match(r"What is \d+ \w+ (\d+)", split[i].question).group(1)) >= 10:
            picked.append(split[i])
        if len(picked) == limit:
            break
    return picked


def ood_accuracy(node: Node, checkpoint: Path | None, limit: int) -> float:
    """Greedy pass@1 on the OOD set of the warm start (checkpoint None) or of a final checkpoint."""
    import torch

    from swarm_node.config import ModelConfig
    from swarm_node.tasks import load_task
    from swarm_node.train.evaluate import pass_at_1
    from swarm_node.train.policy import Policy
    from swarm_node.train.sampling.hf import HFSampler

    torch.set_num_threads(1)
    base = str(warm_path(node))
    if checkpoint is None:
        policy = Policy.load(ModelConfig(name=base, device="cpu"))
    elif node.lora_r:  # a LoRA checkpoint holds the adapter only
        policy = Policy.load(ModelConfig(name=base, lora_r=node.lora_r, device="cpu"),
                             adapter_path=checkpoint / "model")
    else:
        policy = Policy.load(ModelConfig(name=str(checkpoint / "model"), device="cpu"))
    task = load_task("arith", **OOD)
    return pass_at_1(HFSampler(policy), policy, task, ood_examples(limit), task.max_new_tokens)["accuracy"]


def node_record(node: Node, out: Path, limit: int) -> dict:
    from swarm_node.metrics import read_metrics

    rows = [r for r in read_metrics(out / "metrics.jsonl") if "round" in r]
    evals = [(r["round"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    checkpoint = sorted((out / "checkpoints").glob("round-*"))[-1]
    return {"node": node.name, "start": evals[0][1], "early": evals[min(1, len(evals) - 1)][1],
            "final": evals[-1][1], "curve": evals,
            "ood": ood_accuracy(node, checkpoint, limit), "eval_n": limit,
            "rows": [{k: round(r[k], 4) if isinstance(r[k], float) else r[k] for k in KEEP if k in r} for r in rows]}


def run_path(scale: Scale, pair: str, arm: str, seed: int, node: str | None = None) -> Path:
    name = f"alone-{node}-s{seed}" if arm == "alone" else f"{pair}-{arm}-s{seed}"
    return scale.results / f"{name}.json"


def run_one(scale: Scale, pair: str, arm: str, seed: int) -> None:
    """One (pair, arm, seed): skipped if its JSON exists; alone runs are cached per node."""
    nodes = [NODES[n] for n in PAIRS[pair]]
    if arm == "alone":
        nodes = [n for n in nodes if not run_path(scale, pair, arm, seed, n.name).exists()]
    elif run_path(scale, pair, arm, seed).exists():
        nodes = []
    if not nodes:
        return
    label = f"{pair}/{arm}/seed {seed}" if arm != "alone" else f"alone {'+'.join(n.name for n in nodes)}/seed {seed}"
    run_name = f"alone-s{seed}" if arm == "alone" else f"{pair}-{arm}-s{seed}"
    run_dir = RUNS / ("quick" if scale is QUICK else "study") / run_name
    started = time.time()
    for attempt in (1, 2):
        try:
            # one run id and peer id per (pair, seed, node) in every arm: a node's prompts are its public schedule
            # (SPEC 14.5), so the arms of a seed answer the same prompts
            run_nodes(nodes, arm, seed, scale, run_dir, f"repl-{pair}-s{seed}")
            break
        except (RuntimeError, NodeFailed) as e:
            print(f"  {label}: attempt {attempt} failed: {e}", flush=True)
            if attempt == 2:
                return
    try:
        records = [node_record(n, run_dir / n.name, scale.ood_limit) for n in nodes]
    except Exception:  # a bug, but one run's failure must not stop the study
        traceback.print_exc()
        return
    seconds = time.time() - started
    scale.results.mkdir(parents=True, exist_ok=True)
    meta = {"pair": pair, "arm": arm, "seed": seed, "rounds": scale.rounds, "seconds": round(seconds, 1),
            "variant": ARMS[arm][0], "mode": ARMS[arm][1] or "alone", "g": ARMS[arm][2]}
    if arm == "alone":
        for rec in records:
            run_path(scale, pair, arm, seed, rec["node"]).write_text(json.dumps({**meta, "nodes": [rec]}))
    else:
        run_path(scale, pair, arm, seed).write_text(json.dumps({**meta, "nodes": records}, separators=(",", ":")))
    summary = ", ".join(f"{r['node']} {100 * r['start']:.1f}->{100 * r['final']:.1f}% (ood {100 * r['ood']:.1f}%)"
                        for r in records)
    print(f"  {label}: {summary} [{seconds:.0f} s]", flush=True)


def warm_ood(scale: Scale) -> None:
    """OOD accuracy of each warm start (the 'before RL' point), cached in warm-ood.json."""
    path = scale.results / "warm-ood.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    names = sorted({n for pair, _ in scale.plan for n in PAIRS[pair]} - set(known))
    for name in names:
        known[name] = ood_accuracy(NODES[name], None, scale.ood_limit)
    scale.results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(known, indent=1))


def study(scale: Scale, stop_at: float | None) -> None:
    nodes = sorted({n for pair, _ in scale.plan for n in PAIRS[pair]})
    warm_up([NODES[n] for n in nodes])
    warm_ood(scale)
    for seed in scale.seeds:  # seed-major: a study stopped early still has every arm at the same seeds
        for pair, arm in scale.plan:
            if stop_at is not None and time.time() > stop_at:
                print("stopping: --stop-at reached (finished runs are cached; run again to resume)")
                return
            run_one(scale, pair, arm, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (<= 10 min): 1 seed, 3 arms, 4 rounds")
    parser.add_argument("--render", action="store_true", help="only re-render docs/REPLICATION.md from the JSON")
    parser.add_argument("--stop-at", help="start no new run after this UTC time (HH:MM)")
    parser.add_argument("--seeds", type=int, help="run seeds 0..N-1 instead of the plan's (adds seeds to a study)")
    parser.add_argument("--arms", help="only these arms, comma-separated (e.g. alone,f-tis,f-tis-open)")
    parser.add_argument("--results", help="another folder for the result JSON (e.g. a re-run on newer code); "
                                          "its page is written there, not to docs/")
    parser.add_argument("--warm-one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warm_one:
        return warm_one(args.warm_one)
    scale = QUICK if args.quick else FULL
    if args.seeds:
        scale = dataclasses.replace(scale, seeds=tuple(range(args.seeds)))
    if args.results:
        scale = dataclasses.replace(scale, results=Path(args.results).resolve())
    if args.arms:
        unknown = set(args.arms.split(",")) - set(ARMS)
        if unknown:
            parser.error(f"unknown arm(s) {sorted(unknown)}; choose from {sorted(ARMS)}")
        scale = dataclasses.replace(scale, plan=tuple(pa for pa in scale.plan if pa[1] in args.arms.split(",")))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill PID` also stops the nodes it started
    stop_at = None
    if args.stop_at:
        h, m = map(int, args.stop_at.split(":"))
        now = time.gmtime()
        stop_at = time.time() + ((h * 60 + m) - (now.tm_hour * 60 + now.tm_min)) * 60 - now.tm_sec
    if not args.render:
        study(scale, stop_at)
    render(scale)


if __name__ == "__main__":
    main()

"""A real pretrained model learns under GRPO/F-TIS: `swarm-node train --model smollm2-135m --task arith`, >= 3 seeds.

Each seed is one `swarm-node train` process (no warm start: a pretrained instruct model, prompted with
the chat template and arith's one worked exchange, tasks/prompt.py). Held-out greedy pass@1 is measured
at round 0 (the base model) and after the last round on the same examples; the script reports the
per-seed change, its mean with a 95% t-interval over seeds, seconds per round, and the peak RSS of
each process (sampled every 0.5 s with psutil).

Resumable: a seed whose run directory already has its final evaluation is read, not re-run, so
`nohup python bench/real_model.py &` can be restarted after an interruption.

    python bench/real_model.py --parallel           # 3 seeds x 6 rounds at once, 100 held-out problems
    python bench/real_model.py --seeds 0 1 2 3 --rounds 10 --eval-limit 200
    python bench/real_model.py --parallel --device cuda --name real_model_smollm2_cuda   # on a GPU machine
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench._common import PYTHON, REPO, machine_info, print_table, write_results  # noqa: E402

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean of `xs` (n >= 2)."""
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    half = T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def node_command(args, seed: int, out: Path) -> list[str]:
    sets = {"train.seed": seed, "threads": args.threads, "train.lr": args.lr, "rollout.prompts_per_round": args.prompts,
            "rollout.group_size": args.group_size, "task.eval_limit": args.eval_limit, "train.eval_every": 0,
            "train.checkpoint_every": 0, "loss.variant": args.loss, "model.device": args.device}
    if args.lora_r:
        sets["model.lora_r"] = args.lora_r
    cmd = [PYTHON, "-m", "swarm_node", "train", "--model", args.model, "--task", "arith", "--rounds", str(args.rounds),
           "--out", str(out)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def launch(args, seed: int, out: Path) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = node_command(args, seed, out)
    (out / "command.txt").write_text(" ".join(cmd) + "\n")
    with open(out / "stdout.log", "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def wait_all(procs: dict[int, subprocess.Popen]) -> tuple[dict[int, int], dict[int, float]]:
    """Wait for every process; (peak RSS bytes, wall seconds) per seed, RSS sampled every 0.5 s."""
    start, peak, wall = time.time(), {s: 0 for s in procs}, {}
    watched = {s: psutil.Process(p.pid) for s, p in procs.items()}
    while len(wall) < len(procs):
        for seed, proc in procs.items():
            if seed in wall:
                continue
            if proc.poll() is not None:
                wall[seed] = time.time() - start
                if proc.returncode != 0:
                    raise SystemExit(f"seed {seed} failed (exit {proc.returncode}); see its stdout.log")
                continue
            try:
                peak[seed] = max(peak[seed], watched[seed].memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(0.5)
    return peak, wall


def summarize(seed: int, out: Path, peak: int, wall: float) -> dict:
    """One seed's summary from its metrics.jsonl (written to bench_summary.json, so a rerun reads it back)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/accuracy" in r]
    rounds = [r for r in rows if r["round"] > 0]
    result = {"seed": seed, "before": evals[0]["eval/accuracy"], "after": evals[-1]["eval/accuracy"],
              "n": evals[-1]["eval/n"], "rounds": len(rounds),
              "s_per_round": statistics.mean(r["time/round_s"] for r in rounds if r is not rounds[-1]),
              "generate_s": statistics.mean(r["time/generate_s"] for r in rounds),
              "train_s": statistics.mean(r["time/train_s"] for r in rounds),
              "eval_s": statistics.mean(r["time/eval_s"] for r in evals),
              "reward_first": rounds[0]["reward/mean"], "reward_last": rounds[-1]["reward/mean"],
              "rewards": [r["reward/mean"] for r in rounds],
              "format_fail_first": rounds[0]["reward/format_fail_frac"],
              "format_fail_last": rounds[-1]["reward/format_fail_frac"],
              "peak_rss_mb": round(peak / 2**20), "wall_s": round(wall, 1)}
    result["gain"] = result["after"] - result["before"]
    (out / "bench_summary.json").write_text(json.dumps(result, indent=1))
    return result


def run_seeds(args) -> list[dict]:
    """Every seed not already summarized runs now (all at once with --parallel), then all are read back."""
    outs = {seed: args.runs / f"seed{seed}" for seed in args.seeds}
    todo = [s for s in args.seeds if not (outs[s] / "bench_summary.json").is_file()]
    batches = [todo] if args.parallel else [[s] for s in todo]
    for batch in batches:
        peak, wall = wait_all({s: launch(args, s, outs[s]) for s in batch})
        for s in batch:
            summarize(s, outs[s], peak[s], wall[s])
    return [json.loads((outs[s] / "bench_summary.json").read_text()) for s in args.seeds]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--prompts", type=int, default=4, help="prompts per round (the issue's loop: 4)")
    p.add_argument("--group-size", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--loss", default="f-tis")
    p.add_argument("--lora-r", type=int, default=0)
    p.add_argument("--eval-limit", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu | cuda (bf16 compute on a GPU, the library's default)")
    p.add_argument("--parallel", action="store_true", help="run the seeds at once (one process each)")
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "bench_real_model")
    p.add_argument("--name", default="real_model_smollm2")
    args = p.parse_args()
    started, info = time.time(), machine_info()
    results = run_seeds(args)
    for r in results:
        print(f"seed {r['seed']}: pass@1 {r['before']:.3f} -> {r['after']:.3f} ({r['gain']:+.3f}), "
              f"{r['s_per_round']:.1f} s/round, peak RSS {r['peak_rss_mb']} MB", flush=True)
    gains = [r["gain"] for r in results]
    mean, low, high = t_interval(gains)
    print_table(f"{args.model} on arith, GRPO/{args.loss}, {len(results)} seeds x {args.rounds} rounds",
                ["seed", "pass@1 before", "after", "gain", "reward r1 -> last", "format fail r1 -> last", "s/round",
                 "peak RSS MB"],
                [[r["seed"], r["before"], r["after"], r["gain"], f"{r['reward_first']:.2f} -> {r['reward_last']:.2f}",
                  f"{r['format_fail_first']:.2f} -> {r['format_fail_last']:.2f}", r["s_per_round"], r["peak_rss_mb"]]
                 for r in results],
                caption=f"mean gain {mean:+.3f}, 95% t-interval over seeds [{low:+.3f}, {high:+.3f}]")
    path = write_results(args.name, results, args, info, started,
                         summary={"mean_gain": mean, "ci95": [low, high], "seeds": len(results),
                                  "mean_before": statistics.mean(r["before"] for r in results),
                                  "mean_after": statistics.mean(r["after"] for r in results),
                                  "s_per_round_median": statistics.median(r["s_per_round"] for r in results),
                                  "peak_rss_mb_max": max(r["peak_rss_mb"] for r in results)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Benchmark — the spread behind tests/test_learning.py: seeds x CPU kernel paths, plus broken-learning controls.

The learning test asserts that GRPO raises held-out pass@1 and training reward on average over a
few seeds. Its warm start is chaotic in floating point, so another CPU is, in effect, another
draw of warm starts. This script measures how much the test's statistics move over such draws:

  kernel paths   every run in a fresh interpreter, with its own warm-start cache, so the warm
                 start is recomputed on that path
    native         this CPU's default (AVX-512 on the AMD EPYC it was written on)
    avx2, scalar   ATEN_CPU_CAPABILITY=avx2 / =default: ATen's kernels of CPUs without AVX-512 / AVX2
    mkl-compat     MKL_CBWR=COMPATIBLE: MKL's vendor-neutral sgemm path (MKL picks different code on
                   Intel and AMD; this is the one we can force)
    mkldnn-off     torch.backends.mkldnn.enabled = False          (checked for identity with native)
    threads-2      two torch threads instead of one               (checked for identity with native)
  controls       native path, the test's seeds, learning deliberately broken:
    flipped-loss   the trainer's policy_loss returns -loss (it ascends the loss it should descend)
    shuffled-adv   advantages permuted across the batch: updates of the same size, no reward signal

Per run (the test's `summarize`): gain = final held-out pass@1 (mean of the last 3 evaluations)
minus the warm start's, reward gain = training reward over the last 20 rounds minus the first 20.
Summary per path: the test's statistics (means over its SEEDS), per-run mean / sd / min, and the
worst test statistic these runs allow (the mean of the len(SEEDS) lowest).

    .venv/bin/python bench/learning_spread.py --jobs 2      # ~15 min on 2 idle cores (~25 with --jobs 1)
    .venv/bin/python bench/learning_spread.py --paths native --seeds 0 1 2 --no-controls   # ~4 min
    .venv/bin/python bench/learning_spread.py --resummarize bench/results/learning_spread.json
                     # after changing the test's SEEDS or thresholds (refuses if its run config changed)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402
from swarm_node.harness import learning  # noqa: E402 (the recipe tests/test_learning.py asserts on)

PATHS = {
    "native": {},
    "avx2": {"env": {"ATEN_CPU_CAPABILITY": "avx2"}},
    "scalar": {"env": {"ATEN_CPU_CAPABILITY": "default"}},
    "mkl-compat": {"env": {"MKL_CBWR": "COMPATIBLE"}},
    "mkldnn-off": {"mkldnn": False},
    "threads-2": {"env": {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}, "extra": ["threads=2"]},
}
CONTROLS = {"flipped-loss": {"break": "flip"}, "shuffled-adv": {"break": "shuffle"}}
IDENTITY_PATHS = ("mkldnn-off", "threads-2")


# ------------------------------------------------------------------------------------ worker
def break_learning(how: str) -> None:
    """Monkeypatch the trainer so that learning is broken on purpose (controls only)."""
    import torch

    import swarm_node.train.trainer as trainer

    if how == "flip":
        policy_loss = trainer.policy_loss

        def flipped(*args, **kwargs):
            loss, stats = policy_loss(*args, **kwargs)
            return -loss, stats

        trainer.policy_loss = flipped
    elif how == "shuffle":
        group_advantages, generator = trainer.group_advantages, torch.Generator().manual_seed(0)

        def shuffled(*args, **kwargs):
            advantages = group_advantages(*args, **kwargs)  # [N]
            return advantages[torch.randperm(advantages.numel(), generator=generator)]  # [N]

        trainer.group_advantages = shuffled
    else:
        raise ValueError(f"unknown way to break learning: {how!r}")


def worker(job: dict) -> dict:
    """One learning run in this (fresh) interpreter; returns its summary and curves."""
    import torch

    torch.backends.mkldnn.enabled = job.get("mkldnn", True)
    if job.get("break"):
        break_learning(job["break"])
    from swarm_node.config import load_config
    from swarm_node.node import run

    t = time.time()
    with tempfile.TemporaryDirectory() as out:
        rows = run(load_config(None, learning.learning_overrides(job["seed"]) + job.get("extra", []) + [f"out={out}"]))
    return {**learning.summarize(rows), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "evals": [[r["round"], r["eval/accuracy"]] for r in rows if "eval/accuracy" in r],
            "rewards": [r.get("reward/mean") for r in rows if r["round"] > 0], "wall_s": round(time.time() - t, 1)}


# ------------------------------------------------------------------------------------ driver
def launch(job: dict, cache_root: Path) -> dict:
    env = {"SWARM_NODE_CACHE": str(cache_root / job["cache"]), **job.get("env", {})}
    spec = {k: job[k] for k in ("seed", "mkldnn", "break", "extra") if k in job}
    result = C.run_json_subprocess([__file__, "--worker", json.dumps(spec)], timeout_s=1800, env=env)
    result.update(arm=job["arm"], seed=job["seed"], gain=result["final"] - result["start"],
                  reward_gain=result["reward_late"] - result["reward_early"])
    print(f"{job['arm']:>13} seed {job['seed']}: pass@1 {result['start']:.3f} -> {result['final']:.3f} "
          f"({result['gain']:+.3f}), reward {result['reward_early']:.3f} -> {result['reward_late']:.3f} "
          f"[{result['cpu_capability']}, {result['wall_s']:.0f} s]", flush=True)
    return result


def jobs_for(args) -> list[dict]:
    jobs = [{"arm": p, "seed": s, "cache": p, **PATHS[p]} for p in args.paths
            for s in (args.identity_seeds if p in IDENTITY_PATHS else args.seeds)]
    if args.controls:  # controls reuse the native warm starts: learning is broken only after them
        jobs += [{"arm": c, "seed": s, "cache": "native", **CONTROLS[c]} for c in CONTROLS for s in args.test_seeds]
    return jobs


def describe(runs: list[dict], test_seeds: list[int]) -> dict:
    gains, rewards = [r["gain"] for r in runs], [r["reward_gain"] for r in runs]
    in_test, k = [r for r in runs if r["seed"] in test_seeds], min(len(test_seeds), len(runs))
    return {"runs": len(runs), "start_mean": statistics.fmean(r["start"] for r in runs),
            "gain_mean": statistics.fmean(gains), "gain_sd": statistics.stdev(gains) if len(gains) > 1 else 0.0,
            "gain_min": min(gains), "reward_gain_mean": statistics.fmean(rewards),
            "reward_gain_sd": statistics.stdev(rewards) if len(rewards) > 1 else 0.0, "reward_gain_min": min(rewards),
            "test_statistic_gain": statistics.fmean(r["gain"] for r in in_test) if in_test else None,
            "test_statistic_reward_gain": statistics.fmean(r["reward_gain"] for r in in_test) if in_test else None,
            # the test's statistics if a CPU drew the worst len(test_seeds) of these runs
            "worst_test_statistic_gain": statistics.fmean(sorted(gains)[:k]),
            "worst_test_statistic_reward_gain": statistics.fmean(sorted(rewards)[:k])}


def identical_to_native(runs: list[dict], arm: str) -> bool | None:
    pairs = [(r, n) for r in runs if r["arm"] == arm for n in runs if n["arm"] == "native" and n["seed"] == r["seed"]]
    return all(r["evals"] == n["evals"] and r["rewards"] == n["rewards"] for r, n in pairs) if pairs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    ap.add_argument("--identity-seeds", nargs="+", type=int, default=[0],
                    help="seeds for the paths only checked for identity with native (mkldnn-off, threads-2)")
    ap.add_argument("--no-controls", dest="controls", action="store_false")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each uses one thread; threads-2 uses two)")
    ap.add_argument("--cache", default=None, help="warm-start cache root (default: a fresh temp dir = cold caches)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--resummarize", default=None, metavar="JSON",
                    help="recompute the summary of a results file with the test's current seeds/thresholds")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.resummarize is not None:
        resummarize(Path(args.resummarize))
        return
    C.single_thread()
    args.test_seeds = list(learning.SEEDS)
    info, started = C.machine_info(), time.time()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=args.jobs) as pool:
        cache_root = Path(args.cache) if args.cache else Path(tmp)
        runs = list(pool.map(lambda job: launch(job, cache_root), jobs_for(args)))
    summary, identity = summarize_runs(runs, list(learning.SEEDS))
    path = C.write_results("learning_spread", runs, args, info, started, out=args.out,
                           **test_settings(), summary=summary, identical_to_native=identity)
    print(f"wrote {C.shown(path)}")


def test_settings() -> dict:
    """What the test asserts, stored beside the runs so a re-summary can check it still matches."""
    return {"test_config": learning.learning_overrides(0), "test_seeds": list(learning.SEEDS),
            "thresholds": {"min_mean_gain": learning.MIN_MEAN_GAIN, "min_mean_reward_gain": learning.MIN_MEAN_REWARD_GAIN}}


def resummarize(path: Path) -> None:
    """Recompute the summary of saved runs with the test's current seeds and thresholds (no re-run).

    Refuses when the test's run config changed since the runs were measured: then they must be re-run."""
    payload = json.loads(path.read_text())
    if payload["test_config"] != learning.learning_overrides(0):
        sys.exit(f"{path}: measured with another learning config than swarm_node/harness/learning.py now has; re-run")
    payload.update(test_settings())
    payload["summary"], payload["identical_to_native"] = summarize_runs(payload["results"], list(learning.SEEDS))
    payload["resummarized_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"re-summarized {C.shown(path)}")


def summarize_runs(runs: list[dict], test_seeds: list[int]) -> tuple[dict, dict]:
    """Per-arm summary (printed as a table) and which identity paths were bit-identical to native."""
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    summary = {arm: describe([r for r in runs if r["arm"] == arm], test_seeds) for arm in arms}
    drawn = [r for r in runs if r["arm"] in PATHS and r["arm"] not in IDENTITY_PATHS]
    if drawn:
        summary["all kernel paths"] = describe(drawn, test_seeds)
    identity = {arm: identical_to_native(runs, arm) for arm in IDENTITY_PATHS if arm in arms}
    C.print_table("learning spread (gain = final - warm-start held-out pass@1)",
                  ["arm", "runs", "start", "gain mean", "gain sd", "gain min", "reward gain mean", "reward gain min",
                   f"test: mean gain, seeds {test_seeds}", "worst", "test: mean reward gain", "worst"],
                  [[a, s["runs"], s["start_mean"], s["gain_mean"], s["gain_sd"], s["gain_min"], s["reward_gain_mean"],
                    s["reward_gain_min"], s["test_statistic_gain"], s["worst_test_statistic_gain"],
                    s["test_statistic_reward_gain"], s["worst_test_statistic_reward_gain"]]
                   for a, s in summary.items()],
                  caption=f"bit-identical to native: {identity}")
    return summary, identity


if __name__ == "__main__":
    sys.exit(main())

"""A node alone learns: warm-started tiny presets improve held-out accuracy and training reward under GRPO/F-TIS.

Per seed s in SEEDS (four independent runs, two at a time; ~80 CPU-s each, ~3 min wall on 2 idle
cores): a 900-step supervised warm start of tiny-s (model.init_seed=s) on arith ("What is 48 plus
7?"), then 100 rounds of 16 prompts x 12 completions at lr 1e-4 (train.seed=s), one optimizer step
each, greedy pass@1 on the 500 held-out problems every 10 rounds. Per run:

    gain         = mean pass@1 of rounds 80, 90, 100  -  pass@1 after the warm start (round 0)
    reward gain  = mean training reward of rounds 81-100  -  of rounds 1-20

Asserted: the MEANS over the seeds, gain >= MIN_MEAN_GAIN (0.05), reward gain >= MIN_MEAN_REWARD_GAIN (0.02).
The same test runs twice: fp32 compute, and bf16 compute (model.dtype=bfloat16: autocast, fp32 master
weights, fp32 LM head), the precision a GPU node uses. bf16 on this AMD EPYC, seeds 0-3: pass@1
0.392 -> 0.585, 0.250 -> 0.575, 0.192 -> 0.233, 0.372 -> 0.419; mean gain +0.151, reward gain +0.049
(fp32 native: +0.128 / +0.054); 212 s. Since 2026-11-27 the bf16 run takes seeds 0-1 only, one
batch on the 2 cores, and asserts a held-out gain above 0 (and the same reward gain): on the loaded
CI machine it took 417 s with 4 seeds (fp32 297 s, against 162 s idle), and CI ran 57 of its 60
minutes. At the spread below (gain 0.174 +- 0.088 per run) a mean of two falls under 0 with
probability about 0.3 %, as a mean of four falls under 0.05; bf16 learning on a real model is
measured on a GPU (docs/BENCHMARKS.md, GPU: SmolLM2-135M, 3 seeds, +32 to +37 points).

Why this shape. The warm start is chaotic in floating point: the same seed lands at a different
held-out accuracy on another CPU (the old one-seed test saw 0.075 on an Intel Xeon and 0.175 on an
AMD EPYC, and its +0.03 held on the first only). So a CPU is in effect another draw of warm
starts, and the claim is made about the mean over several draws, with a margin that is large
against their spread. 900 warm-start steps (not 600) get past the point where the model starts
answering correctly, so most groups carry signal; 16 prompts per round at lr 1e-4 then gain
+0.04..+0.33 within 100 rounds; the last three evaluations are averaged, not the last one.

Spread (bench/learning_spread.py -> bench/results/learning_spread.json, AMD EPYC with AVX-512):
seeds 0-3 x four kernel paths, each recomputing its own warm start: native AVX-512,
ATEN_CPU_CAPABILITY=avx2 and =default (ATen kernels of CPUs without AVX-512 / AVX2), and
MKL_CBWR=COMPATIBLE (MKL's vendor-neutral sgemm; MKL takes other code paths on Intel than on AMD).
    16 runs:  warm starts 0.100..0.606;  gain 0.174 +- 0.088 (sd), min 0.043, all 16 > 0;
              reward gain 0.052 +- 0.015, min 0.032.
    the test's means per path (native / avx2 / default / mkl-compat): gain 0.128 / 0.234 / 0.170 /
              0.166, reward gain 0.054 / 0.053 / 0.046 / 0.057.
    worst case: the four lowest of the 16 runs average gain 0.075 and reward gain 0.037.
torch.backends.mkldnn.enabled=False and 2 torch threads are bit-identical to native here.

It fails when learning is broken. This test itself, run with swarm_node.train.trainer.policy_loss
returning -loss (a sitecustomize.py on PYTHONPATH, so the workers get it too): held-out pass@1 -> 0
on every seed, mean gain -0.421, reward gain -0.095, FAILED. The script's controls (seeds 0-2):
flipped sign -0.443 / -0.098; advantages shuffled across the batch (updates of the same size, no
reward signal) -0.354 / -0.111. Measured passing: 162 s on 2 mostly idle cores, gain +0.128.
"""

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pytest

from swarm_node.config import load_config
from swarm_node.harness.learning import MIN_MEAN_GAIN, MIN_MEAN_REWARD_GAIN, SEEDS, learning_overrides, summarize
from swarm_node.node import run


def learning_run(seed: int, out: str, dtype: str) -> dict[str, float]:
    """One warm start + GRPO run (in a worker process); returns `summarize` of its rows."""
    return {"seed": seed, **summarize(run(load_config(None, learning_overrides(seed) + [f"model.dtype={dtype}", f"out={out}"])))}


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_preset_improves_held_out_accuracy(tmp_path: Path, dtype: str):
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    seeds = SEEDS if dtype == "float32" else SEEDS[:2]  # bf16: one batch on 2 cores (see the docstring)
    workers = min(len(seeds), 2, cpus)  # one torch thread each
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        runs = list(pool.map(learning_run, seeds, [str(tmp_path / f"seed{s}") for s in seeds], [dtype] * len(seeds)))
    for r in runs:
        print(f"seed {r['seed']}: held-out pass@1 {r['start']:.3f} -> {r['final']:.3f}, "
              f"training reward {r['reward_early']:.3f} -> {r['reward_late']:.3f}")
    gain = mean(r["final"] - r["start"] for r in runs)
    reward_gain = mean(r["reward_late"] - r["reward_early"] for r in runs)
    print(f"mean over seeds {seeds}: held-out gain {gain:+.3f}, training reward gain {reward_gain:+.3f} ({dtype})")
    assert mean(r["start"] for r in runs) > 0.1, f"warm starts too weak to give GRPO signal: {runs}"
    min_gain = MIN_MEAN_GAIN if dtype == "float32" else 0.0
    assert gain > min_gain, f"mean held-out pass@1 gain {gain:+.3f} <= {min_gain}: {runs}"
    assert reward_gain >= MIN_MEAN_REWARD_GAIN, f"mean training reward gain {reward_gain:+.3f}: {runs}"

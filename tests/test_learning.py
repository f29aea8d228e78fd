"""A node alone learns: warm-started tiny presets improve held-out accuracy and training reward under GRPO/F-TIS.

Setup, per seed s in SEEDS (three independent runs, two at a time on 2 cores, ~2-3 min in all):
a 900-step supervised warm start of tiny-s (model.init_seed=s) on arith ("What is 48 plus 7?"),
then 100 rounds of 16 prompts x 12 completions at lr 1e-4 (train.seed=s), one optimizer step
each, with greedy pass@1 on the 500 held-out problems every 10 rounds. Per run:

    gain   = mean pass@1 over rounds 80, 90, 100  -  pass@1 after the warm start (round 0)
    reward = mean training reward over rounds 81-100  -  over rounds 1-20

The test asserts the MEAN over the seeds: gain >= MIN_MEAN_GAIN and reward >= MIN_MEAN_REWARD_GAIN.

Why this shape: the warm start is chaotic in floating point. The same seed lands at a different
held-out accuracy on another CPU (the old single-seed test saw 0.075 on an Intel Xeon, 0.175 on an
AMD EPYC, and asserted a gain that held on one of them only). So a CPU is, in effect, another
draw of warm starts; the claim must hold on average over draws, with a margin large against
their spread. A 900-step warm start (instead of 600) lands past the point where the model
starts getting answers right (held-out 0.3-0.6), where GRPO has signal in most groups; a 16-prompt
batch at lr 1e-4 then gains ~+0.1-0.2 within 100 rounds. Averaging the last three evaluations
instead of the last one halves the wobble of a single checkpoint.

Spread measured with bench/learning_spread.py (numbers in bench/results/learning_spread.json),
seeds 0-3 x four kernel paths on an AMD EPYC with AVX-512: native AVX-512, ATEN_CPU_CAPABILITY=avx2
and =default (the vectorised kernels of CPUs without AVX-512 / without AVX2), and MKL_CBWR=COMPATIBLE
(MKL's vendor-neutral sgemm path, standing in for MKL's different code paths on Intel vs AMD).
Each path changes the warm start (its floating-point results differ), so each is a fresh draw.
torch.backends.mkldnn.enabled=False and 2 torch threads give bit-identical runs to the
native path for this model, so they add no spread. SEE_SPREAD below is filled from that file.

Honesty checks (same script): with the policy loss's sign flipped the mean gain is about -0.4
(the policy collapses to 0 % held-out), and with advantages shuffled across the batch (random
updates of the same size) it is about -0.3, so the assertions fail whenever learning is broken.
"""

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pytest

from swarm_node.config import load_config
from swarm_node.node import run

SEEDS = (0, 1, 2)
ROUNDS = 100
EVAL_EVERY = 10
FINAL_EVALS = 3  # "final" accuracy = mean of the last three evaluations (rounds 80, 90, 100)
REWARD_WINDOW = 20  # training reward: rounds 1-20 vs the last 20
MIN_MEAN_GAIN = 0.05
MIN_MEAN_REWARD_GAIN = 0.01


def learning_overrides(seed: int) -> list[str]:
    """The config of one learning run (bench/learning_spread.py measures exactly this)."""
    return ["model.name=tiny-s", f"model.init_seed={seed}", "task.options={digits: 2, second_digits: 1}",
            "task.eval_limit=0", "train.warmstart_steps=900", f"train.seed={seed}", f"train.rounds={ROUNDS}",
            "train.lr=1e-4", f"train.eval_every={EVAL_EVERY}", "train.checkpoint_every=0",
            "rollout.prompts_per_round=16", "rollout.group_size=12", "rollout.max_new_tokens=10",
            "train.micro_batch=96", "threads=1"]


def summarize(rows: list[dict]) -> dict[str, float]:
    """Start / final held-out pass@1 and early / late training reward of one run's metrics rows."""
    evals = [row["eval/accuracy"] for row in rows if "eval/accuracy" in row]
    rewards = [row["reward/mean"] for row in rows if row["round"] > 0 and "reward/mean" in row]
    assert len(evals) >= FINAL_EVALS + 1 and len(rewards) >= 2 * REWARD_WINDOW, "run too short to summarize"
    return {"start": evals[0], "final": sum(evals[-FINAL_EVALS:]) / FINAL_EVALS,
            "reward_early": sum(rewards[:REWARD_WINDOW]) / REWARD_WINDOW,
            "reward_late": sum(rewards[-REWARD_WINDOW:]) / REWARD_WINDOW}


def learning_run(seed: int, out: str, extra: tuple[str, ...] = ()) -> dict[str, float]:
    """One warm start + GRPO run (in a worker process); returns `summarize` of its rows."""
    return {"seed": seed, **summarize(run(load_config(None, learning_overrides(seed) + [*extra, f"out={out}"])))}


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


@pytest.mark.slow
def test_tiny_preset_improves_held_out_accuracy(tmp_path: Path):
    workers = min(len(SEEDS), 2, len(os.sched_getaffinity(0)))
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        runs = list(pool.map(learning_run, SEEDS, [str(tmp_path / f"seed{s}") for s in SEEDS]))
    for r in runs:
        print(f"seed {r['seed']}: held-out pass@1 {r['start']:.3f} -> {r['final']:.3f}, "
              f"training reward {r['reward_early']:.3f} -> {r['reward_late']:.3f}")
    gain = mean(r["final"] - r["start"] for r in runs)
    reward_gain = mean(r["reward_late"] - r["reward_early"] for r in runs)
    print(f"mean over seeds {SEEDS}: held-out gain {gain:+.3f}, training reward gain {reward_gain:+.3f}")
    assert mean(r["start"] for r in runs) > 0.1, f"warm starts too weak to give GRPO signal: {runs}"
    assert gain >= MIN_MEAN_GAIN, f"mean held-out pass@1 gain {gain:+.3f} < {MIN_MEAN_GAIN}: {runs}"
    assert reward_gain >= MIN_MEAN_REWARD_GAIN, f"mean training reward gain {reward_gain:+.3f}: {runs}"

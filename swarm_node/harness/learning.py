"""The learning check: the recipe of one warm start + GRPO run of tiny-s alone, and what is measured of it.

tests/test_learning.py asserts on it (the means over SEEDS clear MIN_MEAN_GAIN and
MIN_MEAN_REWARD_GAIN); bench/learning_spread.py measures how its statistics move across CPU
kernel paths and with learning broken on purpose. Both read the recipe here, so they measure
the same run.
"""

from __future__ import annotations

SEEDS = (0, 1, 2, 3)
ROUNDS = 100
EVAL_EVERY = 10
FINAL_EVALS = 3  # "final" accuracy = mean of the last three evaluations (rounds 80, 90, 100)
REWARD_WINDOW = 20  # training reward: rounds 1-20 vs the last 20
MIN_MEAN_GAIN = 0.05
MIN_MEAN_REWARD_GAIN = 0.02


def learning_overrides(seed: int) -> list[str]:
    """The config of one learning run (--set overrides; dtype auto = fp32 on CPU)."""
    return ["model.name=tiny-s", f"model.init_seed={seed}", "task.options={digits: 2, second_digits: 1}",
            "task.eval_limit=0", "train.warmstart_steps=900", f"train.seed={seed}", f"train.rounds={ROUNDS}",
            "train.lr=1e-4", f"train.eval_every={EVAL_EVERY}", "train.checkpoint_every=0",
            "rollout.prompts_per_round=16", "rollout.group_size=12", "rollout.max_new_tokens=10",
            "train.micro_batch=96", "threads=1"]


def summarize(rows: list[dict]) -> dict[str, float]:
    """Start / final held-out pass@1 and early / late training reward of one run's metrics rows."""
    evals = [row["eval/accuracy"] for row in rows if "eval/accuracy" in row]
    rewards = [row["reward/mean"] for row in rows if row["round"] > 0 and "reward/mean" in row]
    if len(evals) < FINAL_EVALS + 1 or len(rewards) < 2 * REWARD_WINDOW:
        raise ValueError(f"run too short to summarize: {len(evals)} evaluations, {len(rewards)} rewarded rounds")
    return {"start": evals[0], "final": sum(evals[-FINAL_EVALS:]) / FINAL_EVALS,
            "reward_early": sum(rewards[:REWARD_WINDOW]) / REWARD_WINDOW,
            "reward_late": sum(rewards[-REWARD_WINDOW:]) / REWARD_WINDOW}

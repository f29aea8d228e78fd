"""Rollout: prompts -> groups of completions with generator log-probs and rewards.

A *group* is the paper's unit: G completions sampled for one prompt, scored with the task's
binary reward. Groups are `codec.Group` objects, the same type that travels on the wire, so a
node's own groups and its peers' groups go through the same merge and training code.
Rewards are always computed here, by `score`, from the task's gold answer: for the node's own
samples right after generation and for every peer sample on receipt (a sender's claimed reward
is never trusted).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from swarm_node.backend import Policy
from swarm_node.codec import Completion, Group
from swarm_node.config import RolloutConfig
from swarm_node.tasks import Example, Task


def round_examples(task: Task, round_index: int, k: int, key: str) -> list[Example]:
    """The `k` training examples for a round, a pure function of (key, round).

    Vertical mode uses a per-node key (every node picks its own prompts); horizontal mode uses
    the run id, so every node of the run answers the same prompts in the same round. Being a
    pure function, it also makes `--resume` continue with exactly the prompts it would have used.
    """
    train = task.split("train")
    rng = random.Random(f"{key}/{round_index}")
    return [train[i] for i in rng.sample(range(len(train)), k)]


def prompt_tokens(policy: Policy, task: Task, example: Example) -> list[int]:
    """The exact prompt a node conditions on; receivers rebuild it to check peers' prompts."""
    return policy.encode(task.prompt(example))


def score(groups: list[Group], task: Task, policy: Policy) -> None:
    """Set every completion's reward from the task's gold answer (in place)."""
    for group in groups:
        example = task.example(group.example_id)
        for c in group.completions:
            c.reward = task.reward(policy.decode(c.tokens), example) if example is not None else 0.0


def generate_groups(policy: Policy, task: Task, examples: list[Example], cfg: RolloutConfig,
                    generator: torch.Generator | None = None) -> list[Group]:
    """Sample `cfg.group_size` completions per example and score them."""
    prompts = [prompt_tokens(policy, task, ex) for ex in examples]
    samples = policy.generate(prompts, cfg.group_size, cfg.max_new_tokens, cfg.temperature, generator=generator)
    groups = []
    for ex, prompt, group_samples in zip(examples, prompts, samples):
        completions = [Completion(tokens=np.asarray(s.tokens, dtype=np.uint32),  # [T]
                                  logprobs=np.asarray(s.logprobs, dtype=np.float32),  # [T]
                                  finish_reason=s.finish_reason, reward=0.0) for s in group_samples]
        groups.append(Group(task=task.name, example_id=ex.id, prompt_tokens=np.asarray(prompt, dtype=np.uint32),
                            completions=completions))
    score(groups, task, policy)
    return groups


def group_stats(groups: list[Group], prefix: str = "") -> dict[str, float]:
    """Reward and length statistics of `groups` (TRL's names), keys optionally prefixed (`peer/`)."""
    rewards = np.array([c.reward for g in groups for c in g.completions], dtype=np.float64)  # [N]
    if rewards.size == 0:
        return {}
    lengths = np.array([len(c.tokens) for g in groups for c in g.completions], dtype=np.float64)  # [N]
    clipped = np.array([c.finish_reason == "length" for g in groups for c in g.completions])  # [N]
    zero_std = [np.std([c.reward for c in g.completions]) == 0 for g in groups]
    return {f"{prefix}reward/mean": float(rewards.mean()),
            f"{prefix}reward/frac_reward_zero_std": float(np.mean(zero_std)),
            f"{prefix}completions/mean_length": float(lengths.mean()),
            f"{prefix}completions/clipped_ratio": float(clipped.mean())}

"""Evaluation: greedy pass@1 on held-out examples (the paper's metric).

One greedy completion per example; it counts as solved iff the task's reward is 1, so scoring
has one source of truth (the task's `reward`, the same function training uses).
"""

from __future__ import annotations

import time

from swarm_node.tasks import Example, Task
from swarm_node.train.policy import Policy
from swarm_node.train.rollout import prompt_tokens
from swarm_node.train.sampling import Sampler


def held_out(task: Task, limit: int, split: str = "test") -> list[Example]:
    """The first `limit` examples of `split` (0 = all): a fixed set, so rounds are comparable."""
    examples = task.split(split)
    n = len(examples) if limit <= 0 else min(limit, len(examples))
    return [examples[i] for i in range(n)]


def solved(sampler: Sampler, policy: Policy, task: Task, examples: list[Example], max_new_tokens: int,
           batch_size: int = 64) -> list[bool]:
    """Per example: the greedy answer of `sampler`'s model scores 1 (`policy` tokenizes)."""
    out = []
    for s in range(0, len(examples), batch_size):
        batch = examples[s:s + batch_size]
        samples = sampler.greedy([prompt_tokens(policy, task, ex) for ex in batch], max_new_tokens)
        out += [task.reward(policy.decode(sample.tokens), ex) == 1.0 for sample, ex in zip(samples, batch)]
    return out


def pass_at_1(sampler: Sampler, policy: Policy, task: Task, examples: list[Example], max_new_tokens: int,
              batch_size: int = 64) -> dict[str, float]:
    """Greedy pass@1 of `sampler`'s model on `examples` (`policy` tokenizes): {"accuracy", "n", "seconds"}."""
    start = time.perf_counter()
    right = sum(solved(sampler, policy, task, examples, max_new_tokens, batch_size))
    return {"accuracy": right / max(len(examples), 1), "n": len(examples), "seconds": time.perf_counter() - start}

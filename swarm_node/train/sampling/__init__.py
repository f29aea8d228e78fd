"""Samplers: prompts in, completions with the log-probs of the distribution they came from out.

    Sampler   the seam: `sample` G completions per prompt (or `greedy` ones for evaluation), and
              `sync` the trainer's new weights after every optimizer step
    hf.py     the in-process Hugging Face sampler (shares the trained model: `sync` is a no-op)
    vllm.py   a vLLM engine (the only module that imports vllm); added where vllm is installed

A sampler returns token ids and, for every sampled token, its log-prob under the distribution
it was actually drawn from (softmax(logits / temperature)): the `gen_logp` that F-TIS weighs.
Randomness comes from an explicit integer seed per call, so a resumed run repeats nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class Sample:
    """One sampled completion: token ids, their generator log-probs, and why it ended."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (the last token is EOS) | "length"


class Sampler(Protocol):
    on_policy: bool
    """True when the sampler is the trained model itself, so its log-probs are the trainer's (hf);
    False for a copy that may differ (vllm: the trainer then reports the mismatch on own samples)."""

    def sample(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float,
               seed: int) -> list[list[Sample]]:
        """`n` completions per prompt (one list of n Samples per prompt), seeded by `seed`."""

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[Sample]:
        """One argmax completion per prompt (evaluation)."""

    def sync(self, policy, version: int) -> None:
        """Make the sampler generate from `policy`'s current weights (called after every step)."""

    def close(self) -> None:
        """Release the engine's resources; idempotent."""

"""A task as one node reads it: prompts rendered with its tokenizer, completions decoded and rewarded.

    Scorer(task, tokenizer, chat, system)
      .prompt_tokens(example)   the exact prompt ids a node conditions on (render_prompt + encode)
      .decode(tokens)           a completion's text (special tokens skipped)
      .score(groups)            every completion's reward from the gold answer, in place; returns
                                the decoded texts, so callers that need them decode nothing twice
      .canonical(tokens)        the ids our tokenizer gives the same text (a trailing EOS kept)
      .vocab_size               how many token ids the tokenizer has (the codec's bound on peers' ids)

Generation, evaluation, the warm start and admission of peers' packets all render and reward
through this one object, so what a peer's prompt is checked against is exactly what we would have
generated from. It holds a tokenizer, never a model: the trust boundary (swarm/admit.py) gets a
Scorer and can decide about a packet without touching the policy being trained.

`score` takes any groups with `example_id` and `completions` (each with `tokens` and `reward`):
the wire layer's Group, which sits above this layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm_node.tasks.base import Example, Task
from swarm_node.tasks.prompt import render_prompt


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text`; templates already hold the special tokens they need (none are added)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def decode(tokenizer, tokens) -> str:
    return tokenizer.decode(list(tokens), skip_special_tokens=True)


@dataclass(frozen=True)
class Scorer:
    """Rendering and rewarding of `task` for one tokenizer (see the module docstring)."""

    task: Task
    tokenizer: object
    chat: str = "auto"  # task.chat_template: auto | on | off (tasks/prompt.py)
    system: str | None = None  # task.system_prompt

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def prompt_tokens(self, example: Example) -> list[int]:
        return encode(self.tokenizer, render_prompt(self.task, example, self.tokenizer, self.chat, self.system))

    def decode(self, tokens) -> str:
        return decode(self.tokenizer, tokens)

    def canonical(self, tokens) -> list[int]:
        """encode(decode(tokens)), with a final EOS kept: what this node's tokenizer makes of the
        completion's text. Sampled ids may spell a text another way (BPE splits, special tokens
        that decoding drops); the text, and so the reward, is the same."""
        ids = [int(t) for t in tokens]
        eos = getattr(self.tokenizer, "eos_token_id", None)
        tail = [eos] if ids and eos is not None and ids[-1] == eos else []
        return encode(self.tokenizer, self.decode(ids[:len(ids) - len(tail)])) + tail

    def score(self, groups: list) -> list[str]:
        """Set every completion's reward (0 for an example we do not have); the texts, in order."""
        texts = []
        for group in groups:
            example = self.task.example(group.example_id)
            for c in group.completions:
                text = self.decode(c.tokens)
                c.reward = self.task.reward(text, example) if example is not None else 0.0
                texts.append(text)
        return texts

    def format_fail_frac(self, texts: list[str]) -> float:
        """The share of `texts` whose format is wrong: a wrong prompt for a real model shows up as
        zero reward, and this says whether the format is the reason."""
        return sum(not self.task.format_ok(t) for t in texts) / len(texts) if texts else 0.0

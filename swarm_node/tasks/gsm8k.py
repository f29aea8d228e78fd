"""``gsm8k``: grade-school math word problems (Cobbe et al. 2021), train and test splits.

Records have ``question`` and ``answer`` (a worked solution with calculator
annotations like ``<<48/2=24>>`` whose last line is ``#### <final answer>``).
An example's id is ``"<split>/<record index>"`` (``"train/0"`` .. ``"train/7472"``,
``"test/0"`` .. ``"test/1318"`` for the official files); its gold answer is
the text after ``####`` with commas, ``$`` and spaces removed (``"1,200"`` ->
``"1200"``). Records whose gold is not a plain number are skipped (logged);
the official data has none.

Prompt (``{question}`` is the record's question, verbatim)::

    Solve the math problem. Think step by step, then give the final answer on its own last line as '#### <number>'.

    Question: {question}
    Answer: 

The reference completion is the dataset's solution with the calculator
annotations removed; it already ends with ``#### <answer>``. The reward
compares numbers exactly (:func:`swarm_node.tasks.answer.numbers_equal`):
``"1,200"``, ``"$1200"``, ``"1200.00"`` and ``"1200."`` all equal ``1200``;
``"1200 dollars"`` does not.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence

from swarm_node.tasks.answer import ANSWER_MARKER, format_answer, numbers_equal, parse_number
from swarm_node.tasks.base import Example, Task, index_examples
from swarm_node.tasks.data import load_records

__all__ = ["GSM8KTask", "PROMPT_TEMPLATE", "HUB_ID", "gold_answer", "strip_annotations"]

logger = logging.getLogger(__name__)

HUB_ID = "openai/gsm8k"
PROMPT_TEMPLATE = (
    "Solve the math problem. Think step by step, then give the final answer "
    "on its own last line as '#### <number>'.\n\nQuestion: {question}\nAnswer: "
)

_ANNOTATION = re.compile(r"<<[^<>]*>>")


def gold_answer(solution: str) -> str | None:
    """The normalised final answer of a GSM8K solution, or ``None`` if it has none."""
    head, marker, tail = solution.rpartition(ANSWER_MARKER)
    if not marker:
        return None
    gold = re.sub(r"[\s,$]", "", tail)
    return gold if parse_number(gold) is not None else None


def strip_annotations(solution: str) -> str:
    """``"48/2 = <<48/2=24>>24"`` -> ``"48/2 = 24"``."""
    return _ANNOTATION.sub("", solution)


class GSM8KTask(Task):
    """GSM8K from a local directory/JSONL file or the hub; see the module docstring."""

    numeric_answers = True  # the answer must be a number: `#### 72 clips` is a format failure

    name = "gsm8k"

    def __init__(self, data: str | os.PathLike | None = None, hub_config: str = "main") -> None:
        records = load_records(
            data,
            subdir="gsm8k",
            hub_id=HUB_ID,
            split_names=self.split_names,
            default_split="train",
            hub_config=hub_config,
        )
        self.source = records.source
        self._splits: dict[str, tuple[Example, ...]] = {}
        self._solutions: dict[str, str] = {}
        for split, rows in records.splits.items():
            examples = []
            for index, row in enumerate(rows):
                example_id = f"{split}/{index}"
                question, solution = row.get("question"), row.get("answer")
                gold = gold_answer(solution) if isinstance(solution, str) else None
                if not isinstance(question, str) or gold is None:
                    logger.warning("gsm8k %s: skipping record without a numeric '####' answer", example_id)
                    continue
                examples.append(Example(example_id, question, gold))
                self._solutions[example_id] = strip_annotations(solution).strip()
            self._splits[split] = tuple(examples)
        self._by_id = index_examples(self._splits)
        logger.info(
            "gsm8k: %s from %s",
            ", ".join(f"{s}={len(e)}" for s, e in self._splits.items()),
            self.source,
        )

    def split(self, name: str) -> Sequence[Example]:
        if name not in self.split_names:
            raise self._unknown_split(name)
        if name not in self._splits:
            raise ValueError(f"gsm8k: split {name!r} is not available from {self.source}")
        return self._splits[name]

    def example(self, example_id: str) -> Example | None:
        return self._by_id.get(example_id) if isinstance(example_id, str) else None

    def prompt(self, example: Example) -> str:
        return PROMPT_TEMPLATE.format(question=example.question)

    def reference_completion(self, example: Example) -> str:
        solution = self._solutions.get(example.id)
        known = self._by_id.get(example.id)
        if solution is None or known is None or known.answer != example.answer:
            return format_answer(example.answer)
        return solution

    def check_answer(self, answer: str, example: Example) -> bool:
        return numbers_equal(answer, example.answer)

"""``math500``: the 500-problem MATH test subset (Lightman et al. 2023); evaluation only.

Records have ``problem``, ``solution``, ``answer`` (LaTeX), ``subject``,
``level`` and ``unique_id``. An example's id is ``"test/<record index>"``
(``"test/0"`` .. ``"test/499"``, in file order, which is the same in the
official prm800k file and in ``HuggingFaceH4/MATH-500``); its gold answer is
the record's ``answer`` verbatim. There is no train split:
``split("train")`` raises ``ValueError("math500 is evaluation-only")``.

Prompt (``{question}`` is the record's problem, verbatim)::

    Solve the math problem. Think step by step, then give the final answer on its own last line as '#### <answer>'.

    Question: {question}
    Answer: 

The reference completion is the dataset's worked solution followed by a
``#### <gold answer>`` line.

Grading: the ``####`` answer (see :mod:`swarm_node.tasks.answer`) may be bare
LaTeX/plain math (``\\frac{1}{2}``, ``1/2``), wrapped whole in ``$...$``,
``$$...$$``, ``\\(...\\)`` or ``\\[...\\]``, and/or in ``\\boxed{...}``; an
answer with math mode only in part of it (``$5$ dollars``) scores 0. Gold and
prediction are parsed with ``math_verify.parse`` (as ``$<answer>$``) and
compared with ``math_verify.verify(gold, pred)``. math-verify's signal-based
timeouts are disabled (``parsing_timeout=None``, ``timeout_seconds=None``) so
grading works on any thread; instead the whole check runs under
:func:`swarm_node.tasks.deadline.call_with_deadline` (``timeout_s`` option,
default 5 s) and answers longer than ``max_answer_chars`` (default 500) score 0.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from functools import lru_cache

from swarm_node.tasks.answer import extract_answer, format_answer
from swarm_node.tasks.base import Example, Task, index_examples
from swarm_node.tasks.data import load_records
from swarm_node.tasks.deadline import call_with_deadline

__all__ = ["Math500Task", "PROMPT_TEMPLATE", "HUB_ID", "unwrap_math"]

logger = logging.getLogger(__name__)

HUB_ID = "HuggingFaceH4/MATH-500"
PROMPT_TEMPLATE = (
    "Solve the math problem. Think step by step, then give the final answer "
    "on its own last line as '#### <answer>'.\n\nQuestion: {question}\nAnswer: "
)

#: Largest and smallest (as 10**-x) magnitude a numeric subexpression of a prediction may have.
MAX_LOG10 = 1000
#: A power with a symbolic base may have an exponent up to 10**this (``x^{1000}``) in a prediction.
MAX_SYMBOLIC_EXPONENT_LOG10 = 3

_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


def unwrap_math(answer: str) -> str | None:
    """Strip one whole-answer math delimiter pair and one whole ``\\boxed{}``.

    Returns ``None`` when a ``$`` remains outside (``"$5$ dollars"``).
    """
    s = answer.strip()
    for left, right in _DELIMITERS:
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : len(s) - len(right)].strip()
            break
    if s.startswith("\\boxed{") and _closing_brace(s, len("\\boxed{") - 1) == len(s) - 1:
        s = s[len("\\boxed{") : -1].strip()
    if not s or _UNESCAPED_DOLLAR.search(s):
        return None
    return s


def _closing_brace(s: str, open_at: int) -> int:
    """Index of the ``}`` matching the ``{`` at ``open_at`` (-1 if unbalanced)."""
    depth = 0
    for i in range(open_at, len(s)):
        if s[i] == "{" and (i == 0 or s[i - 1] != "\\"):
            depth += 1
        elif s[i] == "}" and s[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return i
    return -1


def is_safe_to_compare(expr: object) -> bool:
    """False if comparing ``expr`` could force sympy into one huge C-level computation.

    Exact evaluation of ``9^{9^{9}}`` or ``(10^{100})!`` is a single big-int
    operation that no thread-safe deadline can interrupt, so parsed predictions
    are screened first: every numeric subexpression is estimated with a cheap
    5-digit ``evalf`` (mpmath, exponent arithmetic only) and must stay within
    ``10**±MAX_LOG10``; a power with a symbolic base may not have an exponent
    above ``10**MAX_SYMBOLIC_EXPONENT_LOG10``. No MATH answer comes anywhere near these bounds.
    """
    from sympy import Basic, Pow, preorder_traversal

    if not isinstance(expr, Basic):
        return True
    for node in preorder_traversal(expr):
        if node.is_Atom:
            continue
        if isinstance(node, Pow) and node.exp.is_number and not node.base.is_number:
            if not _within(node.exp, MAX_SYMBOLIC_EXPONENT_LOG10, tiny_ok=True):
                return False
        if node.is_number and not _within(node, MAX_LOG10, tiny_ok=False):
            return False
    return True


def _within(value, log10_bound: int, *, tiny_ok: bool) -> bool:
    """Whether ``|value| <= 10**log10_bound`` (and, unless ``tiny_ok``, ``>= 10**-log10_bound``)."""
    from sympy import Float

    bound = Float(f"1e{log10_bound}")
    try:
        parts = value.evalf(5).as_real_imag()
    except Exception:  # noqa: BLE001 - no estimate: leave it to the deadline
        return True
    for part in parts:
        if isinstance(part, Float) and part.is_finite and part != 0:
            magnitude = abs(part)
            if magnitude > bound or (not tiny_ok and magnitude < 1 / bound):
                return False
    return True


def _parse(latex: str) -> list:
    import math_verify

    return math_verify.parse(f"${latex}$", parsing_timeout=None)


@lru_cache(maxsize=2048)
def _parse_gold(gold: str) -> tuple:
    return tuple(_parse(gold))


class Math500Task(Task):
    """MATH-500 from a local directory/JSONL file or the hub; see the module docstring."""

    name = "math500"
    split_names = ("test",)
    max_new_tokens = 512  # LaTeX answers after a worked solution
    eval_limit = 500  # the whole benchmark

    def __init__(
        self,
        data: str | os.PathLike | None = None,
        timeout_s: float | None = 5.0,
        max_answer_chars: int = 500,
    ) -> None:
        records = load_records(
            data, subdir="math500", hub_id=HUB_ID, split_names=self.split_names, default_split="test"
        )
        self.source = records.source
        self.timeout_s = timeout_s
        self.max_answer_chars = max_answer_chars
        examples = []
        self._solutions: dict[str, str] = {}
        for index, row in enumerate(records.splits["test"]):
            example_id = f"test/{index}"
            problem, answer = row.get("problem"), row.get("answer")
            if not isinstance(problem, str) or not isinstance(answer, str) or not answer.strip():
                logger.warning("math500 %s: skipping record without problem/answer", example_id)
                continue
            examples.append(Example(example_id, problem, answer.strip()))
            solution = row.get("solution")
            if isinstance(solution, str):
                self._solutions[example_id] = solution.strip()
        self._splits = {"test": tuple(examples)}
        self._by_id = index_examples(self._splits)
        logger.info("math500: test=%d from %s", len(examples), self.source)

    def split(self, name: str) -> Sequence[Example]:
        if name == "train":
            raise ValueError("math500 is evaluation-only")
        if name != "test":
            raise self._unknown_split(name)
        return self._splits["test"]

    def example(self, example_id: str) -> Example | None:
        return self._by_id.get(example_id) if isinstance(example_id, str) else None

    def prompt(self, example: Example) -> str:
        return PROMPT_TEMPLATE.format(question=example.question)

    def reference_completion(self, example: Example) -> str:
        final = format_answer(example.answer)
        solution = self._solutions.get(example.id)
        known = self._by_id.get(example.id)
        if solution and known is not None and known.answer == example.answer:
            completion = f"{solution}\n\n{final}"
            if extract_answer(completion) == example.answer:
                return completion
        return final

    def check_answer(self, answer: str, example: Example) -> bool:
        if len(answer) > self.max_answer_chars:
            return False
        pred = unwrap_math(answer)
        if pred is None:
            return False
        return call_with_deadline(lambda: self._verify(example.answer, pred), self.timeout_s)

    @staticmethod
    def _verify(gold: str, pred: str) -> bool:
        import math_verify

        gold_parsed = list(_parse_gold(gold))
        pred_parsed = _parse(pred)
        if not gold_parsed or not pred_parsed or not all(map(is_safe_to_compare, pred_parsed)):
            return False
        return bool(math_verify.verify(gold_parsed, pred_parsed, timeout_seconds=None))

"""The shared completion format: pulling the final answer out of a completion.

Every task asks the model to finish with a final-answer line in GSM8K's own
convention::

    ...any reasoning...
    #### <answer>

:func:`extract_answer` implements the (deliberately strict) format rule:

1. The completion contains the marker ``####`` exactly once, and no longer run
   of ``#`` anywhere (``#####`` is not a marker; ``###`` markdown headings are
   fine).
2. The answer is the rest of the marker's line (up to the next ``"\\n"``),
   stripped of whitespace; it must be non-empty.
3. Everything after that line must be whitespace (``str.isspace``); any other
   trailing text makes the format wrong.

Reasoning before the marker is allowed, and so is text before the marker on the
same line (``"So the answer is #### 72"``). A completion that breaks the rule
gets ``None`` here and reward 0.0 from every task.

:func:`parse_number` is the numeric normaliser that GSM8K and arith compare
with: it accepts an optional sign, an optional ``$``, digits with optional
thousands commas (``1,200``; ``12,00`` is rejected), an optional decimal part
and one optional trailing ``.``; values are exact :class:`~fractions.Fraction`
objects, so ``"72.0" == "72"`` with no float fuzz. Anything else (a unit word,
``%``, scientific notation, a fraction ``3/4``) is not a number.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["ANSWER_MARKER", "extract_answer", "format_answer", "parse_number", "numbers_equal"]

ANSWER_MARKER = "####"

_HASH_RUN = re.compile(r"#{4,}")

# Longest answer string parse_number will look at: far beyond any real answer,
# short enough that int conversion of model garbage stays cheap.
MAX_NUMBER_CHARS = 64

_NUMBER = re.compile(
    r"(?P<sign1>[-+]?)(?:\$\s*)?(?P<sign2>[-+]?)"
    r"(?P<num>(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)"
)


def extract_answer(completion: str) -> str | None:
    """The final answer of ``completion``, or ``None`` if its format is wrong.

    See the module docstring for the exact rule. Never raises: anything that
    is not a ``str`` gives ``None``.
    """
    if not isinstance(completion, str):
        return None
    runs = _HASH_RUN.findall(completion)
    if len(runs) != 1 or runs[0] != ANSWER_MARKER:
        return None
    _, _, after = completion.partition(ANSWER_MARKER)
    line, _, rest = after.partition("\n")
    if rest.strip():
        return None
    answer = line.strip()
    return answer or None


def format_answer(answer: str) -> str:
    """The final-answer line for ``answer``: ``"#### <answer>"``."""
    return f"{ANSWER_MARKER} {answer}"


def parse_number(text: str) -> Fraction | None:
    """``text`` as an exact number, or ``None`` if it is not a plain number.

    Accepted: surrounding whitespace, one sign (``-5``, ``+5``, ``-$5``,
    ``$-5``), one ``$`` (optionally followed by spaces), thousands commas in
    groups of three, a decimal part, and one trailing ``.`` (sentence end).
    """
    if not isinstance(text, str):
        return None
    s = text.strip()
    if s.endswith("."):
        s = s[:-1]
    if not s or len(s) > MAX_NUMBER_CHARS:
        return None
    m = _NUMBER.fullmatch(s)
    if m is None or (m["sign1"] and m["sign2"]):
        return None
    value = Fraction(m["num"].replace(",", ""))
    return -value if "-" in (m["sign1"], m["sign2"]) else value


def numbers_equal(predicted: str, gold: str) -> bool:
    """True iff both strings parse as numbers (:func:`parse_number`) and are equal."""
    a = parse_number(predicted)
    return a is not None and a == parse_number(gold)

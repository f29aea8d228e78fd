"""The shared completion format: pulling the final answer out of a completion, and reading it as a number.

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
4. Markdown bold is presentation, not content: a bold opened before the marker
   on its line and closed at the line's end (``**#### 72**``,
   ``**Answer: #### 72**``) or wrapping the whole answer (``#### **72**``) is
   removed from the answer.

Reasoning before the marker is allowed, and so is text before the marker on the
same line (``"So the answer is #### 72"``). A completion that breaks the rule
gets ``None`` here and reward 0.0 from every task; :func:`format_ok` is that
check alone (what the node logs as ``reward/format_fail_frac``).

Numbers (GSM8K and arith): :func:`parse_number` is the plain-number normaliser: an
optional sign, an optional ``$``, digits with optional thousands commas
(``1,200``; ``12,00`` is rejected), an optional decimal part and one optional
trailing ``.``; values are exact :class:`~fractions.Fraction` objects, so
``"72.0" == "72"`` with no float fuzz. :func:`numeric_answer` reads a model's
answer: it first removes LaTeX wrapping of the *whole* answer (one of ``$..$``,
``$$..$$``, ``\\(..\\)``, ``\\[..\\]``, then one ``\\boxed{..}``), then applies
:func:`parse_number`.

What the numeric reward accepts (gold answer 72, or 1000), and why (README copy):

| answer line | reward | why |
|---|:-:|---|
| `#### 72` | 1 | the asked-for form |
| `#### 72.` | 1 | a sentence's full stop is not part of the number |
| `#### 72.00` | 1 | the same exact value (compared as fractions) |
| `#### 1,000` | 1 | thousands commas in groups of three are unambiguous |
| `#### $72`, `#### \\$72` | 1 | a currency sign (plain or LaTeX-escaped) before the number, as in GSM8K's golds |
| `#### $72$` | 1 | LaTeX math mode around the whole answer: still one number |
| `#### \\boxed{72}` | 1 | Qwen2.5's habitual final-answer box around the whole answer: one number |
| `**#### 72**`, `#### **72**` | 1 | markdown bold around the answer line or the answer is presentation |
| `#### 72 clips` | 0 | trailing words: accepting "a number, then anything" would also accept `72 or 73` and `72 + 1`; the prompt asks for `#### <number>` |
| `#### \\boxed{72} clips`, `#### $72$ dollars` | 0 | the same, after the wrapping |
| `#### 72%` | 0 | a different quantity for some questions (72 or 0.72?) |
| `#### 3/4`, `#### 1.2e3` | 0 | not a plain number (GSM8K golds are plain integers) |
| `#### 72\\nDone.` | 0 | text after the answer line breaks the format rule |

The wrappers are removed only when they enclose the whole answer, once each, so
they add no way to hide a second number; the marker rule itself is unchanged
(exactly one ``####``, nothing but whitespace after the answer line).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["ANSWER_MARKER", "extract_answer", "format_ok", "format_answer", "parse_number", "numeric_answer",
           "numbers_equal"]

ANSWER_MARKER = "####"

_HASH_RUN = re.compile(r"#{4,}")
_BOLD = "**"

# Longest answer string parse_number will look at: far beyond any real answer,
# short enough that int conversion of model garbage stays cheap.
MAX_NUMBER_CHARS = 64

_NUMBER = re.compile(
    r"(?P<sign1>[-+]?)(?:\$\s*)?(?P<sign2>[-+]?)"
    r"(?P<num>(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)"
)
# Whole-answer LaTeX math delimiters, longest first ("$$" before "$").
_MATH_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


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
    before, _, after = completion.partition(ANSWER_MARKER)
    line, _, rest = after.partition("\n")
    if rest.strip():
        return None
    answer = _strip_bold(before.rpartition("\n")[2], line.strip())
    return answer or None


def _strip_bold(prefix: str, answer: str) -> str:
    """``answer`` without markdown bold closing a bold opened before the marker, or wrapping it whole."""
    if prefix.count(_BOLD) % 2 == 1 and answer.endswith(_BOLD):
        return answer[: -len(_BOLD)].strip()
    if len(answer) > 2 * len(_BOLD) and answer.startswith(_BOLD) and answer.endswith(_BOLD):
        return answer[len(_BOLD) : -len(_BOLD)].strip()
    return answer


def format_ok(completion: str, numeric: bool = False) -> bool:
    """Whether ``completion`` passes the format part of the reward alone.

    ``numeric=True`` (GSM8K, arith) also requires the answer to read as a number
    (:func:`numeric_answer`), so ``#### 72 clips`` counts as a format failure there.
    Never raises.
    """
    answer = extract_answer(completion)
    return answer is not None and (not numeric or numeric_answer(answer) is not None)


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


def unwrap_latex(answer: str) -> str:
    """``answer`` without one whole-answer math delimiter pair and then one whole ``\\boxed{}``.

    A trailing sentence ``.`` after the wrapping (``$72$.``) goes too. Anything
    not wrapped whole (``$72$ clips``, ``\\boxed{72} clips``) comes back as it was.
    """
    s = answer.strip()
    if s.endswith(".") and s[:-1].rstrip().endswith(("$", "}", "\\)", "\\]")):
        s = s[:-1].rstrip()
    for left, right in _MATH_DELIMITERS:
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
            inner = s[len(left) : len(s) - len(right)].strip()
            if "$" not in inner.replace("\\$", ""):  # "$1$ or $2$" is two pieces of math, not one answer
                s = inner
            break
    boxed = _BOXED.fullmatch(s)
    return boxed[1].strip() if boxed else s


def numeric_answer(answer: str) -> Fraction | None:
    """A model's extracted answer as an exact number (LaTeX wrapping removed), or ``None``."""
    if not isinstance(answer, str) or len(answer) > 4 * MAX_NUMBER_CHARS:
        return None
    s = unwrap_latex(answer)
    return parse_number(s.replace("\\$", "$", 1) if s.lstrip("+-").startswith("\\$") else s)


def numbers_equal(predicted: str, gold: str) -> bool:
    """True iff ``predicted`` reads as a number (:func:`numeric_answer`) equal to ``gold`` (:func:`parse_number`)."""
    a = numeric_answer(predicted)
    return a is not None and a == parse_number(gold)

"""``arith``: synthetic word-form addition/subtraction, generated on the fly (no files).

Example ``"train/123"`` with seed 0 might be ``"What is 48 plus 7?"`` -> ``"55"``.
Prompts are short enough for tiny character-level models::

    prompt:     "Q: What is 48 plus 7?\\nA: "
    reference:  "#### 55"

There is no format instruction in the prompt (it would dwarf the question);
the supervised warm start on reference completions teaches the ``#### <answer>``
line. The reward compares the answer as an exact number (``"75"``, ``"75.0"``,
``"$75"`` all match; see :mod:`swarm_node.tasks.answer`).

Generation: example ``i`` of split ``s`` is drawn from
``random.Random(f"arith/{seed}/{s}/{i}")``, so any node rebuilds it from its id
and the options alone, and :meth:`ArithTask.split` is a lazy sequence. Operands
are uniform in ``[0, 10**digits)`` (the second in ``[0, 10**second_digits)``,
``second_digits`` defaulting to 1: a tiny model learns "48 plus 7" within a minute, "48 plus 27"
barely in 20 rounds); for ``minus`` the operands are ordered so
that ``a >= b`` (answers are never negative). Held-out test set: every
problem ``(op, {a, b})`` (operand order ignored, so ``27 plus 48`` goes with
``48 plus 27``) is assigned to test iff a BLAKE2b hash of it falls in the
first :data:`TEST_FRACTION` of the hash range, independently of ``seed``;
each split draws by rejection sampling from its own side only, so no test
problem ever appears in train, for any seed.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from itertools import product

from swarm_node.tasks.answer import format_answer, numbers_equal
from swarm_node.tasks.base import Example, LazySplit, Task, parse_example_id

__all__ = ["ArithTask", "OPS", "TEST_FRACTION"]

#: Operator word -> function.
OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
_SYMBOLS = {"plus": "+", "minus": "-", "times": "*"}
#: Share of all problems held out for the test split.
TEST_FRACTION = 0.1
_TEST_BUCKETS = 1000  # hash buckets; the first TEST_FRACTION of them are test
_MAX_DRAWS = 100_000  # rejection-sampling bound; unreachable once __init__ checked both sides
_ENUMERATE_LIMIT = 200_000  # problem spaces up to this size are checked exhaustively


def is_test_problem(op: str, a: int, b: int) -> bool:
    """Whether problem ``a op b`` belongs to the held-out test side."""
    lo, hi = sorted((a, b))
    digest = hashlib.blake2b(f"{op}:{lo}:{hi}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % _TEST_BUCKETS < TEST_FRACTION * _TEST_BUCKETS


class ArithTask(Task):
    """Seeded synthetic arithmetic; see the module docstring."""

    numeric_answers = True  # the answer must be a number: `#### 72 clips` is a format failure
    name = "arith"

    @property
    def max_new_tokens(self) -> int:
        """`#### ` + a sign + digits + 1 + EOS, with room for a mistake: digits + 10 tokens (char tokenizer)."""
        return self.digits + 10

    def __init__(
        self,
        digits: int = 2,
        ops: Sequence[str] = ("plus", "minus"),
        seed: int = 0,
        train_size: int = 100_000,
        test_size: int = 500,
        second_digits: int | None = None,
    ) -> None:
        if isinstance(ops, str):
            ops = (ops,)
        if not isinstance(digits, int) or not 1 <= digits <= 18:
            raise ValueError(f"arith: digits must be an int in 1..18, got {digits!r}")
        if not ops or any(op not in OPS for op in ops):
            raise ValueError(f"arith: ops must be a non-empty subset of {tuple(OPS)}, got {ops!r}")
        for key, size in (("train_size", train_size), ("test_size", test_size)):
            if not isinstance(size, int) or not 1 <= size <= 10**18:
                raise ValueError(f"arith: {key} must be a positive int, got {size!r}")
        if second_digits is not None and (not isinstance(second_digits, int) or not 1 <= second_digits <= digits):
            raise ValueError(f"arith: second_digits must be an int in 1..digits, got {second_digits!r}")
        self.digits = digits
        self.second_digits = 1 if second_digits is None else second_digits
        self.ops = tuple(dict.fromkeys(ops))
        self.seed = int(seed)
        self._sizes = {"train": train_size, "test": test_size}
        self._check_both_sides_nonempty()
        self._splits = {s: LazySplit(n, lambda i, s=s: self._make(s, i)) for s, n in self._sizes.items()}

    def split(self, name: str) -> Sequence[Example]:
        try:
            return self._splits[name]
        except (KeyError, TypeError):
            raise self._unknown_split(name) from None

    def example(self, example_id: str) -> Example | None:
        parsed = parse_example_id(example_id)
        if parsed is None:
            return None
        split, index = parsed
        if split not in self._sizes or index >= self._sizes[split]:
            return None
        return self._make(split, index)

    def prompt(self, example: Example) -> str:
        return f"Q: {example.question}\nA: "

    def problem_key(self, example: Example) -> str:
        """The operator and its operands, in order only for `minus`: "3 plus 5" is "5 plus 3"'s twin."""
        _, _, a, op, b = example.question.rstrip("?").split()
        return f"{op}:{a}:{b}" if op == "minus" else f"{op}:{':'.join(sorted((a, b), key=int))}"

    def reference_completion(self, example: Example) -> str:
        return format_answer(example.answer)

    def chat_prompt(self, example: Example) -> str:
        return example.question

    def demonstration(self) -> tuple[Example, str]:
        """One train-side problem worked as `a + b = c` then the answer line (tasks/prompt.py says why)."""
        for i in range(_MAX_DRAWS):  # the first full-width problem of the first op whose answer is neither operand
            shown = self._make("demo", i)  # drawn from the train side of the hash split: never a test problem
            _, _, a, op, b = shown.question.rstrip("?").split()
            if op == self.ops[0] and len(a) == self.digits and shown.answer not in (a, b):
                break
        return shown, f"{a} {_SYMBOLS[op]} {b} = {shown.answer}\n{format_answer(shown.answer)}"

    @property
    def chat_max_new_tokens(self) -> int:
        """The same answer for a chat model with a BPE vocabulary: `a + b = c`, the answer line, EOS."""
        return 4 * self.digits + 16

    def check_answer(self, answer: str, example: Example) -> bool:
        return numbers_equal(answer, example.answer)

    def _make(self, split: str, index: int) -> Example:
        rng = random.Random(f"arith/{self.seed}/{split}/{index}")
        want_test = split == "test"
        top, second = 10**self.digits, 10**self.second_digits
        for _ in range(_MAX_DRAWS):
            op = rng.choice(self.ops)
            a, b = rng.randrange(top), rng.randrange(second)
            if op == "minus" and a < b:
                a, b = b, a
            if is_test_problem(op, a, b) == want_test:
                return Example(f"{split}/{index}", f"What is {a} {op} {b}?", str(OPS[op](a, b)))
        raise RuntimeError(f"arith: no {split} problem found for index {index}")  # pragma: no cover

    def _check_both_sides_nonempty(self) -> None:
        top, second = 10**self.digits, 10**self.second_digits
        if top * second * len(self.ops) > _ENUMERATE_LIMIT:
            return  # millions of problems: each side is non-empty with certainty
        sides = {is_test_problem(op, a, b) for op in self.ops for a, b in product(range(top), range(second))}
        if sides != {False, True}:
            raise ValueError(
                f"arith: digits={self.digits}, ops={self.ops} leave the "
                f"{'test' if True not in sides else 'train'} side empty; use more digits or ops"
            )

    def __repr__(self) -> str:
        return (
            f"ArithTask(digits={self.digits}, second_digits={self.second_digits}, ops={self.ops}, seed={self.seed}, "
            f"train_size={self._sizes['train']}, test_size={self._sizes['test']})"
        )

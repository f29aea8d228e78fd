"""The task interface: :class:`Example`, the :class:`Task` base class, and split containers.

A task owns its examples (by split), turns an example into the prompt the
model is conditioned on, knows a correct completion for it, and scores
completions. Example ids are the wire format between peers: a peer that
receives ``"train/17"`` rebuilds the same example with :meth:`Task.example`,
so ids must be stable and the lookup must tolerate any string an untrusted
peer sends.

Concrete tasks implement :meth:`Task.check_answer`; :meth:`Task.reward` (the
part every caller uses) is shared here so that the format rule and the
never-raise guarantee are identical for all tasks. :meth:`Task.format_ok` is the
format part of the reward alone (the node logs its failure rate as
``reward/format_fail_frac``: a prompt that does not suit a real model shows up as
zero reward, not as an error). How a prompt reaches a chat model is
:func:`swarm_node.tasks.prompt.render_prompt`.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

from swarm_node.tasks.answer import extract_answer, format_ok

__all__ = ["Example", "Task", "LazySplit", "parse_example_id", "index_examples"]

logger = logging.getLogger(__name__)

# "<split>/<index>": the index is canonical decimal (no sign, no leading zeros,
# ASCII digits only) so that one example has exactly one id.
_INDEX_ID = re.compile(r"([a-z]+)/(0|[1-9][0-9]{0,17})", re.ASCII)


@dataclass(frozen=True)
class Example:
    """One problem of a task.

    Attributes:
        id: Stable id within its task, ``"<split>/<key>"`` (e.g. ``"train/17"``).
        question: The problem text.
        answer: The gold final answer as a normalised string (e.g. ``"72"``).
    """

    id: str
    question: str
    answer: str


class Task(ABC):
    """A source of examples with a prompt format and a 0/1 reward."""

    name: str = ""
    #: Split names this task can have (a loaded instance may lack some of them).
    split_names: tuple[str, ...] = ("train", "test")
    #: Whether answers are plain numbers, so that a non-number answer is a format failure.
    numeric_answers: bool = False
    #: The task's natural completion length in tokens (the default of rollout.max_new_tokens).
    max_new_tokens: int = 256
    #: Held-out examples per evaluation by default (task.eval_limit).
    eval_limit: int = 200

    @abstractmethod
    def split(self, name: str) -> Sequence[Example]:
        """All examples of split ``name``; ``ValueError`` if unknown or absent."""

    @abstractmethod
    def example(self, example_id: str) -> Example | None:
        """The example with id ``example_id`` in any split, or ``None``. Never raises."""

    @abstractmethod
    def prompt(self, example: Example) -> str:
        """The full prompt text; the completion starts right after it."""

    def chat_prompt(self, example: Example) -> str:
        """The user turn for a chat-templated model (tasks/prompt.py): by default the plain prompt
        without its trailing whitespace (the template's assistant header is the cue)."""
        return self.prompt(example).rstrip()

    def demonstration(self) -> tuple[Example, str] | None:
        """A worked example shown to chat models as one earlier exchange (its chat prompt, then this
        completion in the answer format), or None. Not training: the weights never see it as a target."""
        return None

    def problem_key(self, example: Example) -> str:
        """What makes two examples one problem (the guard's reserve keeps both or neither: a twin
        trained on would teach the other's answer): by default the question, whitespace and case folded."""
        return " ".join(example.question.split()).casefold()

    @abstractmethod
    def reference_completion(self, example: Example) -> str:
        """A correct completion in the required format."""

    @abstractmethod
    def check_answer(self, answer: str, example: Example) -> bool:
        """Whether the extracted (non-empty) ``answer`` is right for ``example``.

        May raise; :meth:`reward` turns any exception into 0.0.
        """

    def reward(self, completion: str, example: Example) -> float:
        """1.0 iff ``completion`` has the right format and the right answer, else 0.0.

        Never raises.
        """
        try:
            answer = extract_answer(completion)
            if answer is None or not isinstance(example, Example):
                return 0.0
            return 1.0 if self.check_answer(answer, example) else 0.0
        except Exception:  # noqa: BLE001 - a reward must never take the trainer down
            logger.debug("%s: reward failed; scoring 0.0", self.name, exc_info=True)
            return 0.0

    def format_ok(self, completion: str) -> bool:
        """Whether ``completion`` passes the format part of :meth:`reward` (never raises).

        For numeric tasks (:attr:`numeric_answers`) an answer that is not a number
        (``#### 72 clips``) is a format failure too; a wrong number is not.
        """
        return format_ok(completion, numeric=self.numeric_answers)

    def _unknown_split(self, name: object) -> ValueError:
        return ValueError(
            f"unknown split {name!r} for task {self.name!r}; "
            f"expected one of {', '.join(map(repr, self.split_names))}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def parse_example_id(example_id: object) -> tuple[str, int] | None:
    """``"train/17"`` -> ``("train", 17)``; ``None`` for anything not of that exact form."""
    if not isinstance(example_id, str):
        return None
    m = _INDEX_ID.fullmatch(example_id)
    if m is None:
        return None
    return m[1], int(m[2])


class LazySplit(Sequence[Example]):
    """A read-only sequence whose items are built on demand by ``make(index)``."""

    def __init__(self, size: int, make: Callable[[int], Example]) -> None:
        self._size = size
        self._make = make

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> Example: ...
    @overload
    def __getitem__(self, index: slice) -> list[Example]: ...
    def __getitem__(self, index: int | slice) -> Example | list[Example]:
        if isinstance(index, slice):
            return [self._make(i) for i in range(*index.indices(self._size))]
        i = index.__index__()
        if i < 0:
            i += self._size
        if not 0 <= i < self._size:
            raise IndexError(f"index {index} out of range for a split of {self._size}")
        return self._make(i)

    def __repr__(self) -> str:
        return f"LazySplit(size={self._size})"


def index_examples(splits: Mapping[str, Sequence[Example]]) -> dict[str, Example]:
    """One ``id -> Example`` dict over all splits (ids must be unique)."""
    by_id: dict[str, Example] = {}
    for examples in splits.values():
        for ex in examples:
            if ex.id in by_id:
                raise ValueError(f"duplicate example id {ex.id!r}")
            by_id[ex.id] = ex
    return by_id

"""Tasks: datasets, prompts, reference completions and 0/1 rewards.

Three tasks are built in (:data:`TASKS`):

* ``gsm8k``: grade-school math word problems, ``train`` (7,473) and ``test``
  (1,319); see :mod:`swarm_node.tasks.gsm8k`.
* ``math500``: 500 competition problems, ``test`` only (evaluation); graded
  with math-verify; see :mod:`swarm_node.tasks.math500`.
* ``arith``: synthetic word-form addition/subtraction generated from a seed,
  with tiny prompts for character-level models; see :mod:`swarm_node.tasks.arith`.

A task knows text, never token ids; :mod:`swarm_node.tasks.prompt` renders a prompt for a
tokenizer (chat template or plain) and :mod:`swarm_node.tasks.scoring`'s ``Scorer`` pairs a task
with a tokenizer: prompt ids, decoded completions, rewards. Generation, evaluation and admission
of peers' packets all go through one ``Scorer``.

The layer above the base: imports only ``errors`` (and the optional grader math-verify); must
not import wire/, net/, train/, swarm/ or anything above.

Usage::

    task = load_task("gsm8k", "../shared/data/gsm8k")
    ex = task.split("train")[0]            # Example(id="train/0", question=..., answer="72")
    task.example("train/0") == ex           # peers exchange ids, not examples
    task.reward(task.reference_completion(ex), ex)   # 1.0

Completion format (the same for every task)
-------------------------------------------
The completion must end with a final-answer line in GSM8K's convention::

    <optional reasoning, any number of lines>
    #### <answer>

A completion is well-formed iff

1. it contains the marker ``####`` exactly once, and no longer run of ``#``
   (``#####``) anywhere;
2. a non-empty answer follows the marker on the same line (the answer is the
   rest of that line, stripped of whitespace);
3. nothing but whitespace follows that line.

Text before the marker (on earlier lines or the same line) is allowed. The
reward is 1.0 iff the completion is well-formed *and* its answer is right:
compared as exact numbers for gsm8k and arith (``72``, ``72.0``, ``$72``,
``72.`` and ``-5`` / ``1,200`` style all accepted; ``72 dollars``, ``72%`` or
``3/4`` are not), and with math-verify for math500. ``reward`` never raises.

Prompts
-------
gsm8k and math500 (``'#### <number>'`` reads ``'#### <answer>'`` for math500)::

    Solve the math problem. Think step by step, then give the final answer on its own last line as '#### <number>'.

    Question: {question}
    Answer: 

arith: ``"Q: What is 48 plus 27?\\nA: "``, reference completion ``"#### 75"``.

Every prompt ends with a cue (``"Answer: "`` / ``"A: "``): the completion
starts right after it.

Data
----
``load_task(name, data)`` takes a local directory with ``train.jsonl`` /
``test.jsonl``, a single ``.jsonl`` file, or a hub id; ``data=None`` means
``$SWARM_NODE_DATA/<name>`` when that variable is set, else the hub
(``openai/gsm8k``, ``HuggingFaceH4/MATH-500``). See :mod:`swarm_node.tasks.data`.
"""

from __future__ import annotations

import os

from swarm_node.errors import SwarmNodeError
from swarm_node.tasks.answer import extract_answer
from swarm_node.tasks.base import Example, Task

__all__ = ["Example", "Task", "TASKS", "load_task", "extract_answer"]

#: Names accepted by :func:`load_task`.
TASKS = ("gsm8k", "math500", "arith")


def load_task(name: str, data: str | os.PathLike | None = None, **options) -> Task:
    """Build task ``name``.

    Args:
        name: One of :data:`TASKS`.
        data: Local directory or ``.jsonl`` file, or a hub dataset id;
            ``None`` for the task's default. Must be ``None`` for ``arith``.
        **options: Task-specific keyword options:
            ``arith``: ``digits`` (2), ``second_digits`` (= digits), ``ops`` (``("plus", "minus")``), ``seed`` (0),
            ``train_size`` (100_000), ``test_size`` (500);
            ``gsm8k``: ``hub_config`` (``"main"``);
            ``math500``: ``timeout_s`` (5.0), ``max_answer_chars`` (500).

    Raises:
        TaskError: unknown task, bad options, ``data`` given for ``arith``, data that does not
            exist, cannot be read or is malformed (all user-caused; one clear message).
    """
    if not isinstance(options, dict):
        raise TaskError(f"task options must be a mapping, got {options!r}")
    try:
        return _build_task(name, data, **options)
    except TypeError as e:  # an option the task does not take, e.g. task.options={digit: 2}
        raise TaskError(f"bad options for task {name!r}: {e}") from None
    except (ValueError, OSError) as e:  # unknown task, bad option value, missing or malformed data
        raise TaskError(f"task {name!r}: {e}") from None


class TaskError(SwarmNodeError):
    """A task that cannot be built as configured (name, options or data)."""


def _build_task(name: str, data, **options) -> Task:
    key = name.strip().lower() if isinstance(name, str) else name
    if key == "arith":
        from swarm_node.tasks.arith import ArithTask

        if data is not None:
            raise ValueError("arith is synthetic and takes no data (got data=%r)" % (data,))
        return ArithTask(**options)
    if key == "gsm8k":
        from swarm_node.tasks.gsm8k import GSM8KTask

        return GSM8KTask(data, **options)
    if key == "math500":
        from swarm_node.tasks.math500 import Math500Task

        return Math500Task(data, **options)
    raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASKS)}")

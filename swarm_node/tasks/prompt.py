"""How a task's prompt reaches a model: plain text, or wrapped in the tokenizer's chat template.

:meth:`Task.prompt` is always the plain prompt (what base models and the built-in tiny models
are conditioned on). Instruct models were tuned on conversations, so for them the same text goes
in as the user turn of their chat template, with an optional system turn before it::

    render_prompt(task, ex, tokenizer, chat="auto", system=None)
      chat="off"   the plain prompt (a system prompt, if given, is prepended as a paragraph)
      chat="on"    the chat template; an error if the tokenizer has none
      chat="auto"  the chat template iff the tokenizer has one *and* looks instruction-tuned

Why "auto" needs more than "has a template": Qwen2.5 *base* checkpoints ship the same ChatML
template as their -Instruct versions, but their end-of-sequence token is ``<|endoftext|>``,
which the template never emits, so a base model prompted in ChatML is never taught to stop.
A tokenizer looks instruction-tuned when its template ends turns with its own EOS token
(literally, or through the ``eos_token`` variable: Qwen2.5-Instruct, Llama-3-Instruct,
Mistral-Instruct) or its name says so (``instruct``, ``chat``, ``-it``).

With the chat template the user turn is :meth:`Task.chat_prompt` (arith: the bare question),
preceded by the task's :meth:`Task.demonstration`, if it has one, as one earlier user/assistant
exchange. Why arith has one: instruct models answer "What is 64 plus 9?" in prose or as an
equation (SmolLM2-135M-Instruct: ``64 + 9 = 15.``) and never write the ``#### <answer>`` line the
reward asks for, even when the prompt asks for it in words (0 of 40 greedy answers in the format,
measured); after one worked exchange (``35 + 8 = 43\n#### 43``) 40 of 40 greedy answers and 75 % of
T = 1 samples are in the format. The reward stays the same binary format + answer check.

The rendered text is encoded with ``add_special_tokens=False``: templates already contain the
special tokens they need (a BOS, if the family uses one).
"""

from __future__ import annotations

import re

from swarm_node.errors import SwarmNodeError
from swarm_node.tasks.base import Example, Task

__all__ = ["CHAT_MODES", "PromptError", "render_prompt", "uses_chat_template", "looks_instruction_tuned"]

#: Values of the ``task.chat_template`` setting.
CHAT_MODES = ("auto", "on", "off")

_INSTRUCT_NAME = re.compile(r"instruct|chat|(?:^|[-_/])it(?:$|[-_/])", re.IGNORECASE)


class PromptError(SwarmNodeError):
    """A prompt setting that cannot work with this model (e.g. chat_template=on without a template)."""


def looks_instruction_tuned(tokenizer) -> bool:
    """Whether ``tokenizer`` belongs to an instruction-tuned model (see the module docstring)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        return False
    eos = getattr(tokenizer, "eos_token", None)
    if (isinstance(eos, str) and eos and eos in template) or "eos_token" in template:
        return True
    return bool(_INSTRUCT_NAME.search(str(getattr(tokenizer, "name_or_path", "") or "")))


def uses_chat_template(tokenizer, chat: str = "auto") -> bool:
    """Whether :func:`render_prompt` applies the chat template for setting ``chat``."""
    if chat not in CHAT_MODES:
        raise PromptError(f"task.chat_template must be one of {', '.join(CHAT_MODES)}, got {chat!r}")
    if chat == "off":
        return False
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat == "on" and not has_template:
        name = getattr(tokenizer, "name_or_path", "") or "this model"
        raise PromptError(f"task.chat_template=on, but the tokenizer of {name!r} has no chat template; "
                          "use task.chat_template=auto or off")
    return has_template if chat == "on" else looks_instruction_tuned(tokenizer)


def render_prompt(task: Task, example: Example, tokenizer, chat: str = "auto", system: str | None = None) -> str:
    """The exact text the model is conditioned on for ``example``; the completion starts right after it.

    ``system`` is an optional system prompt (``task.system_prompt``): a system turn with the
    chat template, a leading paragraph without it.
    """
    if not uses_chat_template(tokenizer, chat):
        text = task.prompt(example)
        return f"{system}\n\n{text}" if system else text
    messages = [{"role": "system", "content": system}] if system else []
    demo = task.demonstration()
    if demo is not None:
        shown, completion = demo
        messages += [{"role": "user", "content": task.chat_prompt(shown)}, {"role": "assistant", "content": completion}]
    messages.append({"role": "user", "content": task.chat_prompt(example)})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

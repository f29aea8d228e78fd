"""Settings chosen from the model and the task when the config leaves them open (None).

A new user's first command (`swarm-node train --model tiny-s --task arith --rounds 4`) should run
fast and learn visibly (measured, 20 rounds, seeds 0 and 1: held-out pass@1 0.395 -> 0.570 and
0.210 -> 0.520, ~15 s after the cached warm start); the same defaults must stay right for a real
model on GSM8K. So:

    threads                  1 for tiny presets (3-4x faster than torch's default on a shared CPU)
    rollout.prompts_per_round  2 for real models (2 x 12 = the paper's batch of 24); 16 for tiny
                             presets, whose per-round signal at 24 sequences is lost in the noise
    train.lr                 1e-6 for real models (the paper's); tiny presets: 1e-4 at >= 8 prompts
                             per round, 2e-5 below (measured: at 2 prompts 1e-4 destroys them);
                             a packaged model's own (sources.py; smollm2-135m: 1e-5 at 4 prompts, the
                             setting bench/real_model.py measured)
    train.warmstart_steps    900 for tiny presets: a random model never writes `#### <answer>`, so
                             every GRPO group would have zero advantage; 900 (not 600) steps get past
                             the point where it starts answering correctly; 0 for real models
    rollout.max_new_tokens   the task's natural completion length (arith: digits + 10 characters, or
                             4 digits + 16 BPE tokens for a real model's `a + b = c` line; gsm8k: 256)
    task.eval_limit          the task's evaluation size (200; math500: all 500)
    swarm.guard_every        5 in an open swarm (no trusted_peers), 0 with trusted peers (train/guard.py)
    swarm.guard_examples     500 for tiny presets (0.2 s a check on a 2-core CPU), 200 for real models

`resolve` returns the completed config and one line per chosen value with its reason; the node
logs them first thing, and the resolved config is what `config.yaml` and checkpoints record.
"""

from __future__ import annotations

import dataclasses

from swarm_node.config import NodeConfig
from swarm_node.train.presets import PRESETS

TINY_LR, TINY_SMALL_BATCH_LR, REAL_LR = 1e-4, 2e-5, 1e-6
TINY_PROMPTS, REAL_PROMPTS = 16, 2
TINY_WARMSTART_STEPS = 900
GUARD_EVERY, TINY_GUARD_EXAMPLES, REAL_GUARD_EXAMPLES = 5, 500, 200


def _replace(cfg: NodeConfig, section: str, **values) -> NodeConfig:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)})


def resolve_model_defaults(cfg: NodeConfig) -> tuple[NodeConfig, list[str]]:
    """Fill what the model decides (threads, batch, lr, warm start, the guard): no task needed."""
    from swarm_node.train.sources import lookup

    tiny = cfg.model.name in PRESETS
    source = lookup(cfg.model.name)
    chosen = []
    if cfg.threads is None:
        cfg = dataclasses.replace(cfg, threads=1 if tiny else 0)
        chosen.append(f"threads = {cfg.threads} (" + ("a tiny preset runs fastest on one thread" if tiny
                                                        else "torch's default") + ")")
    if cfg.rollout.prompts_per_round is None and source is not None and source.prompts_per_round:
        cfg = _replace(cfg, "rollout", prompts_per_round=source.prompts_per_round)
        chosen.append(f"rollout.prompts_per_round = {source.prompts_per_round} ({source.name}'s measured setting)")
    if cfg.train.lr is None and source is not None and source.lr and cfg.model.lora_r == 0:
        cfg = _replace(cfg, "train", lr=source.lr)
        chosen.append(f"train.lr = {source.lr:g} ({source.name}'s measured setting, full fine-tuning)")
    if cfg.rollout.prompts_per_round is None:
        prompts = TINY_PROMPTS if tiny else REAL_PROMPTS
        cfg = _replace(cfg, "rollout", prompts_per_round=prompts)
        chosen.append(f"rollout.prompts_per_round = {prompts} (" + ("a tiny preset needs a larger batch to learn "
                                                                   "visibly" if tiny else "the paper's batch of 24") + ")")
    if cfg.train.lr is None:
        big_batch = cfg.rollout.prompts_per_round >= 8
        lr = (TINY_LR if big_batch else TINY_SMALL_BATCH_LR) if tiny else REAL_LR
        cfg = _replace(cfg, "train", lr=lr)
        why = (f"a tiny preset at {cfg.rollout.prompts_per_round} prompts per round" if tiny
               else "the paper setting for real models")
        chosen.append(f"train.lr = {lr:g} ({why})")
    if cfg.train.warmstart_steps is None:
        steps = TINY_WARMSTART_STEPS if tiny else 0
        cfg = _replace(cfg, "train", warmstart_steps=steps)
        chosen.append(f"train.warmstart_steps = {steps} (" + ("a random tiny model needs the answer format first"
                                                             if tiny else "a pretrained model needs none") + ")")
    if cfg.swarm.guard_every is None:
        every = 0 if cfg.swarm.trusted_peers else GUARD_EVERY
        cfg = _replace(cfg, "swarm", guard_every=every)
        chosen.append(f"swarm.guard_every = {every} (" + ("every peer is trusted" if every == 0 else "an open swarm") + ")")
    if cfg.swarm.guard_examples is None:
        n = TINY_GUARD_EXAMPLES if tiny else REAL_GUARD_EXAMPLES
        cfg = _replace(cfg, "swarm", guard_examples=n)
        chosen.append(f"swarm.guard_examples = {n} (" + ("a tiny preset answers 500 in a fraction of a second"
                                                        if tiny else "what a real model answers in a check's time") + ")")
    return cfg, chosen


def resolve(cfg: NodeConfig, task) -> tuple[NodeConfig, list[str]]:
    """Fill every open setting from the model and `task` (a loaded `tasks.Task`)."""
    cfg, chosen = resolve_model_defaults(cfg)
    if cfg.rollout.max_new_tokens is None:
        real = getattr(task, "chat_max_new_tokens", None) if cfg.model.name not in PRESETS else None
        n = real or task.max_new_tokens
        cfg = _replace(cfg, "rollout", max_new_tokens=n)
        chosen.append(f"rollout.max_new_tokens = {n} ({task.name}'s natural completion length"
                      + (" for a real model's vocabulary)" if real else ")"))
    if cfg.task.eval_limit is None:
        cfg = _replace(cfg, "task", eval_limit=task.eval_limit)
        chosen.append(f"task.eval_limit = {task.eval_limit} ({task.name}'s evaluation size)")
    return cfg, chosen

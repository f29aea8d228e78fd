"""Settings chosen from the model and the task when the config leaves them open (None).

A new user's first command (`swarm-node train --model tiny-s --task arith --rounds 4`) should run
fast and learn visibly; the same defaults must stay right for a real model on GSM8K. So:

    threads                  1 for tiny presets (3-4x faster than torch's default on a shared CPU)
    train.lr                 2e-5 for the built-in tiny presets (measured: 1e-4 destroys them, 1e-5
                             to 2e-5 improves them), 1e-6 for real models (the paper's setting)
    train.warmstart_steps    600 for tiny presets: a random model never writes `#### <answer>`, so
                             every GRPO group would have zero advantage; 0 for real models
    rollout.max_new_tokens   the task's natural completion length (arith: digits + 10, gsm8k: 256)
    task.eval_limit          the task's evaluation size (200; math500: all 500)

`resolve` returns the completed config and one line per chosen value with its reason; the node
logs them first thing, and the resolved config is what `config.yaml` and checkpoints record.
"""

from __future__ import annotations

import dataclasses

from swarm_node.backend import PRESETS
from swarm_node.config import NodeConfig

TINY_LR, REAL_LR = 2e-5, 1e-6
TINY_WARMSTART_STEPS = 600


def _replace(cfg: NodeConfig, section: str, **values) -> NodeConfig:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)})


def resolve_model_defaults(cfg: NodeConfig) -> tuple[NodeConfig, list[str]]:
    """Fill train.lr and train.warmstart_steps from the model (no task needed)."""
    tiny = cfg.model.name in PRESETS
    chosen = []
    if cfg.threads is None:
        cfg = dataclasses.replace(cfg, threads=1 if tiny else 0)
        chosen.append(f"threads = {cfg.threads} (" + ("a tiny preset runs fastest on one thread" if tiny
                                                        else "torch's default") + ")")
    if cfg.train.lr is None:
        lr = TINY_LR if tiny else REAL_LR
        cfg = _replace(cfg, "train", lr=lr)
        chosen.append(f"train.lr = {lr:g} ({'a tiny preset' if tiny else 'the paper setting for real models'})")
    if cfg.train.warmstart_steps is None:
        steps = TINY_WARMSTART_STEPS if tiny else 0
        cfg = _replace(cfg, "train", warmstart_steps=steps)
        chosen.append(f"train.warmstart_steps = {steps} (" + ("a random tiny model needs the answer format first"
                                                             if tiny else "a pretrained model needs none") + ")")
    return cfg, chosen


def resolve(cfg: NodeConfig, task) -> tuple[NodeConfig, list[str]]:
    """Fill every open setting from the model and `task` (a loaded `tasks.Task`)."""
    cfg, chosen = resolve_model_defaults(cfg)
    if cfg.rollout.max_new_tokens is None:
        cfg = _replace(cfg, "rollout", max_new_tokens=task.max_new_tokens)
        chosen.append(f"rollout.max_new_tokens = {task.max_new_tokens} ({task.name}'s natural completion length)")
    if cfg.task.eval_limit is None:
        cfg = _replace(cfg, "task", eval_limit=task.eval_limit)
        chosen.append(f"task.eval_limit = {task.eval_limit} ({task.name}'s evaluation size)")
    return cfg, chosen

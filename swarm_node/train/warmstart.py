"""Supervised warm start: teach a (tiny, random) model the answer format before RL.

GRPO only learns from groups whose rewards differ; a randomly initialised model never emits
`#### <answer>`, so every group would have zero advantage. A short supervised phase on the
task's reference completions gives it a non-zero success rate to improve on. The paper starts
from pretrained Qwen models and needs no such phase; the demo's tiny presets do.

The result is a full model directory cached on disk, keyed by everything that determines it, so
a second run reuses it (and says so). The recipe does not include the node's RL seed, so nodes
that differ only in their prompts share one warm start. LoRA nodes warm-start their base weights, then train only
the adapter during RL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from swarm_node.config import ModelConfig, NodeConfig
from swarm_node.tasks import Task
from swarm_node.train.policy import Policy
from swarm_node.train.rollout import prompt_tokens

log = logging.getLogger(__name__)
WARMUP_STEPS = 100


def cache_root() -> Path:
    """Where warm-started models are cached: $SWARM_NODE_CACHE or ~/.cache/swarm-node."""
    return Path(os.environ.get("SWARM_NODE_CACHE", Path.home() / ".cache" / "swarm-node"))


def supervised_steps(policy: Policy, task: Task, steps: int, lr: float, batch: int, seed: int,
                     on_step: Callable[[int, float], None] | None = None) -> float:
    """`steps` AdamW steps of next-token cross-entropy on reference completions; returns the last loss.

    Linear learning-rate warm-up over the first WARMUP_STEPS steps and gradient clipping at 1.0:
    without them tiny transformers at lr ~1e-3 stall or spike on this task.
    """
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS))
    train, rng, loss_value = task.split("train"), random.Random(seed), float("nan")
    policy.model.train()
    for step in range(steps):
        examples = [train[rng.randrange(len(train))] for _ in range(batch)]
        prompts = [prompt_tokens(policy, task, ex) for ex in examples]
        targets = [policy.encode(task.reference_completion(ex)) + [policy.eos_id] for ex in examples]
        logp, mask = policy.token_logprobs(prompts, targets)  # [B, T], [B, T]
        loss = -logp.sum() / mask.sum()  # mean token negative log-likelihood
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
        optimizer.step()
        schedule.step()
        loss_value = loss.item()
        if on_step is not None:
            on_step(step + 1, loss_value)
    return loss_value


def warmstart_recipe(cfg: NodeConfig) -> dict:
    """Everything that determines a warm-started model (the node's RL seed is not part of it)."""
    return {"model": cfg.model.name, "init_seed": cfg.model.init_seed, "task": cfg.task.name,
            "options": cfg.task.options, "steps": cfg.train.warmstart_steps, "lr": cfg.train.warmstart_lr,
            "batch": cfg.train.warmstart_batch}


def warmstart_path(cfg: NodeConfig) -> Path:
    """The cache directory of `cfg`'s warm-start recipe (complete iff it holds recipe.json)."""
    key = hashlib.sha256(json.dumps(warmstart_recipe(cfg), sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "warmstart" / f"{Path(cfg.model.name).name}-{cfg.task.name}-{key}"


def warmstarted_model(cfg: NodeConfig, task: Task, on_step: Callable[[int, float], None] | None = None) -> str:
    """Path of the warm-started base model for `cfg`, training and caching it on first use."""
    path = warmstart_path(cfg)
    if (path / "recipe.json").exists():
        log.info("warm start: reusing cached %s", path)
        return str(path)
    log.info("warm start: %d supervised steps for %s on %s", cfg.train.warmstart_steps, cfg.model.name, cfg.task.name)
    base = ModelConfig(name=cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device, init_seed=cfg.model.init_seed)
    policy = Policy.load(base)
    loss = supervised_steps(policy, task, cfg.train.warmstart_steps, cfg.train.warmstart_lr,
                            cfg.train.warmstart_batch, cfg.model.init_seed, on_step)
    # A whole directory, renamed into place when complete. Its name is unique per call, not per pid:
    # containers sharing the cache volume run their nodes under the same pid.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    policy.save(tmp)
    (tmp / "recipe.json").write_text(json.dumps({**warmstart_recipe(cfg), "final_loss": loss}, indent=1))
    try:
        os.rename(tmp, path)
    except OSError:  # another process cached the same recipe first: use theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return str(path)

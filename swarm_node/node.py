"""The node: the round loop. Read it top to bottom; each stage has a banner.

    round r:  generate own groups -> exchange packets with peers -> merge -> train one step
              -> evaluate (every k rounds) -> log one metrics row -> checkpoint

Round 0 is the starting point (held-out accuracy before any RL); rounds 1..N train. A
checkpoint after round r resumes at r + 1 with the same prompts, RNG and optimizer state.
Alone (`swarm-node train`) the exchange stage is skipped; in a swarm (`swarm-node join`) it
offers this round's packet and collects peers' packets (see exchange.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from swarm_node.backend import Policy
from swarm_node.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from swarm_node.config import NodeConfig
from swarm_node.evaluate import held_out, pass_at_1
from swarm_node.merge import combine
from swarm_node.metrics import MetricsWriter, drop_rounds_after, summary_line
from swarm_node.rollout import generate_groups, group_stats, round_examples
from swarm_node.tasks import load_task
from swarm_node.trainer import Trainer
from swarm_node.warmstart import warmstarted_model

log = logging.getLogger(__name__)


def _due(r: int, every: int, last: int) -> bool:
    return r == last or (every > 0 and r % every == 0)


def load_policy(cfg: NodeConfig, base: str, checkpoint: Path | None) -> Policy:
    """The policy to train: from a checkpoint if resuming, else the (warm-started) base model."""
    model_cfg = type(cfg.model)(**{**cfg.model.__dict__, "name": base})
    if checkpoint is None:
        return Policy.load(model_cfg)
    if cfg.model.lora_r > 0:  # a LoRA checkpoint holds only the adapter: base weights first
        return Policy.load(model_cfg, adapter_path=checkpoint / "model")
    return Policy.load(type(cfg.model)(**{**model_cfg.__dict__, "name": str(checkpoint / "model")}))


def run(cfg: NodeConfig, resume: bool = False, exchange=None, on_round=None) -> list[dict]:
    """Train for `cfg.train.rounds` rounds; returns the metrics rows (also in OUT/metrics.jsonl).

    `exchange` is an `exchange.Exchange` when the node is in a swarm, None when alone.
    `on_round(row)` is called after every round (the demo's live view uses it).
    """
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    cfg.save(out / "config.yaml")
    task = load_task(cfg.task.name, cfg.task.data, **cfg.task.options)
    eval_task = load_task(cfg.task.eval_task, cfg.task.data) if cfg.task.eval_task else task
    eval_set = held_out(eval_task, cfg.task.eval_limit)
    base = warmstarted_model(cfg, task) if cfg.train.warmstart_steps > 0 else cfg.model.name
    checkpoint = latest_checkpoint(out) if resume else None
    policy = load_policy(cfg, base, checkpoint)
    trainer = Trainer(policy, cfg)
    generator = torch.Generator().manual_seed(cfg.train.seed)
    first = 0
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, trainer.optimizer, generator)
        first, trainer.policy_version = state["round"] + 1, state["policy_version"]
        log.info("resumed from %s: next round %d", checkpoint, first)
    if resume:  # rounds after the checkpoint are trained again: their old rows must not appear twice
        drop_rounds_after(out / "metrics.jsonl", first - 1)
    if exchange is not None:
        exchange.start(policy, task)
    prompt_key = f"run/{cfg.swarm.run_id}" if cfg.swarm.mode == "horizontal" else f"node/{cfg.train.seed}"
    metrics, rows, last = MetricsWriter(out / "metrics.jsonl"), [], cfg.train.rounds
    finished = False
    try:
        for r in range(first, last + 1):
            row: dict = {"round": r, "node": cfg.name}
            t_round = time.perf_counter()
            if r > 0:
                # ---------------------------------------------------------------- generate
                t = time.perf_counter()
                examples = round_examples(task, r, cfg.rollout.prompts_per_round, prompt_key)
                own = generate_groups(policy, task, examples, cfg.rollout, generator)
                row.update(group_stats(own), **{"time/generate_s": time.perf_counter() - t})

                # ---------------------------------------------------------------- exchange
                peer_groups = []
                if exchange is not None:
                    peer_groups, swarm_stats = exchange.round(r, trainer.policy_version, own)
                    row.update(swarm_stats, **group_stats(peer_groups, prefix="peer/"))

                # ---------------------------------------------------------------- merge + train
                batch = combine(own, peer_groups, cfg.swarm.mode)
                row.update(trainer.step(batch))

            # -------------------------------------------------------------------- evaluate
            if r == 0 and first == 0 or r > 0 and _due(r, cfg.train.eval_every, last):
                result = pass_at_1(policy, eval_task, eval_set, cfg.rollout.max_new_tokens)
                row.update({"eval/accuracy": result["accuracy"], "eval/n": result["n"], "time/eval_s": result["seconds"]})

            # -------------------------------------------------------------------- log + checkpoint
            row["time/round_s"] = time.perf_counter() - t_round
            metrics.write(row)
            rows.append(row)
            log.info(summary_line(row))
            if on_round is not None:
                on_round(row)
            if r > 0 and _due(r, cfg.train.checkpoint_every, last):
                save_checkpoint(out, policy, trainer.optimizer, {"round": r, "policy_version": trainer.policy_version,
                                                                  "base_model": base}, cfg, generator)
        if cfg.task.ood_task:
            ood = load_task(cfg.task.ood_task, cfg.task.ood_data)
            result = pass_at_1(policy, ood, held_out(ood, cfg.task.eval_limit), cfg.rollout.max_new_tokens)
            final = {"round": last, "node": cfg.name, "ood/accuracy": result["accuracy"], "ood/n": result["n"]}
            metrics.write(final)
            rows.append(final)
            log.info("out-of-distribution (%s) pass@1: %.3f", cfg.task.ood_task, result["accuracy"])
        finished = True
    finally:
        metrics.close()
        if exchange is not None:
            exchange.close(linger=finished)
    return rows

"""Trainer: one step changes every trainable parameter (LoRA: only the adapter), uses the loss."""

import numpy as np
import torch

from swarm_node.backend import Policy
from swarm_node.config import ModelConfig, NodeConfig, RolloutConfig
from swarm_node.rollout import generate_groups, round_examples
from swarm_node.trainer import Trainer


def _groups_with_signal(policy, task):
    groups = generate_groups(policy, task, round_examples(task, 1, 2, "t"), RolloutConfig(group_size=4, max_new_tokens=5),
                             torch.Generator().manual_seed(0))
    for g in groups:  # make every group informative: two right, two wrong
        for i, c in enumerate(g.completions):
            c.reward = float(i % 2)
    return groups


def test_one_step_changes_every_trainable_parameter(arith):
    cfg = NodeConfig()
    cfg.train.lr, cfg.train.micro_batch = 1e-2, 3
    policy = Policy.load(ModelConfig(name="tiny-s"))
    trainer = Trainer(policy, cfg)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    stats = trainer.step(_groups_with_signal(policy, arith))
    unchanged = [n for n, p in policy.model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []
    assert trainer.policy_version == 1 and stats["train/active_frac"] == 1.0
    assert np.isfinite(stats["loss/policy"]) and stats["is/ratio_mean"] > 0


def test_lora_step_changes_only_the_adapter(arith):
    cfg = NodeConfig()
    cfg.train.lr = 1e-2
    policy = Policy.load(ModelConfig(name="tiny-s", lora_r=4))
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    trainer = Trainer(policy, cfg)
    # LoRA's B starts at zero, so A's gradient is zero on the first step: take two.
    trainer.step(_groups_with_signal(policy, arith))
    trainer.step(_groups_with_signal(policy, arith))
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert changed == trainable and all("lora_" in n for n in changed)


def test_groups_without_signal_take_no_step(tiny_policy, arith):
    groups = _groups_with_signal(tiny_policy, arith)
    for g in groups:
        for c in g.completions:
            c.reward = 1.0
    trainer = Trainer(tiny_policy, NodeConfig())
    before = [p.detach().clone() for p in tiny_policy.trainable_parameters()]
    stats = trainer.step(groups)
    assert stats["train/active_frac"] == 0.0 and trainer.policy_version == 0
    assert all(torch.equal(a, b) for a, b in zip(before, tiny_policy.trainable_parameters()))


def test_micro_batching_matches_one_big_batch(arith):
    """Accumulated micro-batch gradients equal the whole-batch gradient of the paper's objective."""
    grads = []
    for micro in (1, 8):
        cfg = NodeConfig()
        cfg.train.micro_batch, cfg.train.max_grad_norm = micro, 0.0
        policy = Policy.load(ModelConfig(name="tiny-s", init_seed=7))
        trainer = Trainer(policy, cfg)
        trainer.optimizer.step = lambda: None  # keep weights: compare gradients only
        trainer.step(_groups_with_signal(policy, arith))
        grads.append([p.grad.clone() for p in policy.trainable_parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)

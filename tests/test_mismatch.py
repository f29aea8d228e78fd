"""Sampler/trainer mismatch (trainer.mismatch_stats): the pure function, and the figures a step reports
from its own forward for the node's own samples."""

import math

import pytest
import torch

from swarm_node import metrics as M
from swarm_node.config import NodeConfig, RolloutConfig
from swarm_node.train.batch import TrainBatch
from swarm_node.train.rollout import generate_groups, round_examples
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.train.trainer import Trainer, mismatch_stats

KEYS = {M.MISMATCH_LOGP_DIFF_MEAN, M.MISMATCH_LOGP_DIFF_MAX, M.MISMATCH_RATIO_MIN, M.MISMATCH_RATIO_MEAN,
        M.MISMATCH_RATIO_MAX}


def test_stats_over_the_compared_tokens():
    logp = torch.tensor([[-1.0, -2.0, -5.0], [-0.5, 0.0, 0.0]])  # [B, T]
    gen = torch.tensor([[-1.5, -2.0, 9.0], [-0.25, 7.0, 7.0]])  # [B, T] padding holds garbage
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # [B, T]
    stats = mismatch_stats((logp - gen)[mask > 0])
    diffs = [0.5, 0.0, -0.25]  # logp - gen on the three completion tokens
    assert math.isclose(stats[M.MISMATCH_LOGP_DIFF_MEAN], sum(abs(d) for d in diffs) / 3, rel_tol=1e-6)
    assert math.isclose(stats[M.MISMATCH_LOGP_DIFF_MAX], 0.5, rel_tol=1e-6)
    assert math.isclose(stats[M.MISMATCH_RATIO_MIN], math.exp(-0.25), rel_tol=1e-6)
    assert math.isclose(stats[M.MISMATCH_RATIO_MAX], math.exp(0.5), rel_tol=1e-6)
    assert math.isclose(stats[M.MISMATCH_RATIO_MEAN], sum(math.exp(d) for d in diffs) / 3, rel_tol=1e-6)


def test_no_tokens_and_huge_differences_stay_finite():
    empty = mismatch_stats(torch.zeros(0))
    assert set(empty) == KEYS and empty[M.MISMATCH_RATIO_MEAN] == 1.0 and empty[M.MISMATCH_LOGP_DIFF_MAX] == 0.0
    huge = mismatch_stats(torch.tensor([1000.0]))
    assert math.isfinite(huge[M.MISMATCH_RATIO_MAX]) and huge[M.MISMATCH_LOGP_DIFF_MAX] == 1000.0


@pytest.fixture
def groups(tiny_policy, arith):
    cfg = RolloutConfig(group_size=4, prompts_per_round=2, max_new_tokens=8, temperature=0.7)
    groups = generate_groups(HFSampler(tiny_policy), tiny_policy, arith, round_examples(arith, 1, 2, "k"), cfg, seed=3)
    for g in groups:  # every row active: two right, two wrong
        for i, c in enumerate(g.completions):
            c.reward = float(i % 2)
    return groups


def step_stats(policy, groups, temperature: float, own: list[bool], on_policy: bool = False) -> dict:
    """One step's stats; the optimizer does not move the weights (the samples stay the policy's)."""
    cfg = NodeConfig()
    cfg.train.lr, cfg.train.micro_batch, cfg.train.logprob_chunk = 1e-3, 3, 5
    trainer = Trainer(policy, cfg.train, cfg.loss, temperature, sampler_on_policy=on_policy)
    trainer.optimizer.step = lambda: None
    return trainer.step(TrainBatch.from_groups(groups, policy.pad_id, own=own))


def test_a_step_reports_the_mismatch_of_own_hf_samples_as_none(tiny_policy, groups):
    """The HF sampler and the trainer share one model: own samples have ratio 1 (float rounding)."""
    stats = step_stats(tiny_policy, groups, 0.7, [True] * 8)
    assert stats[M.MISMATCH_LOGP_DIFF_MAX] < 1e-4
    assert abs(stats[M.MISMATCH_RATIO_MIN] - 1) < 1e-4 and abs(stats[M.MISMATCH_RATIO_MAX] - 1) < 1e-4
    # at another temperature the same samples are off-policy: the stats must see it
    assert step_stats(tiny_policy, groups, 1.0, [True] * 8)[M.MISMATCH_LOGP_DIFF_MEAN] > 1e-2


def test_only_own_samples_count_and_only_for_an_off_policy_sampler(tiny_policy, groups):
    for c in groups[1].completions:  # a peer's group whose claims are far off
        c.logprobs = c.logprobs - 3.0
    own_only = step_stats(tiny_policy, groups, 0.7, [True] * 4 + [False] * 4)
    assert own_only[M.MISMATCH_LOGP_DIFF_MAX] < 1e-4
    assert step_stats(tiny_policy, groups, 0.7, [True] * 8)[M.MISMATCH_LOGP_DIFF_MAX] > 2.9
    assert not KEYS & set(step_stats(tiny_policy, groups, 0.7, [False] * 8))  # no own token: no figure
    assert not KEYS & set(step_stats(tiny_policy, groups, 0.7, [True] * 8, on_policy=True))

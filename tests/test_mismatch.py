"""Generator/trainer mismatch stats (sampling/mismatch.py): the pure function, and the HF sampler's own samples."""

import math

import torch

from swarm_node.config import RolloutConfig
from swarm_node.train.rollout import generate_groups, round_examples
from swarm_node.train.sampling import mismatch as MM
from swarm_node.train.sampling.hf import HFSampler


def test_stats_over_completion_tokens_only():
    logp = torch.tensor([[-1.0, -2.0, -5.0], [-0.5, 0.0, 0.0]])  # [B, T]
    gen = torch.tensor([[-1.5, -2.0, 9.0], [-0.25, 7.0, 7.0]])  # [B, T] padding holds garbage
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # [B, T]
    stats = MM.mismatch_stats(logp, gen, mask)
    diffs = [0.5, 0.0, -0.25]  # logp - gen on the three completion tokens
    assert math.isclose(stats[MM.LOGP_DIFF_MEAN], sum(abs(d) for d in diffs) / 3, rel_tol=1e-6)
    assert math.isclose(stats[MM.LOGP_DIFF_MAX], 0.5, rel_tol=1e-6)
    assert math.isclose(stats[MM.RATIO_MIN], math.exp(-0.25), rel_tol=1e-6)
    assert math.isclose(stats[MM.RATIO_MAX], math.exp(0.5), rel_tol=1e-6)
    assert math.isclose(stats[MM.RATIO_MEAN], sum(math.exp(d) for d in diffs) / 3, rel_tol=1e-6)


def test_no_tokens_and_huge_differences_stay_finite():
    empty = MM.mismatch_stats(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))
    assert empty[MM.RATIO_MEAN] == 1.0 and empty[MM.LOGP_DIFF_MAX] == 0.0
    huge = MM.mismatch_stats(torch.tensor([[0.0]]), torch.tensor([[-1000.0]]), torch.ones(1, 1))
    assert math.isfinite(huge[MM.RATIO_MAX]) and huge[MM.LOGP_DIFF_MAX] == 1000.0


def test_hf_samples_are_on_policy(tiny_policy, arith):
    """The HF sampler and the trainer share one model: own samples have ratio 1 (float rounding)."""
    cfg = RolloutConfig(group_size=3, prompts_per_round=2, max_new_tokens=8, temperature=0.7)
    groups = generate_groups(HFSampler(tiny_policy), tiny_policy, arith, round_examples(arith, 1, 2, "k"), cfg, seed=3)
    stats = MM.own_sample_mismatch(tiny_policy, groups, cfg.temperature, micro_batch=4, chunk=5)
    assert stats[MM.LOGP_DIFF_MAX] < 1e-4
    assert abs(stats[MM.RATIO_MIN] - 1) < 1e-4 and abs(stats[MM.RATIO_MAX] - 1) < 1e-4
    # at another temperature the same samples are off-policy: the stats must see it
    assert MM.own_sample_mismatch(tiny_policy, groups, 1.0)[MM.LOGP_DIFF_MEAN] > 1e-2

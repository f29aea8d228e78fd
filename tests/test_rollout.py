"""Rollout: groups carry the exact prompt, generator log-probs and rewards from the task."""

import numpy as np
import torch

from swarm_node.config import RolloutConfig
from swarm_node.rollout import generate_groups, group_stats, prompt_tokens, round_examples, score


def test_round_examples_are_a_pure_function_of_key_and_round(arith):
    a = round_examples(arith, 3, 4, "node/0")
    assert a == round_examples(arith, 3, 4, "node/0")
    assert a != round_examples(arith, 4, 4, "node/0")
    assert a != round_examples(arith, 3, 4, "node/1")
    assert len({ex.id for ex in a}) == 4


def test_generate_groups(tiny_policy, arith):
    examples = round_examples(arith, 1, 2, "k")
    cfg = RolloutConfig(group_size=3, prompts_per_round=2, max_new_tokens=6)
    groups = generate_groups(tiny_policy, arith, examples, cfg, torch.Generator().manual_seed(0))
    assert [g.example_id for g in groups] == [ex.id for ex in examples]
    for g, ex in zip(groups, examples):
        assert g.task == "arith" and g.prompt_tokens.dtype == np.uint32
        assert g.prompt_tokens.tolist() == prompt_tokens(tiny_policy, arith, ex)
        assert len(g.completions) == 3
        for c in g.completions:
            assert c.tokens.dtype == np.uint32 and c.logprobs.dtype == np.float32
            assert len(c.tokens) == len(c.logprobs) <= 6 and (c.logprobs <= 0).all()
            assert c.reward == arith.reward(tiny_policy.decode(c.tokens), ex)


def test_score_recomputes_rewards_from_gold(tiny_policy, arith):
    ex = arith.split("train")[5]
    cfg = RolloutConfig(group_size=2, max_new_tokens=2)
    [group] = generate_groups(tiny_policy, arith, [ex], cfg)
    right = np.asarray(tiny_policy.encode(arith.reference_completion(ex)), dtype=np.uint32)
    group.completions[0].tokens, group.completions[0].reward = right, 0.0
    group.completions[1].reward = 1.0  # a false claim
    score([group], arith, tiny_policy)
    assert group.completions[0].reward == 1.0
    assert group.completions[1].reward == arith.reward(tiny_policy.decode(group.completions[1].tokens), ex)


def test_group_stats(tiny_policy, arith):
    groups = generate_groups(tiny_policy, arith, round_examples(arith, 1, 2, "k"),
                             RolloutConfig(group_size=2, max_new_tokens=3))
    groups[0].completions[0].reward = 1.0
    stats = group_stats(groups, prefix="peer/")
    rewards = [c.reward for g in groups for c in g.completions]
    assert stats["peer/reward/mean"] == np.mean(rewards)
    assert stats["peer/completions/clipped_ratio"] == np.mean(
        [c.finish_reason == "length" for g in groups for c in g.completions])
    assert group_stats([]) == {}

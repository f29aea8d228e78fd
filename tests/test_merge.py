"""Merge: every check of a peer packet, reward recomputation, fair caps, horizontal groups."""

import numpy as np
import pytest
import torch

from swarm_node.codec import Packet, encode, tokenizer_fingerprint
from swarm_node.config import RolloutConfig
from swarm_node.merge import Expectations, Rejected, accept_packet, cap_peer_groups, combine
from swarm_node.rollout import generate_groups, round_examples

PEER = "QmPeerA"


@pytest.fixture
def setup(tiny_policy, arith):
    groups = generate_groups(tiny_policy, arith, round_examples(arith, 5, 2, "peer"),
                             RolloutConfig(group_size=3, max_new_tokens=4), torch.Generator().manual_seed(0))
    expect = Expectations(run_id="run", tokenizer=tokenizer_fingerprint(tiny_policy.tokenizer), round=5, staleness=2)
    return tiny_policy, arith, groups, expect


def _packet(groups, expect, **changes):
    fields = dict(run_id=expect.run_id, sender=PEER, model_id="tiny-s", tokenizer=expect.tokenizer,
                  policy_version=3, round=expect.round, mode="vertical", groups=groups)
    fields.update(changes)
    return encode(Packet(**fields))


def test_honest_packet_is_accepted_with_rewards_recomputed(setup):
    policy, task, groups, expect = setup
    ex = task.example(groups[0].example_id)
    right = np.asarray(policy.encode(task.reference_completion(ex)), dtype=np.uint32)
    groups[0].completions[0].tokens = right
    groups[0].completions[0].logprobs = np.full(len(right), -1.0, dtype=np.float32)
    for g in groups:  # the sender lies about every reward
        for c in g.completions:
            c.reward = 1.0 - c.reward
    packet = accept_packet(_packet(groups, expect), PEER, expect, task, policy)
    assert packet.groups[0].completions[0].reward == 1.0
    for g in packet.groups:
        for c in g.completions:
            assert c.reward == task.reward(policy.decode(c.tokens), task.example(g.example_id))


@pytest.mark.parametrize("change, remote, reason", [
    ({"run_id": "other"}, PEER, "wrong_run"),
    ({}, "QmSomeoneElse", "sender_mismatch"),
    ({"tokenizer": "sha256:" + "0" * 64}, PEER, "tokenizer_mismatch"),
    ({"round": 9}, PEER, "stale"),
    ({"round": 2}, PEER, "stale"),
])
def test_header_checks(setup, change, remote, reason):
    policy, task, groups, expect = setup
    with pytest.raises(Rejected) as e:
        accept_packet(_packet(groups, expect, **change), remote, expect, task, policy)
    assert e.value.reason == reason


def test_group_checks(setup):
    policy, task, groups, expect = setup
    bad_id = [type(groups[0])(task="arith", example_id="train/999999999", prompt_tokens=groups[0].prompt_tokens,
                              completions=groups[0].completions)]
    wrong_task = [type(groups[0])(task="gsm8k", example_id=groups[0].example_id,
                                  prompt_tokens=groups[0].prompt_tokens, completions=groups[0].completions)]
    other_prompt = [type(groups[0])(task="arith", example_id=groups[0].example_id,
                                    prompt_tokens=groups[1].prompt_tokens, completions=groups[0].completions)]
    for bad, reason in ((bad_id, "unknown_example"), (wrong_task, "wrong_task"), (other_prompt, "prompt_mismatch")):
        with pytest.raises(Rejected) as e:
            accept_packet(_packet(bad, expect), PEER, expect, task, policy)
        assert e.value.reason == reason


def test_codec_errors_become_rejections(setup):
    policy, task, groups, expect = setup
    data = bytearray(_packet(groups, expect))
    with pytest.raises(Rejected) as e:
        accept_packet(bytes(data[:-3]), PEER, expect, task, policy)
    assert e.value.reason.startswith("codec_")
    groups[0].completions[0].tokens = np.array([policy.vocab_size + 5], dtype=np.uint32)
    groups[0].completions[0].logprobs = np.array([-1.0], dtype=np.float32)
    with pytest.raises(Rejected) as e:
        accept_packet(_packet(groups, expect), PEER, expect, task, policy)
    assert e.value.reason == "codec_token_out_of_range"


def test_cap_is_fair_across_peers():
    a, b, c = (object() for _ in range(3))
    by_peer = {"a": [a] * 5, "b": [b], "c": [c] * 3}
    assert cap_peer_groups(by_peer, 4) == [a, b, c, a]  # b's only group makes it despite a's flood
    assert cap_peer_groups(by_peer, 100) == [a, b, c, a, c, a, c, a, a]
    assert cap_peer_groups(by_peer, 0) == []


def test_combine_vertical_and_horizontal(setup):
    _, _, groups, _ = setup
    peer_copy = [type(g)(g.task, g.example_id, g.prompt_tokens, list(g.completions)) for g in groups]
    assert len(combine(groups, peer_copy, "vertical")) == 4
    merged = combine(groups, peer_copy, "horizontal")
    assert [g.example_id for g in merged] == [g.example_id for g in groups]
    assert all(len(g.completions) == 6 for g in merged)
    assert len(groups[0].completions) == 3  # inputs untouched

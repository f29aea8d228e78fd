"""Rollout: groups carry the exact prompt, generator log-probs and rewards from the task."""

import numpy as np
import pytest

from swarm_node.config import RolloutConfig
from swarm_node.train.rollout import (OWN, RolloutBuffer, combine, draws_key, generate_groups, group_stats,
                                      prompt_tokens, round_examples, round_seed)
from swarm_node.train.sampling.hf import HFSampler


def _groups(policy, task, examples, cfg, seed=0):
    return generate_groups(HFSampler(policy), policy, task, examples, cfg, seed)


def test_round_examples_are_a_pure_function_of_key_and_round(arith):
    a = round_examples(arith, 3, 4, "node/0")
    assert a == round_examples(arith, 3, 4, "node/0")
    assert a != round_examples(arith, 4, 4, "node/0")
    assert a != round_examples(arith, 3, 4, "node/1")
    assert len({ex.id for ex in a}) == 4


def test_generate_groups(tiny_policy, arith):
    examples = round_examples(arith, 1, 2, "k")
    cfg = RolloutConfig(group_size=3, prompts_per_round=2, max_new_tokens=6)
    groups = _groups(tiny_policy, arith, examples, cfg)
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
    [group] = _groups(tiny_policy, arith, [ex], cfg)
    right = np.asarray(tiny_policy.encode(arith.reference_completion(ex)), dtype=np.uint32)
    group.completions[0].tokens, group.completions[0].reward = right, 0.0
    group.completions[1].reward = 1.0  # a false claim
    tiny_policy.scorer(arith).score([group])
    assert group.completions[0].reward == 1.0
    assert group.completions[1].reward == arith.reward(tiny_policy.decode(group.completions[1].tokens), ex)


def test_group_stats(tiny_policy, arith):
    groups = _groups(tiny_policy, arith, round_examples(arith, 1, 2, "k"), RolloutConfig(group_size=2, max_new_tokens=3))
    groups[0].completions[0].reward = 1.0
    stats = group_stats(groups, prefix="peer/")
    rewards = [c.reward for g in groups for c in g.completions]
    assert stats["peer/reward/mean"] == np.mean(rewards)
    assert stats["peer/completions/clipped_ratio"] == np.mean(
        [c.finish_reason == "length" for g in groups for c in g.completions])
    assert group_stats([]) == {}


def test_round_seed_is_a_pure_function_of_seed_and_round():
    assert round_seed(0, 3) == round_seed(0, 3)
    assert len({round_seed(0, 3), round_seed(0, 4), round_seed(1, 3)}) == 3


def test_nodes_without_a_seed_draw_their_own_prompts_and_samples(arith):
    alone, a, b = draws_key(None, None), draws_key(None, "QmA"), draws_key(None, "QmB")
    assert alone == "0" and round_seed(alone, 3) == round_seed(0, 3)  # alone: seed 0, as before
    assert draws_key(7, "QmA") == draws_key(7, "QmB") == "7"  # a set seed: the same draws wherever it runs
    assert round_seed(a, 3) != round_seed(b, 3)
    assert round_examples(arith, 3, 4, f"node/{a}") != round_examples(arith, 3, 4, f"node/{b}")


def _teaching():
    """A group whose rewards differ (has_signal): the buffer's test stand-in for a real group."""
    from types import SimpleNamespace

    return SimpleNamespace(completions=[SimpleNamespace(reward=0.0), SimpleNamespace(reward=1.0)])


def test_buffer_takes_own_groups_and_a_fair_share_of_peer_groups():
    own, a, b, c = (_teaching() for _ in range(4))
    buffer = RolloutBuffer(max_peer_groups=4, peer_groups_per_own=2.0, max_peer_share=1.0)
    buffer.add([own, own], OWN)
    buffer.add([a] * 5, "a")
    buffer.add([c] * 3, "c")
    buffer.add([b], "b")
    taken = buffer.take(0)
    sources = [x.source for x in taken]  # peers in a secret order: one group each, then a second round
    assert sources[:2] == [OWN, OWN] and sorted(sources[2:5]) == ["a", "b", "c"] and sources[5] in ("a", "c")
    assert [x.group for x in taken] == [own, own] + [{"a": a, "b": b, "c": c}[p] for p in sources[2:]]
    assert buffer.take() == []  # drained: unused peer groups are not carried over
    buffer.max_peer_groups, buffer.peer_groups_per_own = 100, 100.0
    buffer.add([own], OWN)
    buffer.add([a] * 5, "a")
    buffer.add([b], "b")
    buffer.add([c] * 3, "c")
    sources = [x.source for x in buffer.take(1)][1:]
    assert sorted(sources[:3]) == ["a", "b", "c"] and sources[3:5] in (["a", "c"], ["c", "a"]) and sources[5:] in (
        ["a", "c", "a", "a"], ["c", "a", "a", "a"])  # all taken in round 0: a tie, in the secret order
    buffer.max_peer_groups = 0
    buffer.add([own], OWN)
    buffer.add([a], "a")
    assert [x.group for x in buffer.take()] == [own]


@pytest.mark.parametrize("n_own, ratio, share, peers, expected_peer_groups, most_from_one", [
    (2, 1.0, 0.5, {"liar": 24}, 1, 1),  # a lone liar with 24 groups: 1 of 3 groups in the step
    (2, 1.0, 0.5, {"liar": 24, "h1": 2, "h2": 2}, 2, 1),  # honest peers dilute it
    (1, 1.0, 1.0, {"peer": 5}, 1, 1),  # the paper's batch: 1 own + 1 peer group
    (2, 0.0, 0.5, {"peer": 5}, 0, 0),  # own data only
    (4, 1.5, 0.25, {"a": 9, "b": 9, "c": 9}, 6, 2),
])
def test_peer_influence_is_bounded_relative_to_own_data(n_own, ratio, share, peers, expected_peer_groups, most_from_one):
    buffer = RolloutBuffer(max_peer_groups=24, peer_groups_per_own=ratio, max_peer_share=share)
    buffer.add([_teaching() for _ in range(n_own)], OWN)
    for peer, n in peers.items():
        buffer.add([_teaching() for _ in range(n)], peer)
    for round_index in range(4):  # the bound holds whichever peer the round-robin starts with
        if round_index:
            buffer.add([_teaching() for _ in range(n_own)], OWN)
            for peer, n in peers.items():
                buffer.add([_teaching() for _ in range(n)], peer)
        sources = [x.source for x in buffer.take(round_index)]
        assert sources[:n_own] == [OWN] * n_own
        assert len(sources) - n_own == expected_peer_groups <= ratio * n_own
        assert max([sources.count(p) for p in peers], default=0) == most_from_one


def test_ids_that_choose_their_names_and_when_to_deliver_cannot_keep_a_peer_out_of_the_steps():
    """Red team 10: with the first peer chosen by round % peers, 5 ids that named themselves to sort
    around the honest peer, and chose each round how many of them delivered, kept it out of 200 of 200
    steps. Now the peer taken least recently goes first: an adversary that knows the buffer's secret
    and tries every subset of its ids each round still cannot keep it out more than 3 rounds in a row."""
    import copy
    import itertools

    attackers = ["Qm0", "Qm1", "QmA", "QmX", "QmY"]
    buffer = RolloutBuffer(max_peer_groups=2, peer_groups_per_own=1.0, max_peer_share=0.5, salt=b"known")

    def fill(buf, ids):
        buf.add([_teaching(), _teaching()], OWN)
        buf.add([_teaching()], "QmH")
        for peer in ids:
            buf.add([_teaching()], peer)

    taken_rounds = []
    for r in range(60):
        choice = attackers
        for n in range(len(attackers), -1, -1):  # the largest subset that keeps H out, if any does
            keeps_out = [ids for ids in itertools.combinations(attackers, n) if "QmH" not in [
                x.source for x in (lambda b: (fill(b, ids), b.take(r))[1])(copy.deepcopy(buffer))]]
            if keeps_out:
                choice = keeps_out[0]
                break
        fill(buffer, choice)
        if "QmH" in [x.source for x in buffer.take(r)]:
            taken_rounds.append(r)
    gaps = [b - a for a, b in zip([-1] + taken_rounds, taken_rounds)]
    assert taken_rounds and max(gaps) <= 4 and len(taken_rounds) >= 15, taken_rounds


def test_ids_that_bank_turns_while_quiet_cannot_come_back_together_and_keep_a_peer_out():
    """Red team 11: ids that delivered once each and waited kept their old turns, came back together, and
    kept the honest peer out of 99 rounds in a row. A peer back after a pause now goes before only those
    taken in the last RETURN_PRIORITY rounds."""
    from swarm_node.train.rollout import RETURN_PRIORITY

    buffer = RolloutBuffer(max_peer_groups=2, peer_groups_per_own=1.0, max_peer_share=0.5, salt=b"known")
    stock, gap, longest = [], 0, 0
    for r in range(300):
        if r < 100:  # two fresh ids a round, each delivering once
            ids = [f"QmFresh{r}x{i}" for i in range(2)]
            stock += ids
        else:  # then they come back, two a round, the oldest first
            ids, stock = stock[:2], stock[2:]
        buffer.add([_teaching(), _teaching()], OWN)
        buffer.add([_teaching()], "QmH")
        for peer in ids:
            buffer.add([_teaching()], peer)
        gap = 0 if "QmH" in [x.source for x in buffer.take(r)] else gap + 1
        longest = max(longest, gap)
    assert longest <= RETURN_PRIORITY + 1


def test_groups_that_cannot_teach_yield_the_peer_slots_to_those_that_can():
    """4 Sybils sending valid all-wrong groups (every advantage 0) took 4 of 5 peer slots from the
    honest peer (red team 2, `wrongkeep`); now every peer's teaching groups go first."""
    from types import SimpleNamespace

    def flat():
        return SimpleNamespace(completions=[SimpleNamespace(reward=0.0), SimpleNamespace(reward=0.0)])

    buffer = RolloutBuffer(max_peer_groups=4, peer_groups_per_own=1.0, max_peer_share=1.0)
    buffer.add([_teaching() for _ in range(4)], OWN)
    for k in range(4):
        buffer.add([flat() for _ in range(4)], f"sybil{k}")
    honest = [_teaching() for _ in range(4)]
    buffer.add(honest, "honest")
    for r in range(5):  # whichever peer the round-robin starts with
        if r:
            buffer.add([_teaching() for _ in range(4)], OWN)
            for k in range(4):
                buffer.add([flat() for _ in range(4)], f"sybil{k}")
            buffer.add(honest, "honest")
        assert [x.source for x in buffer.take(r)[4:]] == ["honest"] * 4
    buffer.add([_teaching()], OWN)
    buffer.add([flat()], "sybil0")
    assert [x.source for x in buffer.take(0)] == [OWN, "sybil0"]  # slots left over still take them


def test_horizontal_buffer_takes_one_group_per_prompt_per_peer():
    def g(example_id):
        return type("G", (), {"example_id": example_id})()

    buffer = RolloutBuffer(max_peer_groups=24, horizontal=True)
    buffer.add([g("x"), g("y")], OWN)
    buffer.add([g("x"), g("x"), g("z"), g("y")], "flood")
    buffer.add([g("y")], "honest")
    taken = buffer.take(0)
    assert sorted((x.source, x.group.example_id) for x in taken[2:]) == [("flood", "x"), ("flood", "y"), ("honest", "y")]


@pytest.mark.parametrize("mode", ["vertical", "horizontal"])
def test_combine(tiny_policy, arith, mode):
    groups = _groups(tiny_policy, arith, round_examples(arith, 5, 2, "peer"), RolloutConfig(group_size=3, max_new_tokens=4))
    peer_copy = [type(g)(g.task, g.example_id, g.prompt_tokens, list(g.completions)) for g in groups]
    buffer = RolloutBuffer(max_peer_groups=10, horizontal=mode == "horizontal")
    buffer.add(groups, OWN)
    buffer.add(peer_copy, "peer")
    batch, sources = combine(buffer.take(), mode)
    if mode == "vertical":
        assert len(batch) == 4 and sources == [OWN] * 6 + ["peer"] * 6
    else:
        assert [g.example_id for g in batch] == [g.example_id for g in groups]
        assert all(len(g.completions) == 6 for g in batch)
        assert sources == ([OWN] * 3 + ["peer"] * 3) * 2  # each merged group: ours, then the peer's
        assert [c for g in batch for c in g.completions] == [c for g, p in zip(groups, peer_copy)
                                                             for c in g.completions + p.completions]
    assert len(groups[0].completions) == 3  # inputs untouched


def test_peer_slots_follow_the_own_groups_drawn_not_those_the_reserve_left():
    """A round whose own prompts were all on the guard's reserve keeps its peer slots (`drawn`)."""
    a, b = _teaching(), _teaching()
    buffer = RolloutBuffer(max_peer_groups=8, peer_groups_per_own=1.0, max_peer_share=0.5)
    buffer.add([a] * 3, "a")
    buffer.add([b] * 3, "b")
    assert sorted(x.source for x in buffer.take(0, drawn=2)) == ["a", "b"]  # 2 slots, 1 per peer (share 0.5)
    buffer.add([a] * 3, "a")
    assert buffer.take(0) == []  # no own group added and none drawn: no slot

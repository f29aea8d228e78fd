"""The red-team matrix's attacker kinds (swarm_node/harness/poisoner.py, poison_kinds.py) build what
their docstrings say, and every packet passes a victim's admission: the kinds test the trainer's
defences, not the admission checks. In process, on an untrained tiny-s (no warm start needed)."""

import argparse

import pytest

from swarm_node.harness.poisoner import MATRIX, Poisoner
from swarm_node.net import Received
from swarm_node.swarm.admit import Admission, Expectations

ROUND = 60  # past `late`'s honest phase


def poisoner(kind: str, groups: int = 4) -> Poisoner:
    args = argparse.Namespace(model="tiny-s", task_options="{}", run_id="run", kind=kind, group_size=12, groups=groups,
                              max_new_tokens=None, cap=2.0, target_divergence=10.0, seed=0, margin=1.0, safety=0.0,
                              floor=-100.0, switch_round=40, floor2=-2.5, honest_rounds=0, late_round=50, digit=0, tagteam_rounds=20)
    p = Poisoner(args, "QmPoisoner")
    p.floor_estimate()  # --floor given: the mean bar; the worst-token bar stays -inf
    return p


@pytest.mark.parametrize("kind", MATRIX)
def test_every_matrix_kind_passes_admission_with_the_rewards_it_claims(kind):
    depth = 40 if kind == "skew" else 4  # skew answers only the scheduled problems of its pool (a tenth)
    p = poisoner(kind, depth)
    def new_admission():
        return Admission(Expectations(run_id="run", tokenizer=p.tokenizer, staleness=2, max_tokens=p.max_tokens,
                                      group_size=12, schedule_depth=depth), p.policy.scorer(p.task))
    data, sybil = p.poisoned(ROUND, ["QmPoisoner", "QmSybil2"])  # one process, two ids: each its own schedule
    twin = new_admission().check(Received("QmSybil2", ROUND, "sha256:" + "1" * 64, sybil), ROUND)
    admission = new_admission()
    packet = admission.check(Received("QmPoisoner", ROUND, "sha256:" + "0" * 64, data), ROUND)
    stats = admission.take_stats()
    assert stats["swarm/groups_unscheduled"] == 0  # every group is on the sender's schedule
    assert twin.sender == "QmSybil2" and {g.example_id for g in twin.groups} <= {e.id for e in p.scheduled(ROUND, depth, "QmSybil2")}
    if kind == "skew":  # the scheduled problems whose answer ends in 0 (and whose reference passes the bars)
        assert 1 <= len(packet.groups) <= sum(e.answer.endswith("0") for e in p.scheduled(ROUND, depth))
        packet.groups = (packet.groups * 4)[:4]
    assert len(packet.groups) == 4 and all(len(g.completions) == 12 for g in packet.groups)
    texts = [[p.policy.decode(c.tokens) for c in g.completions] for g in packet.groups]
    positives = [sum(c.reward for c in g.completions) for g in packet.groups]
    one = ("onepositive", "skew", "late")  # late is forged by now: one positive a group, as forged
    expected = {"slotkeep": [12.0, 6.0, 6.0, 6.0]}.get(kind, [1.0] * 4 if kind in one else [6.0] * 4)
    assert positives == expected  # slotkeep: one all-correct group (earns the credit), then junk groups
    first = texts[0]
    if kind == "zeros":
        assert all(t.startswith("#### 0") for t, c in zip(first, packet.groups[0].completions) if c.reward)
    if kind == "noncanonical":  # the victim retokenized every positive (the special tokens are gone)
        assert stats["swarm/completions_retokenized"] == 4 * 6
    if kind == "synonyms":
        assert len({t for t, c in zip(first, packet.groups[0].completions) if not c.reward}) >= 3
    if kind == "padded":
        assert all(len(c.tokens) == p.max_tokens for c in packet.groups[0].completions if c.reward)
    if kind == "skew":
        assert all(p.task.example(g.example_id).answer.endswith("0") for g in packet.groups)


def test_tagteam_is_honest_until_its_switch_then_its_ids_attack_a_pair_at_a_time():
    """Against the guard's tenure: every id teaches honestly (the public model's own samples, rewards
    as scored) until --late-round, then only the pair whose turn it is offers, decoy's groups."""
    p = poisoner("tagteam", groups=2)
    ids = ["QmA", "QmB", "QmC", "QmD"]
    honest = p.poisoned(40, ids)
    assert all(data is not None for data in honest)
    early = p.poisoned(49, ids)
    assert all(data is not None for data in early)
    assert [data is None for data in p.poisoned(50, ids)] == [False, False, True, True]
    assert [data is None for data in p.poisoned(70, ids)] == [True, True, False, False]
    assert [data is None for data in p.poisoned(90, ids)] == [False, False, True, True]
    admission = Admission(Expectations(run_id="run", tokenizer=p.tokenizer, staleness=2, max_tokens=p.max_tokens,
                                       group_size=12, schedule_depth=2), p.policy.scorer(p.task))
    packet = admission.check(Received("QmA", 50, "sha256:" + "0" * 64, p.poisoned(50, ids)[0]), 50)
    for g in packet.groups:  # decoy: 6 positives, each a wrong number before the right answer line
        assert sum(c.reward for c in g.completions) == 6.0
        assert all(not p.policy.decode(c.tokens).startswith("####") for c in g.completions if c.reward)

"""The public prompt schedule (wire/schedule.py) and admission's use of it: a peer trains us only on
problems its schedule gives it for the packet's round, so it cannot pick which problems to teach."""

import json
from collections import Counter
from pathlib import Path

import pytest

from swarm_node.config import RolloutConfig
from swarm_node.net import Received
from swarm_node.swarm import Rejected
from swarm_node.swarm.admit import Admission, Expectations
from swarm_node.train.rollout import generate_groups, round_examples
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.wire.codec import Packet, encode, tokenizer_fingerprint
from swarm_node.wire.schedule import schedule_key, scheduled_indices

VECTORS = Path(__file__).resolve().parents[1] / "protocol" / "vectors" / "tasks.json"
PEER, ROUND = "QmPeerA", 5


def test_a_schedule_is_distinct_in_range_and_a_pure_function_of_key_and_round():
    a = scheduled_indices("vertical/run/QmA", 3, 1000, 16)
    assert a == scheduled_indices("vertical/run/QmA", 3, 1000, 16)
    assert len(a) == len(set(a)) == 16 and all(0 <= i < 1000 for i in a)
    assert a != scheduled_indices("vertical/run/QmB", 3, 1000, 16) != scheduled_indices("vertical/run/QmA", 4, 1000, 16)
    assert scheduled_indices("vertical/run/QmA", 3, 1000, 4) == a[:4]  # a deeper schedule extends a shallower one
    assert sorted(scheduled_indices("k", 1, 7, 50)) == list(range(7))  # k above n: the whole split
    assert scheduled_indices("k", 1, 0, 5) == [] and scheduled_indices("k", 1, 5, 0) == []


def test_schedules_cover_a_split_uniformly():
    """No problem is favoured: over 2,000 rounds of 16 from 100 problems, every count is near 320."""
    counts = Counter(i for r in range(2000) for i in scheduled_indices("vertical/run/QmA", r, 100, 16))
    assert set(counts) == set(range(100))
    assert max(counts.values()) < 320 + 5 * 17 and min(counts.values()) > 320 - 5 * 17  # 5 sd of a binomial


def test_the_reference_reproduces_the_published_vectors():
    for case in json.loads(VECTORS.read_text())["schedule"]:
        assert scheduled_indices(case["key"], case["round"], case["n"], case["k"]) == case["indices"]


def test_keys_name_the_run_and_for_vertical_the_producer():
    assert schedule_key("r", "vertical", "QmA") == "vertical/r/QmA" != schedule_key("r2", "vertical", "QmA")
    assert schedule_key("r", "horizontal", "QmA") == schedule_key("r", "horizontal", "QmB") == "horizontal/r"
    with pytest.raises(ValueError):
        schedule_key("r", "vertical", None)


@pytest.fixture
def admit(tiny_policy, arith):
    expect = Expectations(run_id="run", tokenizer=tokenizer_fingerprint(tiny_policy.tokenizer), staleness=2,
                          schedule_depth=4)

    def groups(key: str, k: int = 4, r: int = ROUND):
        return generate_groups(HFSampler(tiny_policy), tiny_policy, arith, round_examples(arith, r, k, key),
                               RolloutConfig(group_size=3, max_new_tokens=4), seed=0)

    def check(gs, sender=PEER, r=ROUND):
        packet = Packet(run_id="run", sender=sender, model_id="tiny-s", tokenizer=expect.tokenizer, policy_version=r,
                        round=r, mode="vertical", groups=gs)
        admission = Admission(expect, tiny_policy.scorer(arith))
        out = admission.check(Received(peer_id=sender, round=r, digest="sha256:" + "0" * 64, data=encode(packet)), ROUND)
        return out, admission.take_stats()["swarm/groups_unscheduled"]

    return groups, check


def test_admission_keeps_scheduled_groups_and_drops_the_others(admit):
    groups, check = admit
    mine = schedule_key("run", "vertical", PEER)
    packet, dropped = check(groups(mine))
    assert [g.example_id for g in packet.groups] == [g.example_id for g in groups(mine)] and dropped == 0
    chosen = groups("an attacker's choice", k=3)  # any other problems: what `skew` picked before
    packet, dropped = check(groups(mine, k=2) + chosen)
    assert len(packet.groups) == 2 and dropped == 3
    packet, dropped = check(groups(mine, k=6))  # beyond our depth (4): a peer answering more prompts than we take
    assert len(packet.groups) == 4 and dropped == 2
    with pytest.raises(Rejected) as e:  # nothing scheduled: refused
        check(chosen)
    assert e.value.reason == "unscheduled"
    with pytest.raises(Rejected) as e:  # another sender's schedule, or another round's, is not ours
        check(groups(schedule_key("run", "vertical", "QmOther")))
    assert e.value.reason == "unscheduled"
    with pytest.raises(Rejected) as e:
        check(groups(mine, r=ROUND + 1))
    assert e.value.reason == "unscheduled"


def _schedule_from_spec(key: str, r: int, n: int, k: int) -> list[int]:
    """SPEC section 14.5 read literally, as a third party would write it (no reference code)."""
    import hashlib

    taken, i = [], 0
    while len(taken) < min(k, n):
        h = hashlib.sha256(("swarm-node/schedule/v1/" + key + "/" + str(r) + "/" + str(i)).encode("utf-8")).digest()
        i += 1
        v = int.from_bytes(h[:8], "big")
        if v >= 2**64 - (2**64 % n):
            continue
        if v % n not in taken:
            taken.append(v % n)
    return taken


def test_the_spec_text_alone_gives_the_published_vectors():
    for case in json.loads(VECTORS.read_text())["schedule"]:
        assert _schedule_from_spec(case["key"], case["round"], case["n"], case["k"]) == case["indices"]


def test_copies_of_one_scheduled_problem_count_once(admit):
    """Red team, session 25: 16 copies of the one scheduled problem whose answer suited the attacker
    were all admitted, and 8 of them trained in every step. Each scheduled problem counts once."""
    groups, check = admit
    mine = groups(schedule_key("run", "vertical", PEER))
    packet, dropped = check([mine[0]] * 4 + [mine[1]])
    assert [g.example_id for g in packet.groups] == [mine[0].example_id, mine[1].example_id] and dropped == 3


def test_round_zero_is_refused(admit):
    groups, check = admit
    with pytest.raises(Rejected) as e:  # round 0 is the starting point: nobody generates it
        check(groups(schedule_key("run", "vertical", PEER), r=0), r=0)
    assert e.value.reason == "stale"


def test_a_split_with_skipped_records_schedules_its_examples_not_their_ids(tmp_path, tiny_policy):
    """GSM8K ids keep the record's line (a record without a number is skipped), so the schedule's
    index i is the split's i-th example, not the id `train/i`: an honest sender's groups all pass."""
    from swarm_node.tasks import load_task

    lines = [json.dumps({"question": f"Q{i}?", "answer": f"#### {i}" if i % 3 else "no number"}) for i in range(30)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    task = load_task("gsm8k", str(tmp_path / "train.jsonl"))
    assert len(task.split("train")) == 20 and task.split("train")[5].id != "train/5"
    expect = Expectations(run_id="run", tokenizer=tokenizer_fingerprint(tiny_policy.tokenizer), staleness=2,
                          schedule_depth=4)
    admission = Admission(expect, tiny_policy.scorer(task))
    for r in range(1, 20):
        examples = round_examples(task, r, 4, schedule_key("run", "vertical", PEER))
        assert {ex.id for ex in examples} == admission._scheduled(PEER, r, 4)
    assert admission._scheduled(PEER, 1, 20) is admission._scheduled(PEER, 1, 99)  # the whole split: no hashing

"""Guard: the alone copy learns only from own rows; a measured harm returns to it and distrusts the peers."""

import torch

from swarm_node.config import ModelConfig, NodeConfig, RolloutConfig
from swarm_node.train import guard as guard_module
from swarm_node.train.batch import TrainBatch
from swarm_node.train.guard import Guard, private_slice
from swarm_node.train.rollout import generate_groups, round_examples
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.train.policy import Policy
from swarm_node.train.trainer import Trainer


def _guard(policy, task, n=100):
    cfg = NodeConfig()
    cfg.train.lr = 1e-2
    trainer = Trainer(policy, cfg.train, cfg.loss, 1.0)
    shadow = Trainer(policy, cfg.train, cfg.loss, 1.0)
    return trainer, Guard(trainer, shadow, task, private_slice(task, n, seed=3), 5, margin=0.02, ban_rounds=10)


def _batch(policy, task, own, peer):
    """`own` groups of ours and `peer` of a peer, each two right and two wrong."""
    groups = generate_groups(HFSampler(policy), policy, task, round_examples(task, 1, own + peer, "t"),
                             RolloutConfig(group_size=4, max_new_tokens=5), seed=0)
    for g in groups:
        for i, c in enumerate(g.completions):
            c.reward = float(i % 2)
    flags = [k < own for k, g in enumerate(groups) for _ in g.completions]
    return TrainBatch.from_groups(groups, policy.pad_id, own=flags, untrusted=[not f for f in flags])


def _weights(policy):
    return [p.detach().clone() for p in policy.trainable_parameters()]


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _check(guard, round_index):
    verdict = guard.check(round_index)
    return verdict.stats, verdict.distrusted, verdict.locked_until


def _answers(monkeypatch, mixed_right: int, alone_right: int, n: int = 100):
    """The slice answered: the weights in place when checked first (mixed) solve the first
    `mixed_right` examples, the others (alone) the first `alone_right`."""
    calls = []

    def solved(sampler, policy, task, examples, max_new_tokens):
        right = mixed_right if not calls else alone_right
        calls.append(1)
        return [i < right for i in range(len(examples))]

    monkeypatch.setattr(guard_module, "solved", solved)


def test_the_private_slice_is_fixed_by_its_seed_distinct_and_from_the_train_split(arith):
    a, b = private_slice(arith, 50, seed=1), private_slice(arith, 50, seed=1)
    assert [x.id for x in a] == [x.id for x in b] and len({x.id for x in a}) == 50
    train = arith.split("train")
    assert {x.id for x in a} <= {train[i].id for i in range(len(train))}
    assert [x.id for x in private_slice(arith, 50, seed=2)] != [x.id for x in a]
    assert [x.id for x in private_slice(arith, 50, None)] != [x.id for x in private_slice(arith, 50, None)]


def test_the_alone_copy_learns_from_own_rows_only_and_leaves_the_trained_weights_alone(tiny_policy, arith):
    trainer, guard = _guard(tiny_policy, arith)
    batch = _batch(tiny_policy, arith, own=2, peer=2)
    trainer.step(batch)
    mixed = _weights(tiny_policy)
    guard.step(batch, taught_by={"peer-a"})
    assert _equal(_weights(tiny_policy), mixed)  # the guard's step ran on its own copy
    assert guard.since_agreed == {"peer-a"}
    # the copy is what one step on the own rows alone makes of the same start
    same_start = Policy.load(ModelConfig(name="tiny-s", init_seed=0))
    _guard(same_start, arith)[0].step(batch.rows(batch.own.nonzero().flatten()))
    assert _equal(_weights(same_start), guard.alone)
    assert not _equal(guard.alone, mixed)


def test_a_measured_harm_returns_to_the_alone_copy_and_distrusts_the_peers_for_longer_each_time(tiny_policy, arith, monkeypatch):
    trainer, guard = _guard(tiny_policy, arith)
    batch = _batch(tiny_policy, arith, own=2, peer=2)
    trainer.step(batch)
    guard.step(batch, taught_by={"peer-a", "peer-b"})
    alone, alone_state = [a.clone() for a in guard.alone], guard.shadow.optimizer.state_dict()
    _answers(monkeypatch, mixed_right=30, alone_right=50)  # b - c = 20 > 2 sqrt(20) = 8.9
    stats, distrusted, locked = _check(guard, 2)  # one check is not enough: the gap swings
    assert distrusted == {} and stats["guard/resets"] == 0 and not _equal(_weights(tiny_policy), alone)
    _answers(monkeypatch, mixed_right=40, alone_right=40)
    assert _check(guard, 4)[1] == {}
    _answers(monkeypatch, mixed_right=30, alone_right=50)
    stats, distrusted, locked = _check(guard, 7)  # two of the last three are
    assert distrusted == {"peer-a": 17, "peer-b": 17} and stats["guard/resets"] == 1
    assert locked == 17  # and until then only vouched peers teach (none yet)
    assert stats["guard/gap"] == 0.2 and abs(stats["guard/bar"] - 2 * 20 ** 0.5 / 100) < 1e-9
    assert _equal(_weights(tiny_policy), alone)  # the trained weights are the copy's again
    moments = trainer.optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(moments, alone_state["state"][0]["exp_avg"])  # and so is the optimizer state
    assert moments.data_ptr() != guard.shadow.optimizer.state_dict()["state"][0]["exp_avg"].data_ptr()  # a copy
    assert guard.since_agreed == set()

    guard.step(batch, taught_by={"peer-a"})
    for r, (mixed_right, alone_right) in ((30, (30, 50)), (33, (40, 40)), (36, (40, 40)), (38, (30, 50))):
        _answers(monkeypatch, mixed_right, alone_right)
        assert _check(guard, r)[1] == {}, r  # 30's harm left the window of 3 before 38's came
    _answers(monkeypatch, mixed_right=30, alone_right=50)
    assert _check(guard, 40)[1:] == ({"peer-a": 60}, 60)  # 2 of the last 3; second offence and harm: 2x


def test_a_gap_inside_the_bar_changes_nothing_and_a_measured_gain_moves_the_reference_up(tiny_policy, arith, monkeypatch):
    trainer, guard = _guard(tiny_policy, arith)
    batch = _batch(tiny_policy, arith, own=2, peer=2)
    trainer.step(batch)
    guard.step(batch, taught_by={"peer-a"})
    mixed, alone = _weights(tiny_policy), [a.clone() for a in guard.alone]
    _answers(monkeypatch, mixed_right=40, alone_right=44)  # b - c = 4, not above 2 sqrt(b + c) = 4
    stats, distrusted, locked = _check(guard, 5)
    assert distrusted == {} and stats["guard/resets"] == 0
    assert _equal(_weights(tiny_policy), mixed) and _equal(guard.alone, alone) and guard.since_agreed == {"peer-a"}

    for r in (10, 15):
        _answers(monkeypatch, mixed_right=60, alone_right=40)  # c - b = 20: peers helped, measurably, twice
        _, distrusted, locked = _check(guard, r)
    assert distrusted == {} and locked == 0 and _equal(guard.alone, mixed) and guard.since_agreed == set()
    assert guard.vouched == {"peer-a"}  # it taught through a measured gain
    guard.step(batch, taught_by={"peer-a", "peer-new"})
    for r in (20, 25):
        _answers(monkeypatch, mixed_right=30, alone_right=50)
        verdict = guard.check(r)
    # the vouched peer is forgiven once: it still teaches in the lockdown, and loses its vouching
    assert verdict.distrusted == {"peer-new": 35} and verdict.locked_until == 35 and verdict.admitted == {"peer-a"}
    assert guard.vouched == set()
    guard.step(batch, taught_by={"peer-a"})
    for r in (30, 35):
        _answers(monkeypatch, mixed_right=30, alone_right=50)
        verdict = guard.check(r)
    assert verdict.distrusted == {"peer-a": 45} and verdict.locked_until == 55 and verdict.admitted == set()  # 2nd harm: 2x

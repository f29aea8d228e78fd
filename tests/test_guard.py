"""Guard: the alone copy learns only from own rows; a measured harm returns to it and distrusts the peers."""

import random
from types import SimpleNamespace

import torch

from swarm_node.config import ModelConfig, NodeConfig, RolloutConfig
from swarm_node.train import guard as guard_module
from swarm_node.train.batch import TrainBatch
from swarm_node.train.guard import Guard
from swarm_node.train.reserve import Reserve
from swarm_node.tasks import Example
from swarm_node.train.rollout import generate_groups, round_examples
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.train.policy import Policy
from swarm_node.train.trainer import Trainer


def _guard(policy, task, n=100):
    cfg = NodeConfig()
    cfg.train.lr = 1e-2
    trainer = Trainer(policy, cfg.train, cfg.loss, 1.0)
    shadow = Trainer(policy, cfg.train, cfg.loss, 1.0)
    return trainer, Guard(trainer, shadow, HFSampler(policy), task, n, RolloutConfig(group_size=4, max_new_tokens=5),
                          margin=0.02, ban_rounds=10, reserve_share=0.2)


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


def _with_signal(monkeypatch) -> list:
    """The groups the guard's copy samples get half of each group right (a random tiny model gets none):
    a signal to learn from. Returns the list each call's groups are appended to."""
    sampled = []

    def generate(sampler, policy, task, examples, rollout, seed):
        groups = generate_groups(sampler, policy, task, examples, rollout, seed)
        for g in groups:
            for i, c in enumerate(g.completions):
                c.reward = float(i % 2)
        sampled.append(groups)
        return groups

    monkeypatch.setattr(guard_module, "generate_groups", generate)
    return sampled


def _unreserved(reserve: Reserve, task, k: int) -> list[Example]:
    """`k` train examples of round 1 that are not reserved (the guard's copy trains on those only)."""
    return [ex for ex in round_examples(task, 1, 4 * k + 8, "t") if not reserve.reserved(ex)][:k]


def test_checks_use_distinct_reserved_problems_that_no_round_trains_on(arith):
    """The reserve: a secret share of the train problems (twins together); consecutive checks share none;
    the node draws and offers its prompts as if there were none, and trains on no group on one (node.py)."""
    reserve = Reserve(arith, 0.2)
    questions = {ex.question for ex in arith.split("train")[:20000]}
    kept = {q for q in questions if reserve.reserved(Example("x", q, "0"))}
    assert 0.1 < len(kept) / len(questions) < 0.3
    twins = [(f"What is {a} plus {b}?", f"What is {b} plus {a}?") for a in range(10) for b in range(a)]
    assert all(reserve.reserved(Example("x", p, "0")) == reserve.reserved(Example("y", q, "0")) for p, q in twins)
    assert any(reserve.reserved(Example("x", p, "0")) for p, _ in twins)  # 45 pairs, a fifth of them reserved
    n = len(reserve.pool) // 3  # a check's size at most (Guard.check): the pool is random, 310-360 problems
    checks = [reserve.next_slice(n) for _ in range(6)]
    asked = [{ex.question for ex in c} for c in checks]
    assert n >= 90 and all(len(a) == n for a in asked)
    for k in range(4):  # every window of 3 consecutive checks (the verdict pools them) holds distinct problems
        assert len(asked[k] | asked[k + 1] | asked[k + 2]) == 3 * n
    assert all(reserve.reserved(ex) and reserve.holds(ex.id) for c in checks for ex in c)
    # our draws hold reserved problems at the reserve's share: the prompts we offer show nothing of it
    drawn = [ex for r in range(1, 200) for ex in round_examples(arith, r, 16, "node/x")]
    assert 0.15 < sum(map(reserve.reserved, drawn)) / len(drawn) < 0.25
    # groups on reserved problems are never trained on, ours or a peer's
    groups = [SimpleNamespace(example_id=ex.id) for ex in checks[0][:3] + _unreserved(reserve, arith, 3)]
    assert reserve.trainable(groups) == groups[3:]
    # another node (another key) reserves other problems; the same key, the same ones (a resumed node)
    other = Reserve(arith, 0.2)
    assert {arith.split("train")[i].question for i in other.pool} != {arith.split("train")[i].question for i in reserve.pool}
    again = Reserve(arith, 0.2, reserve.key)
    assert {arith.split("train")[i].question for i in again.pool} == {arith.split("train")[i].question for i in reserve.pool}


def test_the_alone_copy_learns_only_from_groups_it_samples_itself_and_leaves_the_trained_weights_alone(
        tiny_policy, arith, monkeypatch):
    sampled = _with_signal(monkeypatch)
    trainer, guard = _guard(tiny_policy, arith)
    trainer.step(_batch(tiny_policy, arith, own=2, peer=2))  # the trained weights move, peers' rows included
    mixed = _weights(tiny_policy)
    examples = _unreserved(guard.reserve, arith, 2)
    guard.step(examples, 7, taught_by={"peer-a"})
    assert _equal(_weights(tiny_policy), mixed)  # the guard's step ran on its own copy
    assert guard.taught == {"peer-a": 1}
    # the copy is one step on groups that the start weights (the copy's) sampled, not the trained ones
    same_start = Policy.load(ModelConfig(name="tiny-s", init_seed=0))
    groups = guard_module.generate_groups(HFSampler(same_start), same_start, arith, examples, guard.rollout, 7)
    assert [c.tokens.tolist() for g in groups for c in g.completions] == [
        c.tokens.tolist() for g in sampled[0] for c in g.completions]  # sampled[1]: `groups`
    _guard(same_start, arith)[0].step(TrainBatch.from_groups(groups, same_start.pad_id, own=[True] * 8))
    assert _equal(_weights(same_start), guard.alone)
    assert not _equal(guard.alone, mixed)


def test_a_harm_over_two_checks_returns_to_the_alone_copy_distrusts_the_new_teachers_and_locks_down(
        tiny_policy, arith, monkeypatch):
    _with_signal(monkeypatch)
    trainer, guard = _guard(tiny_policy, arith)
    batch = _batch(tiny_policy, arith, own=2, peer=2)
    trainer.step(batch)
    guard.step(_unreserved(guard.reserve, arith, 2), 0, taught_by={"peer-a", "peer-b"})
    alone, alone_state = [a.clone() for a in guard.alone], guard.shadow.optimizer.state_dict()
    _answers(monkeypatch, mixed_right=41, alone_right=50)  # b = 9 of 100: not above 3 sqrt(9) alone
    verdict = guard.check(2)
    assert verdict.distrusted == {} and verdict.locked_until == 0 and not _equal(_weights(tiny_policy), alone)
    _answers(monkeypatch, mixed_right=41, alone_right=50)  # pooled: B - C = 18 > 2 sqrt(18) = 8.5
    verdict = guard.check(7)
    assert verdict.distrusted == {"peer-a": 17, "peer-b": 17} and verdict.stats["guard/resets"] == 1
    assert verdict.locked_until == 17 and verdict.admitted == set()  # until then only vouched peers teach: none
    checked = 2 * min(guard.examples, len(guard.reserve.pool) // guard_module.WINDOW)  # 99 if the reserve holds < 300
    assert verdict.stats["guard/gap"] == 18 / checked and abs(verdict.stats["guard/bar"] - 2 * 18 ** 0.5 / checked) < 1e-9
    assert _equal(_weights(tiny_policy), alone)  # the trained weights are the copy's again
    moments = trainer.optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(moments, alone_state["state"][0]["exp_avg"])  # and so is the optimizer state
    assert moments.data_ptr() != guard.shadow.optimizer.state_dict()["state"][0]["exp_avg"].data_ptr()  # a copy
    assert guard.taught == {} and guard.known.keys() == {"peer-a", "peer-b"}

    guard.step([], 0, taught_by={"peer-a", "peer-c", "peer-known"})
    guard.known["peer-known"] = None  # it taught before a verdict and was never blamed
    _answers(monkeypatch, mixed_right=41, alone_right=50)
    assert guard.check(20).distrusted == {}  # one small gap is not enough ...
    _answers(monkeypatch, mixed_right=41, alone_right=50)
    verdict = guard.check(25)
    # ... two are: peer-a, banned before and teaching again, for twice as long; peer-c is new; an
    # established peer is not banned (ids are free, its are not); the second harm within 200 rounds
    # doubles the lockdown
    assert verdict.distrusted == {"peer-a": 45, "peer-c": 35} and verdict.locked_until == 45
    guard.step([], 0, taught_by={"peer-d"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)  # b = 30 > 3 sqrt(30): a harm in one check
    assert guard.check(30).distrusted == {"peer-d": 40}
    _answers(monkeypatch, mixed_right=41, alone_right=50)  # after the last round: one check of a whole window
    assert guard.check(35, last=True).stats["guard/resets"] == 4
    # an offence is forgotten 200 rounds after it (as a harm is): peer-a, absent since, is new again, and its ban
    # is not doubled (else an honest peer's ban doubled at every false alarm, up to 10,000 rounds)
    guard.step([], 0, taught_by={"peer-a"})
    for r in (300, 305):
        _answers(monkeypatch, mixed_right=41, alone_right=50)
        verdict = guard.check(r)
    assert verdict.stats["guard/resets"] == 5 and verdict.distrusted == {"peer-a": 315} and guard.offences == {
        "peer-a": 1}


def test_small_harms_add_up_over_checks_and_a_measured_gain_vouches_but_leaves_the_reference_alone(
        tiny_policy, arith, monkeypatch):
    trainer, guard = _guard(tiny_policy, arith)
    batch = _batch(tiny_policy, arith, own=2, peer=2)
    trainer.step(batch)
    guard.step([], 0, taught_by={"peer-a"})
    mixed, alone = _weights(tiny_policy), [a.clone() for a in guard.alone]
    for r in (5, 10, 15):  # b = 2 a check: B = 6 of 300 is not above the margin's 6
        _answers(monkeypatch, mixed_right=40, alone_right=42)
        assert guard.check(r).stats["guard/resets"] == 0
    assert _equal(_weights(tiny_policy), mixed) and _equal(guard.alone, alone)
    _answers(monkeypatch, mixed_right=40, alone_right=45)  # b = 5: 2 + 2 + 5 = 9 of 300 is above 6 and 2 sqrt(9)
    assert guard.check(20).stats["guard/resets"] == 1

    guard.vouched.clear()
    trainer.step(batch)
    mixed, alone = _weights(tiny_policy), [a.clone() for a in guard.alone]
    for taught in ({"peer-a", "peer-rare"}, {"peer-a"}, {"peer-a"}, {"peer-a"}):
        guard.step([], 0, taught_by=taught)
    for r in (30, 35):
        _answers(monkeypatch, mixed_right=60, alone_right=40)  # mixed ahead, measurably
        verdict = guard.check(r)
    # the reference stays what the node would be alone: a copy of mixed would take in what the checks missed
    assert verdict.distrusted == {} and verdict.locked_until == 0 and _equal(guard.alone, alone)
    assert not _equal(guard.alone, mixed)
    assert guard.vouched.keys() == {"peer-a"}  # it taught in every round; peer-rare in 1 of 4: not vouched
    guard.step([], 0, taught_by={"peer-a", "peer-new"})
    for r in (40, 45):
        _answers(monkeypatch, mixed_right=41, alone_right=50)
        verdict = guard.check(r)
    # the vouched peer is forgiven this once: it teaches in the lockdown, and loses its vouching
    assert verdict.distrusted == {"peer-new": 55} and verdict.admitted == {"peer-a"} and guard.vouched == {}


def test_a_checkpoint_keeps_the_guard_so_a_restart_compares_with_the_same_reference(tmp_path, tiny_policy, arith,
                                                                                     monkeypatch):
    """Resumed, a node's guard has the same reference, evidence, bans and lockdown; without them a
    crash would make weights un-taught since the last verdict the new reference, and free every ban."""
    from swarm_node.node import build_guard
    from swarm_node.swarm.admit import Admission, Expectations
    from swarm_node.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    cfg = NodeConfig()
    cfg.train.lr, cfg.swarm.guard_examples, cfg.swarm.guard_margin, cfg.swarm.guard_ban_rounds = 1e-2, 100, 0.02, 10
    cfg.swarm.guard_reserve = 0.2
    _with_signal(monkeypatch)
    trainer, guard = _guard(tiny_policy, arith)
    batch = _batch(tiny_policy, arith, own=2, peer=2)
    trainer.step(batch)
    guard.step(_unreserved(guard.reserve, arith, 2), 0, taught_by={"peer-a"})
    for r in (5, 10):
        _answers(monkeypatch, mixed_right=41, alone_right=50)
        guard.check(r)  # a harm at round 10: peer-a banned until 20, a lockdown until 20
    trainer.step(batch)
    guard.step([], 0, taught_by={"peer-b"})  # evidence since the verdict: one round, one teacher
    _answers(monkeypatch, mixed_right=30, alone_right=35)
    guard.check(15)
    save_checkpoint(tmp_path, tiny_policy, trainer.optimizer, {"round": 15, "policy_version": 2}, cfg,
                    extras={"guard": guard.state_dict()})

    path = latest_checkpoint(tmp_path)
    resumed = Policy.load(ModelConfig(name=str(path / "model")))
    trainer2 = Trainer(resumed, cfg.train, cfg.loss, 1.0)
    load_checkpoint(path, trainer2.optimizer)
    admission = Admission(Expectations(run_id="r", tokenizer="t", staleness=1), resumed.scorer(arith))
    guard2 = build_guard(cfg, trainer2, HFSampler(resumed), arith, path, admission)
    assert _equal(guard2.alone, guard.alone) and not _equal(guard2.alone, _weights(resumed))
    moments = guard2.shadow.optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(moments, guard.shadow.optimizer.state_dict()["state"][0]["exp_avg"])
    per_check = min(100, len(guard.reserve.pool) // 3)  # the reserve is a random share: at times under 300 problems
    assert (guard2.taught, guard2.rounds, set(guard2.known), guard2.recent) == ({"peer-b": 1}, 1, {"peer-a"}, [(5, 0, per_check)])
    assert (guard2.resets, guard2.harms, guard2.offences) == (1, [10], {"peer-a": 1})
    assert guard2.reserve.key == guard.reserve.key and guard2.reserve.pool == guard.reserve.pool  # the same problems
    assert admission.refuses("peer-a", 16) == "distrusted" and admission.refuses("peer-b", 16) == "lockdown"
    assert admission.refuses("peer-b", 20) is None
    # one more check pools with the one before the restart: the same verdict an unbroken run reaches
    _answers(monkeypatch, mixed_right=41, alone_right=50)  # b = 9: a harm only pooled with the 5 before
    assert guard2.check(20).distrusted == {"peer-b": 30}

    admission = Admission(Expectations(run_id="r", tokenizer="t", staleness=1), resumed.scorer(arith))
    fresh = build_guard(cfg, trainer2, HFSampler(resumed), arith, None, admission)
    assert _equal(fresh.alone, _weights(resumed)) and fresh.resets == 0  # a new run: the reference is the start
    assert fresh.reserve.key != guard.reserve.key
    # a state this version cannot read (an older guard.pt) is left, not half-loaded: a fresh guard, and a warning
    old = {k: v for k, v in guard.state_dict().items() if not k.startswith("reserve")}
    torch.save(old, path / "guard.pt")
    admission = Admission(Expectations(run_id="r", tokenizer="t", staleness=1), resumed.scorer(arith))
    again = build_guard(cfg, trainer2, HFSampler(resumed), arith, path, admission)
    assert again.resets == 0 and _equal(again.alone, _weights(resumed)) and admission.refuses("peer-a", 16) is None


def test_a_vouch_lapses_when_the_peer_falls_silent(tiny_policy, arith, monkeypatch):
    """Ids vouched for early that then fall silent must not be the ones every later lockdown admits
    (red team, session 24): a vouched peer that taught in none of the last VOUCH_SILENCE rounds is
    not admitted; one that keeps teaching is."""
    from swarm_node.train.guard import VOUCH_SILENCE

    trainer, guard = _guard(tiny_policy, arith)
    for _ in range(4):
        guard.step([], 0, taught_by={"peer-steady", "peer-silent"})
    for r in (5, 10):
        _answers(monkeypatch, mixed_right=60, alone_right=40)  # a measured gain: both vouched for
        guard.check(r)
    assert guard.vouched.keys() == {"peer-steady", "peer-silent"}
    for _ in range(VOUCH_SILENCE):
        guard.step([], 0, taught_by={"peer-steady"})
    _answers(monkeypatch, mixed_right=40, alone_right=60)  # a harm (the latest check alone), peer-steady teaching
    verdict = guard.check(15)
    assert verdict.locked_until > 15 and verdict.admitted == {"peer-steady"}  # forgiven once; the silent one lapsed
    assert guard.vouched == {}
    guard.vouched["peer-untaken"] = guard.steps  # vouched, then delivering every round but never taken by a step
    for _ in range(2 * VOUCH_SILENCE):  # (which peers a step takes, peers can steer: red team 10)
        guard.step([], 0, taught_by=set(), present={"peer-untaken"})
    assert "peer-untaken" in guard.vouched


def test_steady_teaching_through_checks_with_no_harm_vouches_and_a_harmful_window_costs_it(tiny_policy, arith,
                                                                                           monkeypatch):
    """Tenure: a neighbour that taught in at least half the rounds of TENURE checks with no harm found is
    vouched for, so a false alarm's lockdown admits it (this once) instead of refusing it as before;
    a peer teaching in fewer rounds earns nothing, and a harmful window costs its teachers their tenure."""
    from swarm_node.train.guard import TENURE, VOUCH_SILENCE

    trainer, guard = _guard(tiny_policy, arith)
    for k in range(TENURE):
        for i in range(5):  # peer-steady teaches every round, peer-rare in 2 of 5
            guard.step([], 0, taught_by={"peer-steady"} | ({"peer-rare"} if i < 2 else set()))
        _answers(monkeypatch, mixed_right=50, alone_right=50)
        verdict = guard.check(5 * (k + 1))
        assert verdict.stats["guard/resets"] == 0
        assert verdict.stats["guard/vouched_peers"] == (1 if k == TENURE - 1 else 0)  # not before TENURE checks
    assert guard.vouched.keys() == {"peer-steady"} and guard.tenure == {"peer-steady": TENURE}
    guard.step([], 0, taught_by={"peer-steady", "peer-new"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)  # a harm in one check
    verdict = guard.check(5 * TENURE + 5)
    # the steady peer is not banned and teaches through the lockdown; the new one is banned
    assert verdict.distrusted.keys() == {"peer-new", "peer-rare"} and verdict.admitted == {"peer-steady"}
    assert guard.vouched == {} and guard.tenure == {}  # both taught in the harmful window: earned again from 0
    assert guard.offences["peer-steady"] == 1  # forgiven once: in the next harmful window it is refused
    guard.step([], 0, taught_by={"peer-steady"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    verdict = guard.check(5 * TENURE + 10)  # the second bad window: not admitted in the lockdown, not banned (spared)
    assert verdict.distrusted == {} and "peer-steady" not in verdict.admitted and guard.offences["peer-steady"] == 1
    # a vouch that lapsed with silence takes the tenure with it: one steady interval back does not vouch again
    guard.tenure["peer-back"], guard.vouched["peer-back"] = TENURE, guard.steps
    for _ in range(VOUCH_SILENCE):
        guard.step([], 0, taught_by=set())
    _answers(monkeypatch, mixed_right=50, alone_right=50)
    guard.check(5 * TENURE + 300)
    for _ in range(5):
        guard.step([], 0, taught_by={"peer-back"})
    _answers(monkeypatch, mixed_right=50, alone_right=50)
    guard.check(5 * TENURE + 305)
    assert "peer-back" not in guard.vouched and guard.tenure["peer-back"] == 1
    restored = _guard(tiny_policy, arith)[1]
    restored.load_state_dict({k: v for k, v in guard.state_dict().items() if k not in ("tenure", "interval")})
    assert restored.tenure == {}  # a state saved before tenure existed loads


def test_tenure_and_a_vouch_last_only_while_the_peer_teaches_steadily(tiny_policy, arith, monkeypatch):
    """Tenure was never lost to silence and its checks need not follow each other, and one round in 50
    kept a vouch: ids taking turns could bank tenure, about 26 per 20 rounds at the defaults, 130
    vouched after 100 rounds, each admitted in every lockdown (red team, session 29). A check with no
    harm found now takes tenure and vouch from each peer that did not teach in half the rounds since
    the check before; a second check in the same round judges nothing. Presence counts deliveries, not
    the step's choice: a peer taken in 2 of 5 rounds (4 producers for 2 peer slots) that delivered in
    all 5 keeps what it has, and earns nothing."""
    from swarm_node.train.guard import TENURE

    trainer, guard = _guard(tiny_policy, arith)
    for k in range(2 * TENURE):  # peer-turns is steady in every other interval, peer-steady in all
        for _ in range(5):
            guard.step([], 0, taught_by={"peer-steady"} | ({"peer-turns"} if k % 2 == 0 else set()))
        _answers(monkeypatch, mixed_right=50, alone_right=50)
        assert guard.check(5 * (k + 1)).stats["guard/resets"] == 0
        assert guard.tenure["peer-turns"] == (k + 1) % 2, k  # banked before: 1, 1, 2, 2, 3, 3, 4 (vouched), 4
    assert guard.vouched.keys() == {"peer-steady"}
    _answers(monkeypatch, mixed_right=50, alone_right=50)
    guard.check(10 * TENURE, last=True)  # again in the same round
    assert guard.vouched.keys() == {"peer-steady"}
    for i in range(5):  # delivered every round, taken in 2
        guard.step([], 0, taught_by={"peer-steady"} if i < 2 else set(), present={"peer-steady"})
    _answers(monkeypatch, mixed_right=50, alone_right=50)
    guard.check(10 * TENURE + 5)
    assert guard.vouched.keys() == {"peer-steady"} and guard.tenure["peer-steady"] == 2 * TENURE
    guard.step([], 0, taught_by={"peer-steady"})  # then 1 round of 5: it kept a vouch for 49 rounds before
    for _ in range(4):
        guard.step([], 0, taught_by=set())
    _answers(monkeypatch, mixed_right=50, alone_right=50)
    guard.check(10 * TENURE + 10)
    assert guard.vouched == {} and guard.tenure == {}


def test_a_peer_forgiven_once_is_never_cut_off_and_a_reset_is_not_published(tiny_policy, arith, monkeypatch):
    """Red team 7: one id with tenure (peer-a) got itself and the honest neighbour (peer-h) forgiven at a harm, poisoned
    on in the lockdown, and the next harm banned peer-h: a ban is refused unread, so peer-h lost its link, and
    delivering Sybils took its slot. A peer forgiven within LOCKDOWN_MEMORY rounds is now refused in the next
    lockdown, never banned (its valid packets keep its link), and charged no offence for it. A known peer is
    refused in lockdowns, never banned (charging it banned an honest neighbour that two false alarms found
    unvouched: red team 8). A reset does not move the published policy version, and a later harm's lockdown
    that would end sooner does not shorten the one in force."""
    from swarm_node.train.guard import LOCKDOWN_MEMORY, TENURE

    trainer, guard = _guard(tiny_policy, arith)
    guard.step([], 0, taught_by={"peer-k"})
    _answers(monkeypatch, mixed_right=60, alone_right=40)  # a gain: a verdict, and peer-k is known
    guard.check(1), guard.check(1)
    for k in range(TENURE):
        for _ in range(5):
            guard.step([], 0, taught_by={"peer-a", "peer-h"})
        _answers(monkeypatch, mixed_right=50, alone_right=50)
        guard.check(5 * (k + 1))
    assert guard.vouched.keys() == {"peer-a", "peer-h"}
    r = 5 * TENURE + 5
    guard.step([], 0, taught_by={"peer-a", "peer-h", "peer-k"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    version = trainer.policy_version
    verdict = guard.check(r)  # harm 1: both forgiven and admitted; peer-k refused in the lockdown
    assert verdict.stats["guard/resets"] == 1 and trainer.policy_version == version  # a reset is not an optimizer step:
    # the version our packets carry must not tell peers that a harm was found (red team 7)
    assert verdict.distrusted == {} and verdict.admitted == {"peer-a", "peer-h"}
    guard.step([], 0, taught_by={"peer-a", "peer-h", "peer-k", "peer-new"})  # peer-a poisons on in the lockdown
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    verdict = guard.check(r + 5)  # harm 2
    assert verdict.distrusted.keys() == {"peer-new"}  # peer-h, peer-a and peer-k: refused, never cut off
    assert verdict.admitted == set() and verdict.locked_until == r + 5 + 2 * guard.ban_rounds
    assert guard.offences == {"peer-a": 1, "peer-h": 1, "peer-new": 1}
    guard.locked_until = r + 500  # a lockdown in force that ends later than the next harm's would
    guard.step([], 0, taught_by={"peer-h"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    assert guard.check(r + 10).locked_until == r + 500
    for _ in range(LOCKDOWN_MEMORY - 10):  # LOCKDOWN_MEMORY later its standing and offence are both forgotten: known,
        guard.step([], 0, taught_by=set(), present={"peer-h"})  # it delivered all along (absent, it would be new)
    guard.step([], 0, taught_by={"peer-h"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    assert guard.check(r + LOCKDOWN_MEMORY).distrusted == {} and guard.forgiven_at == {}
    restored = _guard(tiny_policy, arith)[1]
    restored.load_state_dict(guard.state_dict())
    assert restored.forgiven_at == guard.forgiven_at and restored.offences == guard.offences


def test_ids_banned_once_that_come_back_after_their_offence_is_forgotten_are_new_again(tiny_policy, arith,
                                                                                      monkeypatch):
    """Red team 10: at a harm every teacher becomes known, and a known id is only ever refused, never banned.
    Ids banned once, quiet until their offence was forgotten (200 rounds), came back known: 4 harms and no
    ban in 300 rounds, V locked down for 292 of them. An offender absent for most of the rounds since its
    offence is new again; one that delivered all along (an honest peer a false alarm caught) stays known."""
    from swarm_node.train.guard import LOCKDOWN_MEMORY

    trainer, guard = _guard(tiny_policy, arith)
    guard.step([], 0, taught_by={"sybil-1", "sybil-2", "peer-h"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    assert guard.check(10).distrusted.keys() == {"sybil-1", "sybil-2", "peer-h"}  # all new at the first harm
    for _ in range(LOCKDOWN_MEMORY + 5):  # the Sybils quiet, the honest peer delivering
        guard.step([], 0, taught_by=set(), present={"peer-h"})
    guard.step([], 0, taught_by={"sybil-1", "sybil-2", "peer-h"})  # all teach in the next bad window
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    verdict = guard.check(10 + LOCKDOWN_MEMORY + 6)
    assert verdict.distrusted.keys() == {"sybil-1", "sybil-2"} and "peer-h" in guard.known
    assert guard.offences == {"sybil-1": 1, "sybil-2": 1}  # a first ban's length: their old offence is forgotten
    restored = _guard(tiny_policy, arith)[1]
    restored.load_state_dict(guard.state_dict())
    assert restored.presence == guard.presence and restored.offended_at == guard.offended_at


def test_a_new_peer_linked_to_us_is_suspended_at_its_first_harm_and_banned_at_its_second(tiny_policy, arith,
                                                                                        monkeypatch):
    """Red team 10: a ban is refused unread, so an honest neighbour that was new here when a harm was found
    (a false alarm, or Sybils teaching beside it) lost its link, and two honest nodes were apart for 37
    rounds. A new id present in half the rounds of this interval and the one before is now suspended at
    its first offence: refused in the lockdown (not admitted), not banned; at its next, banned. An id that
    just arrived is banned at once, as before."""
    from swarm_node.train.guard import LOCKDOWN_MEMORY

    trainer, guard = _guard(tiny_policy, arith)
    for r in range(1, 11):
        guard.step([], 0, taught_by={"peer-h"} if r % 2 else set(), present={"peer-h"})
        if r == 5:
            _answers(monkeypatch, mixed_right=50, alone_right=50)
            guard.check(r)  # no harm: peer-h present through this interval
    guard.step([], 0, taught_by={"peer-h", "peer-fresh"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    verdict = guard.check(11)
    assert verdict.distrusted.keys() == {"peer-fresh"} and "peer-h" not in verdict.admitted
    assert guard.suspended_at == {"peer-h": 11} and "peer-h" not in guard.offences
    for r in range(12, 17):
        guard.step([], 0, taught_by={"peer-h"}, present={"peer-h"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    assert "peer-h" in guard.check(17).distrusted  # its second harm within LOCKDOWN_MEMORY rounds
    restored = _guard(tiny_policy, arith)[1]
    restored.load_state_dict(guard.state_dict())
    assert restored.suspended_at == guard.suspended_at and restored.steady == guard.steady
    # red team 11: a linked id suspended once, then absent until its suspension was forgotten, came back known and
    # was never banned again; its absence is clocked like an offender's, so it is new again
    trainer, guard = _guard(tiny_policy, arith)
    for r in range(1, 11):
        guard.step([], 0, taught_by={"sybil"}, present={"sybil"})
        if r == 5:
            _answers(monkeypatch, mixed_right=50, alone_right=50)
            guard.check(r)
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    assert guard.check(11).distrusted == {} and guard.suspended_at == {"sybil": 11}
    for _ in range(LOCKDOWN_MEMORY + 5):
        guard.step([], 0, taught_by=set())
    guard.step([], 0, taught_by={"sybil"})
    _answers(monkeypatch, mixed_right=20, alone_right=50)
    assert "sybil" in guard.check(11 + LOCKDOWN_MEMORY + 6).distrusted


def test_the_peers_known_before_a_verdict_are_the_latest_max_known(tiny_policy, arith, monkeypatch):
    """Free ids that each teach once must not grow the guard's state, saved in every checkpoint, without
    bound (red team, session 29): the latest MAX_KNOWN are kept, and one that teaches again is the latest."""
    monkeypatch.setattr(guard_module, "MAX_KNOWN", 3)
    _, guard = _guard(tiny_policy, arith)
    for r, peers in ((5, ["peer-a", "peer-b"]), (10, ["peer-c", "peer-a"]), (15, ["peer-d"])):
        for peer in peers:
            guard.step([], 0, taught_by={peer})
        _answers(monkeypatch, mixed_right=60, alone_right=40)  # a gain at each: a verdict
        guard.check(r)
        guard.check(r)  # CONFIRM checks make a verdict
    assert list(guard.known) == ["peer-c", "peer-a", "peer-d"]
    guard.vouched["peer-v"] = guard.steps
    guard.step([], 0, taught_by={"peer-v", "peer-c"})
    for i in range(10):  # between verdicts too (red team 7): the oldest new ids go, never a vouched or known one
        guard.step([], 0, taught_by={f"free-{i}"})
    assert guard.taught.keys() == {"peer-v", "peer-c", "free-9"}


def test_a_session_25_guard_state_keeps_its_vouches_and_their_steps(tiny_policy, arith):
    """Until session 25 the vouched peers were a list and their latest teaching steps a dict beside it."""
    _, guard = _guard(tiny_policy, arith)
    guard.load_state_dict(guard.state_dict() | {"vouched": ["peer-a", "peer-b"], "taught_step": {"peer-a": 7}})
    assert guard.vouched == {"peer-a": 7, "peer-b": 0}  # peer-b: vouched before steps were kept
    guard.load_state_dict(guard.state_dict())
    assert guard.vouched == {"peer-a": 7, "peer-b": 0}

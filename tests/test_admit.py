"""Admission: every check of a peer packet, and reward recomputation."""

import numpy as np
import pytest

from swarm_node.config import RolloutConfig
from swarm_node.net import Received
from swarm_node.swarm import Rejected
from swarm_node.swarm.admit import Admission, Expectations, content_hash
from swarm_node.train.rollout import generate_groups, round_examples
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.wire.codec import Packet, encode, tokenizer_fingerprint

PEER = "QmPeerA"


@pytest.fixture
def setup(tiny_policy, arith):
    groups = generate_groups(HFSampler(tiny_policy), tiny_policy, arith, round_examples(arith, 5, 2, "peer"),
                             RolloutConfig(group_size=3, max_new_tokens=4), seed=0)
    expect = Expectations(run_id="run", tokenizer=tokenizer_fingerprint(tiny_policy.tokenizer), staleness=2)
    return tiny_policy, arith, groups, expect


ROUND = 5  # the receiver's round


def _packet(groups, expect, **changes):
    fields = dict(run_id=expect.run_id, sender=PEER, model_id="tiny-s", tokenizer=expect.tokenizer,
                  policy_version=3, round=ROUND, mode="vertical", groups=groups)
    fields.update(changes)
    return encode(Packet(**fields))


def accept_packet(data, remote, expect, task, policy, offered_round=None):
    """Admit `data` fetched from `remote` (announced for `offered_round`, default: the packet's own round)."""
    if offered_round is None:
        try:
            from swarm_node.wire.codec import decode
            offered_round = decode(data).round
        except Exception:
            offered_round = ROUND
    item = Received(peer_id=remote, round=offered_round, digest="sha256:" + "0" * 64, data=data)
    return Admission(expect, policy.scorer(task)).check(item, ROUND)


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


def test_groups_must_have_the_runs_group_size(setup):
    """64 completions per group from one peer would multiply the receiver's training work."""
    policy, task, groups, expect = setup
    sized = Expectations(**{**expect.__dict__, "group_size": 3})
    assert accept_packet(_packet(groups, sized), PEER, sized, task, policy).groups  # G = 3: fine
    bigger = [type(g)(g.task, g.example_id, g.prompt_tokens, g.completions * 21) for g in groups]  # 63 per group
    with pytest.raises(Rejected) as e:
        accept_packet(_packet(bigger, sized), PEER, sized, task, policy)
    assert e.value.reason == "group_size"


def test_a_lagging_peers_packet_is_admitted_within_max_lag_only(setup):
    """A node resumed from a checkpoint runs a constant 3 rounds behind the others (all pace on the same
    deadline): with the window alone its packets were stale for them and theirs for it, for good (CI's
    chaos soak: the restarted node received nothing for 36 s). swarm.max_lag admits it, and no farther."""
    policy, task, groups, expect = setup
    lagging = Expectations(**{**expect.__dict__, "max_lag": 4})
    for r in (ROUND - 4, ROUND + 4):
        assert accept_packet(_packet(groups, lagging, round=r), PEER, lagging, task, policy).round == r
    for r, e in ((ROUND - 5, lagging), (ROUND + 5, lagging), (ROUND - 3, expect)):
        with pytest.raises(Rejected) as err:
            accept_packet(_packet(groups, e, round=r), PEER, e, task, policy)
        assert err.value.reason == "stale"


def test_a_private_swarm_admits_only_its_trusted_peers(setup):
    policy, task, groups, expect = setup
    private = Expectations(**{**expect.__dict__, "trusted_peers": frozenset({"QmFriend"})})
    with pytest.raises(Rejected) as e:
        accept_packet(_packet(groups, private), PEER, private, task, policy)
    assert e.value.reason == "untrusted_peer"
    friendly = _packet(groups, private, sender="QmFriend")
    assert accept_packet(friendly, "QmFriend", private, task, policy).sender == "QmFriend"


def test_content_hash_is_what_a_group_is_not_how_it_travels(setup):
    """Envelope, claimed rewards, log-probs and the order of completions do not change it; one token,
    the prompt or the example id does: an echo cannot hide behind a re-stamp or a shuffle."""
    import dataclasses

    from swarm_node.wire.codec import Group, decode

    policy, task, groups, expect = setup
    group = groups[0]
    h = content_hash(group)
    travelled = decode(_packet([group], expect, sender="QmEvil", round=4, created_at=123)).groups[0]
    assert content_hash(travelled) == h  # uint32 from the wire vs the sampler's arrays: same ids
    shuffled = [dataclasses.replace(c, reward=1.0 - c.reward, logprobs=c.logprobs - 0.5) for c in group.completions[::-1]]
    assert content_hash(Group(group.task, group.example_id, group.prompt_tokens, shuffled)) == h
    one_token = dataclasses.replace(group.completions[0], tokens=np.concatenate([group.completions[0].tokens, [7]]))
    assert content_hash(Group(group.task, group.example_id, group.prompt_tokens, [one_token, *group.completions[1:]])) != h
    assert content_hash(Group(group.task, "train/1", group.prompt_tokens, group.completions)) != h
    assert content_hash(Group(group.task, group.example_id, group.prompt_tokens[:-1], group.completions)) != h
    # a token moved from one completion to the next is another group (length prefixes)
    a, b = group.completions[0], group.completions[1]
    moved = [dataclasses.replace(a, tokens=a.tokens[:-1]), dataclasses.replace(b, tokens=np.concatenate([a.tokens[-1:], b.tokens]))]
    assert content_hash(Group(group.task, group.example_id, group.prompt_tokens, [*moved, *group.completions[2:]])) != h


def test_our_own_groups_are_refused_as_echoes_and_only_them(setup):
    policy, task, groups, expect = setup
    admission = Admission(expect, policy.scorer(task))
    item = Received(peer_id=PEER, round=ROUND, digest="sha256:" + "0" * 64, data=_packet(groups, expect))
    admission.check(item, ROUND)
    admission.remember_own(groups[1:])
    with pytest.raises(Rejected) as e:
        admission.check(item, ROUND)
    assert e.value.reason == "echo"
    admission.check(Received(PEER, ROUND, "sha256:" + "1" * 64, _packet(groups[:1], expect)), ROUND)


def test_horizontal_mode_drops_a_share_equal_to_ours_and_keeps_the_rest(setup):
    """Every node answers the same prompts in horizontal mode, so an honest peer's share often
    equals ours: the packet is admitted without it (vertical refuses the whole packet)."""
    policy, task, groups, expect = setup
    admission = Admission(Expectations(**{**expect.__dict__, "horizontal": True}), policy.scorer(task))
    admission.remember_own(groups[1:])
    item = Received(peer_id=PEER, round=ROUND, digest="sha256:" + "0" * 64,
                    data=_packet(groups, expect, mode="horizontal"))
    packet = admission.check(item, ROUND)
    assert [g.example_id for g in packet.groups] == [groups[0].example_id]
    assert admission.take_stats()["swarm/groups_duplicate"] == len(groups) - 1
    item = Received(PEER, ROUND, "sha256:" + "1" * 64, _packet(groups[1:], expect, mode="horizontal"))
    assert admission.check(item, ROUND).groups == []  # admitted, nothing to train on
    assert admission.take_stats()["swarm/groups_duplicate"] == len(groups) - 1


def test_ids_our_tokenizer_would_not_give_their_text_are_retokenized(setup):
    """A special token hidden mid-completion (decoding drops it) is gone after admission; honest
    completions, EOS-terminated, are untouched; a trusted swarm (trusted_peers) keeps ids as sent."""
    import dataclasses

    policy, task, groups, expect = setup
    c = groups[0].completions[0]
    smuggled = np.concatenate([c.tokens[:1], [policy.tokenizer.unk_token_id], c.tokens[1:]]).astype(np.uint32)
    groups[0].completions[0] = dataclasses.replace(c, tokens=smuggled, logprobs=np.full(len(smuggled), -0.5, np.float32))
    admission = Admission(expect, policy.scorer(task))
    packet = admission.check(Received(PEER, ROUND, "sha256:" + "0" * 64, _packet(groups, expect)), ROUND)
    first = packet.groups[0].completions[0]
    assert first.tokens.tolist() == c.tokens.tolist() and first.logprobs.tolist() == [0.0] * len(c.tokens)
    assert [x.tokens.tolist() for g in packet.groups for x in g.completions][1:] == [
        x.tokens.tolist() for g in groups for x in g.completions][1:]
    assert admission.take_stats()["swarm/completions_retokenized"] == 1
    trusted = dataclasses.replace(expect, trusted_peers=frozenset({PEER}))
    kept = Admission(trusted, policy.scorer(task)).check(Received(PEER, ROUND, "sha256:" + "0" * 64,
                                                                  _packet(groups, expect)), ROUND)
    assert kept.groups[0].completions[0].tokens.tolist() == smuggled.tolist()


def test_an_echo_re_spelled_in_other_ids_is_still_an_echo(setup):
    """Our own group with a special token slipped into one completion: new ids, so the hash as sent
    differs, but retokenized it is our group again; refused as an echo, not trained as the peer's."""
    import dataclasses

    policy, task, groups, expect = setup
    admission = Admission(expect, policy.scorer(task))
    admission.remember_own(groups)
    c = groups[0].completions[0]
    respelled = np.concatenate([c.tokens[:1], [policy.tokenizer.unk_token_id], c.tokens[1:]]).astype(np.uint32)
    groups[0].completions[0] = dataclasses.replace(c, tokens=respelled, logprobs=np.zeros(len(respelled), np.float32))
    with pytest.raises(Rejected) as e:
        admission.check(Received(PEER, ROUND, "sha256:" + "0" * 64, _packet(groups[:1], expect)), ROUND)
    assert e.value.reason == "echo" and "re-spelled" in str(e.value)


def test_a_distrusted_peer_is_refused_until_its_ban_ends_and_a_later_ban_never_shortens_it(setup):
    policy, task, groups, expect = setup
    gate = Admission(expect, policy.scorer(task))
    gate.distrust({PEER: ROUND + 1})
    gate.distrust({PEER: ROUND})  # an earlier end does not shorten it
    with pytest.raises(Rejected) as e:
        gate.check(Received(PEER, ROUND, "sha256:" + "1" * 64, _packet(groups, expect)), ROUND)
    assert e.value.reason == "distrusted"
    assert gate.distrusted_at(ROUND) == 1 and gate.distrusted_at(ROUND + 1) == 0
    item = Received(PEER, ROUND + 1, "sha256:" + "2" * 64, _packet(groups, expect, round=ROUND + 1))
    assert gate.check(item, ROUND + 1).sender == PEER


def test_a_lockdown_refuses_last_so_only_a_valid_packet_shows_its_sender_alive(setup):
    """In a lockdown a refused peer keeps its link only by a packet that passed every check (`valid`):
    garbage and a packet of another run are refused for what they are (any bytes kept a slot, red
    team, session 29). A packet with no groups is refused (`empty`) in or out of a lockdown: accepted,
    it ended a round's wait at no cost to its sender."""
    policy, task, groups, expect = setup
    gate = Admission(expect, policy.scorer(task))
    gate.distrust({}, locked_until=ROUND + 1, vouched=frozenset())

    def refusal(data: bytes) -> Rejected:
        with pytest.raises(Rejected) as e:
            gate.check(Received(PEER, ROUND, "sha256:" + "5" * 64, data), ROUND)
        return e.value

    valid = refusal(_packet(groups, expect))
    assert valid.reason == "lockdown" and valid.valid
    assert refusal(b"\x81\xa7version\x01garbage").reason.startswith("codec_")
    assert refusal(_packet(groups, expect, run_id="other")).reason == "wrong_run"
    assert refusal(_packet([], expect)).reason == "empty"
    with pytest.raises(Rejected) as e:  # the lockdown is over
        gate.check(Received(PEER, ROUND + 1, "sha256:" + "6" * 64, _packet([], expect, round=ROUND + 1)), ROUND + 1)
    assert e.value.reason == "empty"


def test_in_a_lockdown_only_vouched_peers_are_admitted_until_it_ends(setup):
    policy, task, groups, expect = setup
    gate = Admission(expect, policy.scorer(task))
    gate.distrust({}, locked_until=ROUND + 1, vouched=frozenset({"QmGone"}))
    # a newer verdict's lockdown that ends earlier does not shorten it, and says who is admitted (red team 7: the
    # old set stayed, so a peer that had lost its vouch was admitted and one vouched since was refused)
    gate.distrust({}, locked_until=ROUND, vouched=frozenset({"QmFriend"}))
    assert gate.locked_until == ROUND + 1 and gate.refuses("QmGone", ROUND) == "lockdown"
    gate.distrust({PEER: ROUND})  # a ban alone leaves the lockdown as it is
    assert gate.locked_until == ROUND + 1 and gate.vouched == {"QmFriend"}
    assert gate.refuses(PEER, ROUND) == "lockdown" and gate.refuses("QmFriend", ROUND) is None
    with pytest.raises(Rejected) as e:
        gate.check(Received(PEER, ROUND, "sha256:" + "3" * 64, _packet(groups, expect)), ROUND)
    assert e.value.reason == "lockdown"
    friendly = Received("QmFriend", ROUND, "sha256:" + "4" * 64, _packet(groups, expect, sender="QmFriend"))
    assert gate.check(friendly, ROUND).sender == "QmFriend"
    assert gate.refuses(PEER, ROUND + 1) is None
    private = Admission(Expectations(**{**expect.__dict__, "trusted_peers": frozenset({PEER})}), policy.scorer(task))
    private.distrust({PEER: ROUND + 9}, locked_until=ROUND + 9)
    assert private.refuses(PEER, ROUND) is None  # a trusted peer is never refused

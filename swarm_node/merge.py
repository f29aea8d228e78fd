"""Merge: turn peers' packets into training groups without trusting the peers.

Every received packet goes through `accept_packet`, which either returns its groups (with
rewards recomputed locally) or raises `Rejected(reason)`; the reason becomes a metric
(`swarm/rejected/<reason>`). The checks, in order:

    decode        the codec's strict validation (limits, types, finite log-probs <= 0, vocab)
    run           packet.run_id is this swarm's run
    sender        packet.sender equals the authenticated libp2p peer we fetched it from
    tokenizer     same tokenizer fingerprint as ours, else its token ids mean nothing to us
    round         within the staleness bound of our round, and the round the peer's offer announced
    task/example  the task is ours and every example id exists in our copy of the dataset, in
                  its train split (a held-out example would leak the evaluation set into training)
    prompt        the prompt tokens equal our own rendering of that example's prompt
    length        no completion is longer than we would generate (bounds the work a peer costs us)
    reward        recomputed from our gold answer; the sender's claim is ignored (a wrong claim
                  is counted as `swarm/rewards_corrected`, not rejected: the field is advisory)

Then `cap_peer_groups` takes at most `max_peer_groups` groups per step, round-robin across
peers so one prolific peer cannot crowd out the others, and `combine` forms the training
batch: vertical mode keeps groups as they are; horizontal mode merges all completions for the
same example into one group, so the advantage is computed over the whole cross-node group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swarm_node.backend import Policy
from swarm_node.codec import Group, Packet, PacketError, decode
from swarm_node.rollout import prompt_tokens, score
from swarm_node.tasks import Task


class Rejected(Exception):
    """A peer packet that must not be trained on; `reason` is a short metric-friendly code."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Expectations:
    """What a packet must agree with to be accepted (this node's view of the swarm)."""

    run_id: str
    tokenizer: str
    round: int
    staleness: int
    max_tokens: int | None = None  # longest completion accepted (our own rollout.max_new_tokens)


def accept_packet(data: bytes, remote_peer: str, expect: Expectations, task: Task, policy: Policy,
                  offered_round: int | None = None, stats: dict | None = None) -> Packet:
    """Decode and check a peer's packet; returns it with rewards recomputed, or raises Rejected.

    `offered_round`: the round the peer announced for these bytes (its per-round limit is keyed by
    it). `stats["rewards_corrected"]` counts completions whose claimed reward we overrode.
    """
    try:
        packet = decode(data, vocab_size=policy.vocab_size)
    except PacketError as e:
        raise Rejected(f"codec_{e.code}", str(e)) from None
    if packet.run_id != expect.run_id:
        raise Rejected("wrong_run", packet.run_id)
    if packet.sender != remote_peer:
        raise Rejected("sender_mismatch", f"packet claims {packet.sender}, came from {remote_peer}")
    if packet.tokenizer != expect.tokenizer:
        raise Rejected("tokenizer_mismatch", packet.tokenizer)
    if abs(packet.round - expect.round) > expect.staleness:
        raise Rejected("stale", f"round {packet.round} vs ours {expect.round}")
    if offered_round is not None and packet.round != offered_round:
        raise Rejected("round_mismatch", f"packet says round {packet.round}, its offer said {offered_round}")
    for group in packet.groups:
        if group.task != task.name:
            raise Rejected("wrong_task", group.task)
        example = task.example(group.example_id)
        if example is None:
            raise Rejected("unknown_example", group.example_id)
        if not example.id.startswith("train/"):
            raise Rejected("held_out_example", group.example_id)
        if not np.array_equal(group.prompt_tokens, np.asarray(prompt_tokens(policy, task, example), dtype=np.uint32)):
            raise Rejected("prompt_mismatch", group.example_id)
        if expect.max_tokens is not None and any(len(c.tokens) > expect.max_tokens for c in group.completions):
            raise Rejected("too_long", f"a completion of {group.example_id} is longer than {expect.max_tokens} tokens")
    claimed = [c.reward for g in packet.groups for c in g.completions]
    score(packet.groups, task, policy)
    if stats is not None:
        ours = [c.reward for g in packet.groups for c in g.completions]
        stats["rewards_corrected"] = stats.get("rewards_corrected", 0) + sum(a != b for a, b in zip(claimed, ours))
    return packet


def cap_peer_groups(groups_by_peer: dict[str, list[Group]], cap: int) -> list[Group]:
    """At most `cap` groups, taken round-robin across peers (fair share, in arrival order)."""
    queues = [list(groups) for _, groups in sorted(groups_by_peer.items())]
    picked: list[Group] = []
    while len(picked) < cap and any(queues):
        for queue in queues:
            if queue and len(picked) < cap:
                picked.append(queue.pop(0))
    return picked


def combine(own: list[Group], peer_groups: list[Group], mode: str) -> list[Group]:
    """The training batch: own + peer groups (vertical), or merged per example (horizontal)."""
    if mode == "vertical":
        return own + peer_groups
    merged: dict[str, Group] = {}
    for group in own + peer_groups:
        if group.example_id in merged:
            merged[group.example_id].completions.extend(group.completions)
        else:
            merged[group.example_id] = Group(group.task, group.example_id, group.prompt_tokens, list(group.completions))
    return list(merged.values())

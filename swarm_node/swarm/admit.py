"""Admission: decide whether a peer's packet may be trained on, without trusting the peer.

`Admission.check(received, round)` either returns the decoded packet (rewards recomputed
locally) or raises `Rejected(reason)`; the reason becomes a metric (`swarm/rejected/<reason>`,
docs/RELIABILITY.md lists them). The checks, in order:

    decode        the codec's strict validation (limits, types, finite log-probs <= 0, vocab)
    trust         with `swarm.trusted_peers` set, the sender is one of them (private swarms); and
                  the guard has not banned the sender (`refuses`: distrusted, because what it
                  taught made us worse: train/guard.py)
    empty         a packet with no groups (nothing to train on) is refused: else, accepted, it
                  would end a round's wait at no cost to its sender
    run           packet.run_id is this swarm's run
    sender        packet.sender equals the authenticated libp2p peer we fetched it from
    tokenizer     same tokenizer fingerprint as ours, else its token ids mean nothing to us
    round         within the staleness bound of our round (a slower or faster peer's newest packet:
                  within max_lag), and the round the peer's offer announced
    schedule      a group whose problem is not among the first `schedule_depth` of the sender's
                  public schedule for the packet's round (wire/schedule.py), or repeats one of the
                  packet's problems, is dropped (`swarm/groups_unscheduled`), a packet left with
                  none refused (`unscheduled`): a peer cannot pick which problems to teach, only
                  which of its scheduled ones
    task/example  the task is ours and every example id exists in our copy of the dataset, in
                  its train split (a held-out example would leak the evaluation set into training)
    prompt        the prompt tokens equal our own rendering of that example's prompt
    group size    exactly G completions per group (64 per group would multiply our training work)
    length        no completion is longer than we would generate (bounds the work a peer costs us)
    echo          no group is one of our own (`remember_own`): a peer may re-sign our packet
                  as its own (new bytes, so the transport delivers it); a group's content hash
                  (example id, prompt ids, the multiset of completions' ids) is what counts, so
                  no envelope field, claimed reward, log-prob or order of completions hides it.
                  Horizontal mode drops such a group instead (`swarm/groups_duplicate`): every
                  node answers the same prompts there, so an honest peer's share often equals ours
    tokens        an untrusted peer's completion is trained on as the ids our tokenizer gives its
                  text (`Scorer.canonical`; open swarms, i.e. no `trusted_peers`): ids that
                  spell a text in a way we never would (split merges, special tokens that
                  decoding drops) cannot carry a gradient to token sequences we never produce;
                  its claimed log-probs then mean nothing and are zeroed (the trainer uses our
                  own for untrusted peers). Counted as `swarm/completions_retokenized`
    reward        recomputed from our gold answer; the sender's claim is ignored (a wrong claim
                  is counted as `swarm/rewards_corrected`, not rejected: the field is advisory)
    lockdown      last: in a lockdown after a harm (train/guard.py), a peer not vouched for is
                  refused, `valid` (it passed every check above): only then is its sender alive and
                  keeps its link (swarm/exchange.py); any bytes at all kept a slot through a
                  lockdown before session 29

Admission holds a `Scorer` (the task and our tokenizer, tasks/scoring.py), never the model; the
exchange, which moves the bytes, holds neither and asks admission about every packet.

What the echo check does not catch: a group mixing some of our completions with the sender's
own (G in all) is not an echo. It costs us what any group of that peer costs (its share of a
step is bounded), and identical completions from honest peers (short answers of a well-trained
model are often the same) must not be refused, so single completions are not matched.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from swarm_node import metrics as M
from swarm_node.net import Received
from swarm_node.swarm import Rejected
from swarm_node.tasks.scoring import Scorer
from swarm_node.wire.codec import Packet, PacketError, decode
from swarm_node.wire.contract import prompt_base, prompt_digest
from swarm_node.wire.schedule import schedule_key, scheduled_indices

MAX_OWN_GROUPS = 8192  # content hashes of our offered groups remembered, the newest (two per group in an open swarm)
MAX_SCHEDULES = 1024  # (sender, round) schedules remembered
# characters a completion's text may have per token of the length limit (ordinary text has ~4): re-spelling and
# scoring cost what the text's length costs, and one Qwen2.5 id decodes to 128 spaces, so a packet of such ids cost
# 25x a benign one of the same bytes, ~1.3 s of the node's main thread a round per hostile id (red team 25)
MAX_CHARS_PER_TOKEN = 8


class _Everything:
    """A depth at least the split's size schedules every problem."""

    def __contains__(self, item) -> bool:
        return True


EVERYTHING = _Everything()


def content_hash(group) -> bytes:
    """What a group *is*, whoever sends it: example id, prompt ids and the sorted ids of its
    completions (uint32 little-endian, each length-prefixed). Envelope, rewards, log-probs and
    the order of completions do not count."""
    def ids(tokens) -> bytes:
        raw = np.ascontiguousarray(np.asarray(tokens, dtype="<u4")).tobytes()
        return len(raw).to_bytes(8, "little") + raw

    completions = sorted(ids(c.tokens) for c in group.completions)
    parts = [group.example_id.encode("utf-8"), ids(group.prompt_tokens), *completions]
    return hashlib.blake2b(b"".join(len(p).to_bytes(8, "little") + p for p in parts), digest_size=16).digest()


@dataclass
class Expectations:
    """What a packet must agree with to be accepted (this node's view of the swarm)."""

    run_id: str
    tokenizer: str  # our tokenizer fingerprint
    staleness: int
    max_lag: int = 0  # a peer's newest packet is admitted this far from our round (the transport fetched only that one)
    max_tokens: int | None = None  # longest completion accepted (our own rollout.max_new_tokens)
    group_size: int | None = None  # completions per group (the run's G): more would multiply our training work
    trusted_peers: frozenset[str] = frozenset()  # if non-empty, only these peers' packets are admitted
    prompts: str = "tokens"  # sha256: a group may carry prompt_digest(our rendering) instead (SPEC 14.6)
    horizontal: bool = False  # every node answers our prompts: a share equal to ours is dropped, not refused
    schedule_depth: int | None = None  # train only on groups among the first N of the sender's schedule (None: any)


class Admission:
    """Checks peers' packets against our task, tokenizer and round; counts corrected rewards."""

    def __init__(self, expect: Expectations, scorer: Scorer):
        self.expect, self.scorer, self.task = expect, scorer, scorer.task
        self.rewards_corrected = 0  # completions whose claimed reward we overrode, since the last take_stats
        self.retokenized = 0  # completions whose ids we replaced by our tokenizer's, since the last take_stats
        self.duplicates = 0  # peers' groups equal to one of ours dropped (horizontal mode), since the last take_stats
        self.unscheduled = 0  # peers' groups outside their sender's schedule dropped, since the last take_stats
        self.train = self.task.split("train") if expect.schedule_depth else ()  # schedule index i: self.train[i]
        self.schedules: OrderedDict[tuple[str, int], set[str]] = OrderedDict()  # (key, round) -> example ids
        self.base = prompt_base(scorer.tokenizer) if expect.prompts == "sha256" else 0  # digits of a prompt digest
        self.own: OrderedDict[bytes, None] = OrderedDict()  # content hashes of groups we offered, newest last
        self.distrusted: dict[str, int] = {}  # peer -> the round from which its packets are admitted again
        self.locked_until, self.vouched = 0, frozenset()  # before that round only `vouched` peers are admitted

    def distrust(self, until: dict[str, int], locked_until: int = 0, vouched: frozenset[str] = frozenset()) -> None:
        """Admit no packet of the peers of `until` before their rounds, and, for a new lockdown
        (`locked_until` > 0), none of a peer outside `vouched` before it: the newest verdict says
        who is admitted. A ban or a lockdown that ends later is never shortened."""
        for peer, end in until.items():
            self.distrusted[peer] = max(end, self.distrusted.get(peer, 0))
        if locked_until:
            self.locked_until, self.vouched = max(locked_until, self.locked_until), frozenset(vouched)

    def refuses(self, peer: str, round_index: int) -> str | None:
        """Why every packet of `peer` is refused in `round_index` (`distrusted`, `lockdown`), or None
        (never for a peer of `swarm.trusted_peers`)."""
        if peer in self.expect.trusted_peers:
            return None
        if self.distrusted.get(peer, 0) > round_index:
            return "distrusted"
        return "lockdown" if round_index < self.locked_until and peer not in self.vouched else None

    def distrusted_at(self, round_index: int) -> int:
        """How many peers are distrusted in `round_index` (forgets the bans that ended)."""
        self.distrusted = {p: end for p, end in self.distrusted.items() if end > round_index}
        return len(self.distrusted)

    def remember_own(self, groups: list) -> None:
        """Our own groups of a round (before they are offered), so their echoes are refused: as
        sampled and, in an open swarm, as our tokenizer spells them (an echo re-spelled in other ids
        would otherwise pass the first check and be retokenized back into our own group)."""
        for group in groups:
            hashes = {content_hash(group)}
            if not self.expect.trusted_peers:
                hashes.add(content_hash(self._canonical(group)))
            for h in hashes:
                self.own.pop(h, None)
                self.own[h] = None
        while len(self.own) > MAX_OWN_GROUPS:
            self.own.popitem(last=False)

    def check(self, item: Received, round_index: int) -> Packet:
        """The packet in `item` with rewards recomputed, or raise Rejected."""
        packet = self._decode(item, round_index)
        self._keep_scheduled(packet)
        for group in packet.groups:
            self._check_group(group)
        self._drop_echoes(packet, "")  # as sent: our ids as sampled
        retokenized = 0 if self.expect.trusted_peers else sum(self._retokenize(g) for g in packet.groups)
        if retokenized:  # as we would spell it: a re-spelled echo
            self._drop_echoes(packet, ", re-spelled")
        claimed = [c.reward for g in packet.groups for c in g.completions]
        self.scorer.score(packet.groups)
        ours = [c.reward for g in packet.groups for c in g.completions]
        if self.refuses(item.peer_id, round_index) == "lockdown":  # last: only a valid packet shows it alive
            raise Rejected("lockdown", f"{item.peer_id}: not vouched for in the guard's lockdown (train/guard.py)",
                           valid=True)
        self.rewards_corrected += sum(a != b for a, b in zip(claimed, ours))
        self.retokenized += retokenized
        return packet

    def take_stats(self) -> dict[str, int]:
        """This round's admission metrics (and start counting the next round's)."""
        stats = {M.REWARDS_CORRECTED: self.rewards_corrected, M.RETOKENIZED: self.retokenized,
                 M.GROUPS_DUPLICATE: self.duplicates, M.GROUPS_UNSCHEDULED: self.unscheduled}
        self.rewards_corrected = self.retokenized = self.duplicates = self.unscheduled = 0
        return stats

    def _keep_scheduled(self, packet: Packet) -> None:
        """Keep the groups whose problem the sender's schedule gives it for the packet's round (within
        our depth), each problem once; refuse a packet left with none. An id that is not a known train
        example is left to the group checks (unknown or held-out: the packet is refused). Copies of one
        scheduled problem would otherwise fill the sender's whole share of a step (red team, session 25:
        16 copies of its one `skew` target, 8 of them trained a step)."""
        depth = self.expect.schedule_depth
        if not depth:
            return
        allowed = self._scheduled(packet.sender, packet.round, depth)
        kept, seen = [], set()
        for g in packet.groups:
            known = g.example_id.startswith("train/") and self.task.example(g.example_id) is not None
            if known and (g.example_id not in allowed or g.example_id in seen):
                continue  # not this sender's for this round, or a repeat
            kept.append(g)
            seen.add(g.example_id)
        self.unscheduled += len(packet.groups) - len(kept)
        if packet.groups and not kept:
            raise Rejected("unscheduled", f"none of {len(packet.groups)} groups is in {packet.sender}'s schedule "
                                          f"for round {packet.round} (SPEC 14.5)")
        packet.groups = kept

    def _scheduled(self, sender: str, round_index: int, depth: int) -> set[str] | _Everything:
        """The example ids of the first `depth` problems of `sender`'s schedule for `round_index` (the
        mode is ours, never the packet's: SPEC 14.5), the last MAX_SCHEDULES remembered."""
        if depth >= len(self.train):
            return EVERYTHING
        key = schedule_key(self.expect.run_id, "horizontal" if self.expect.horizontal else "vertical", sender)
        if (key, round_index) not in self.schedules:
            self.schedules[key, round_index] = {self.train[i].id for i in
                                                scheduled_indices(key, round_index, len(self.train), depth)}
            while len(self.schedules) > MAX_SCHEDULES:
                self.schedules.popitem(last=False)
        return self.schedules[key, round_index]

    def _drop_echoes(self, packet: Packet, how: str) -> None:
        """Refuse a packet with a group equal to one of ours (vertical); in horizontal mode drop
        such groups from it instead: there every node answers our prompts, and two confident
        models often write the same share, so refusing it made each such round wait the full
        deadline (the real-model study's horizontal runs, 2026-11-27). A dropped share is not
        trained on and earns its sender no credit: an echoed share would only have repeated ours."""
        kept, echoes = [], []
        for group in packet.groups:  # each group hashed once
            (echoes if content_hash(group) in self.own else kept).append(group)
        if echoes and not self.expect.horizontal:
            raise Rejected("echo", f"{echoes[0].example_id} is a group we offered{how}")
        packet.groups = kept
        self.duplicates += len(echoes)

    def _decode(self, item: Received, round_index: int) -> Packet:
        expect = self.expect
        if expect.trusted_peers and item.peer_id not in expect.trusted_peers:
            raise Rejected("untrusted_peer", item.peer_id)
        if self.refuses(item.peer_id, round_index) == "distrusted":  # banned: not even decoded (a lockdown: `check`)
            raise Rejected("distrusted", f"{item.peer_id}: the guard refuses its packets for now (train/guard.py)")
        try:
            packet = decode(item.data, vocab_size=self.scorer.vocab_size)
        except PacketError as e:
            raise Rejected(f"codec_{e.code}", str(e)) from None
        if not packet.groups:
            raise Rejected("empty", "a packet with no groups")
        if packet.run_id != expect.run_id:
            raise Rejected("wrong_run", packet.run_id)
        if packet.sender != item.peer_id:
            raise Rejected("sender_mismatch", f"packet claims {packet.sender}, came from {item.peer_id}")
        if packet.tokenizer != expect.tokenizer:
            raise Rejected("tokenizer_mismatch", packet.tokenizer)
        if abs(packet.round - round_index) > max(expect.staleness, expect.max_lag):
            raise Rejected("stale", f"round {packet.round} vs ours {round_index}")
        if packet.round < 1:  # round 0 is the starting point: no node generates or offers it
            raise Rejected("stale", f"round {packet.round}")
        if packet.round != item.round:
            raise Rejected("round_mismatch", f"packet says round {packet.round}, its offer said {item.round}")
        return packet

    def _check_group(self, group) -> None:
        if group.task != self.task.name:
            raise Rejected("wrong_task", group.task)
        example = self.task.example(group.example_id)
        if example is None:
            raise Rejected("unknown_example", group.example_id)
        if not example.id.startswith("train/"):
            raise Rejected("held_out_example", group.example_id)
        ours = np.asarray(self.scorer.prompt_tokens(example), dtype=np.uint32)
        if not np.array_equal(group.prompt_tokens, ours):
            if self.expect.prompts != "sha256" or not np.array_equal(group.prompt_tokens, prompt_digest(ours, self.base)):
                raise Rejected("prompt_mismatch", group.example_id)
            group.prompt_tokens = ours  # by reference: train on the prompt the digest stands for
        size = self.expect.group_size
        if size is not None and len(group.completions) != size:
            raise Rejected("group_size", f"{group.example_id} has {len(group.completions)} completions, the run's G is {size}")
        self._check_length(group)

    def _check_length(self, group) -> None:
        """At most the run's `max_new_tokens` tokens, and MAX_CHARS_PER_TOKEN characters per token of that limit
        once decoded (measured before any encoding: decoding is ~40x cheaper per character)."""
        limit = self.expect.max_tokens
        if limit is not None and any(len(c.tokens) > limit for c in group.completions):
            raise Rejected("too_long", f"a completion of {group.example_id} is longer than {limit} tokens")
        if limit is not None and any(len(self.scorer.decode(c.tokens)) > MAX_CHARS_PER_TOKEN * limit
                                     for c in group.completions):
            raise Rejected("too_long", f"a completion of {group.example_id} decodes to more than "
                                       f"{MAX_CHARS_PER_TOKEN * limit} characters")

    def _canonical(self, group):
        """`group` with every completion's ids in our tokenizer's spelling (a copy; for hashing)."""
        completions = [SimpleNamespace(tokens=self.scorer.canonical(c.tokens)) for c in group.completions]
        return SimpleNamespace(example_id=group.example_id, prompt_tokens=group.prompt_tokens, completions=completions)

    def _retokenize(self, group) -> int:
        """Replace completions not in our tokenizer's canonical form by that form (in place); how many.

        A canonical form can be longer than the ids sampled (a sampled byte token that is half a
        character decodes to U+FFFD, which encodes as two or more tokens): it is cut to our length
        limit, as our own sampler cuts a completion, and scored from that text like any other, so an
        honest peer's packet is not refused for it and nobody gets more than the limit trained."""
        n, limit = 0, self.expect.max_tokens
        for c in group.completions:
            ids = self.scorer.canonical(c.tokens)[:limit]
            if len(ids) != len(c.tokens) or not np.array_equal(c.tokens, ids):
                c.tokens = np.asarray(ids, dtype=np.uint32)  # [T']
                c.logprobs = np.zeros(len(ids), dtype=np.float32)  # [T']: a claim about other ids is no claim
                n += 1
        return n

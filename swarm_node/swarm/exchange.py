"""Exchange: one round of rollout sharing, in bytes, over a `Transport` (no model, no task).

    offer:    encode this round's own groups as a packet and hand its bytes to the transport
    collect:  ask the transport for peers' packets of rounds within the staleness bound, and
              pass each to the admission check the node supplies, until packets of `min_peers`
              distinct peers were *accepted* (a rejected packet does not end the wait, so a fast
              hostile peer cannot cut honest ones off) or the deadline passed (never waits forever);
              then, fair arrival, at most `fair_wait_s` more for the neighbours not heard from
              this round that delivered, or joined, in our last FAIR_ROUNDS rounds: a peer that
              offers rounds ahead and always arrives first used to end every wait and crowd the
              honest peer out (0 bytes from it in 100 of 100 rounds); a neighbour silent for longer
              is not waited for (free Sybil ids would each buy every round the wait), nor a new one
              after a fetch of it failed or a wait for it ran out (`_fair_wait_for`); in a guard's
              lockdown a valid packet it refuses counts towards `min_peers` as an accepted one does
              (`standing_by`): with the honest peer refused, a vouched id that offered late held
              each round to the deadline; and a lockdown that refuses every producer makes one pass
              that fetches what is offered and waits for nothing
    account:  packets, bytes, tokens and rejections by reason, as `swarm/...` metrics

Vertical mode (the paper's default) accepts packets of rounds r - staleness .. r + staleness, and
a slower or faster peer's newest packet up to `max_lag` rounds away (never waited for: a node 4x
slower than its neighbours used to fall out of their window for good, and they out of its);
horizontal mode only round r, since only then are the prompts the same. The transport delivers
each digest at most once; a packet that claims another sender is not that peer's packet, so the
(peer, digest) pair is distrusted and the real sender may still deliver it.

Credit (`credit`, after the step): the neighbour that delivered an admitted packet (not an echo)
whose groups the step took earns its mesh slot (`Transport.credit`), unless every positive of it
in the step was found implausible (trained on or not: an all-correct group has no advantage and is
judged without training): a peer that only offers completions our own model would not write is
misbehaving, whatever its packets look like. Wrong answers are not misbehaviour: a weak honest
peer earns its slot, and keeps the link over which it learns from us. One whose packet could teach
but found no room in the step is alive (not idle) without credit, unless a step found it implausible
in the last IMPLAUSIBLE_ROUNDS rounds. The mesh keeps neighbours by what they delivered, never by
what they say (issue 27).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Protocol

from swarm_node import metrics as M
from swarm_node.config import SwarmConfig
from swarm_node.net import Received, Transport
from swarm_node.swarm import Rejected
from swarm_node.wire.codec import Group, Packet, encode
from swarm_node.wire.contract import by_reference

log = logging.getLogger(__name__)
# rejections about the peer that served a packet, not its bytes: another peer may serve the same digest as its own
# (an untrusted or banned id that re-served an honest peer's packet first blocked the genuine copy: red team 9)
REFUSED_FOR_ITS_SERVER = ("sender_mismatch", "untrusted_peer", "distrusted")
MAX_COLLECTS = 256  # transport.collect calls per round at most (each brings new packets or ends at the deadline)
MAX_PRODUCERS = 256  # producers remembered as having offered packets of our rounds (_wanted)
FAIR_ROUNDS = 2  # fair arrival waits only for neighbours that delivered a packet we took in one of our last 2 rounds
REFUSAL_ROUNDS = 100  # a neighbour that refused a fetch or let a fair wait run out: no newcomer wait for 100 rounds
FAIR_SLICE_S = 0.25  # during a fair wait, whom to wait for is asked again this often (a refusal ends it)
IMPLAUSIBLE_ROUNDS = 20  # a peer found implausible: its untaken packets do not keep it from idling for 20 rounds


def count_tokens(groups: list[Group]) -> int:
    return sum(len(c.tokens) for g in groups for c in g.completions)


class Gate(Protocol):
    """What the exchange asks about each packet (swarm/admit.py's Admission)."""

    def check(self, item: Received, round_index: int) -> Packet: ...  # the packet, or raise Rejected

    def take_stats(self) -> dict: ...  # this round's counters, reset

    def refuses(self, peer: str, round_index: int) -> str | None: ...  # every packet of `peer` is refused now: why


class Exchange:
    """The node's side of the swarm: a transport plus this node's identity strings and settings."""

    def __init__(self, transport: Transport, cfg: SwarmConfig, model_id: str, tokenizer: str, prompt_base: int = 0):
        self.transport, self.cfg, self.model_id, self.tokenizer = transport, cfg, model_id, tokenizer
        self.prompt_base = prompt_base  # V of our tokenizer: prompt digests are written in base V (prompts=sha256)
        self.seen_peers = False  # once any peer was seen (or --peers given), every round waits the full deadline
        self.implausible_at: dict[str, int] = {}  # peer -> our last round whose step found all its positives implausible
        self.producing: dict[str, None] = {}  # producers that offered packets of our rounds, newest last (_wanted)
        self.standing_by: set[str] = set()  # peers whose valid packets a lockdown refused this round (`collect`)
        # the transport's counters at the end of the last collect: a round's figures count from there, not from
        # this collect's start (the mesh evicts, and peers fetch from us, while we generate and train)
        self.counted: dict | None = None
        self.refused_at: dict[str, int] = {}  # peer -> our last round in which a fetch of it failed or was refused,
        #   or a fair wait for it as a new neighbour ran out: no more newcomer waits for it (`_fair_wait_for`)
        transport.measure()  # we credit useful packets (`credit`): the mesh may replace neighbours that deliver none

    def offer(self, round_index: int, policy_version: int, own: list[Group]) -> dict:
        """Serve our groups of this round as a packet; returns its metrics."""
        if self.cfg.prompts == "sha256":  # prompts by reference: receivers render them (SPEC 14.6)
            own = by_reference(own, self.prompt_base)
        packet = Packet(run_id=self.cfg.run_id, sender=self.transport.peer_id, model_id=self.model_id,
                        tokenizer=self.tokenizer, policy_version=policy_version, round=round_index,
                        mode=self.cfg.mode, groups=own)
        data = encode(packet)
        self.transport.offer(round_index, policy_version, data)
        return {M.PACKET_BYTES_OUT: len(data), M.TOKENS_OUT: count_tokens(own)}

    def collect(self, round_index: int, gate: Gate) -> tuple[list[tuple[str, Packet]], dict]:
        """Peers' packets for this round that `gate` admitted, as (peer id, packet), and the round's
        swarm metrics (the gate's among them)."""
        s, start = self.cfg, time.perf_counter()
        before = self.transport.stats() if self.counted is None else self.counted
        oldest, newest = (round_index, round_index) if s.mode == "horizontal" else (
            round_index - s.staleness, round_index + s.staleness)
        accepted: list[tuple[str, Packet]] = []
        rejected: Counter[str] = Counter()
        n_received, packet_bytes_in, peers, lagging = 0, 0, 0, 0
        t_end = time.monotonic() + self._deadline()
        self.standing_by = set()
        heard: set[str] = set()  # peers that delivered a packet this round (accepted or not)
        t_fair = None  # once min_peers were accepted: until when the other neighbours may still deliver
        fair_for: set[str] = set()  # the neighbours a fair wait was spent on this round
        wanted = self._wanted(oldest, newest)
        for _ in range(MAX_COLLECTS):
            have = {peer for peer, _ in accepted} | self.standing_by
            if t_fair is None and 0 < wanted <= len(have):  # min_peers 0: one pass, as asked
                t_fair = min(t_end, time.monotonic() + s.fair_wait_s)
            refused_all = t_fair is None and self._only_refused(gate, round_index)
            if refused_all:  # one pass, nothing waited for: what is offered now is still fetched (and refused), so a
                t_end = min(t_end, time.monotonic() + s.fair_wait_s)  # neighbour in a lockdown shows it is alive
                got = self.transport.collect(oldest, newest, 0, max(0.0, t_end - time.monotonic()))
            elif t_fair is None:
                got = self.transport.collect(oldest, newest, wanted - len(have), max(0.0, t_end - time.monotonic()))
            else:
                wait_for = {p for p in self._fair_wait_for(oldest, newest) - heard if not gate.refuses(p, round_index)}
                if not wait_for or time.monotonic() >= t_fair:
                    break
                fair_for |= wait_for
                slice_end = min(t_fair, time.monotonic() + FAIR_SLICE_S)  # then ask again whom to wait for
                got = self.transport.collect(oldest, newest, 1, max(0.0, slice_end - time.monotonic()))
            self.refused_at.update(dict.fromkeys(got.failed, round_index))
            rejected.update(got.dropped)
            peers = max(peers, got.peers)
            n_received += len(got.packets)
            for item in got.packets:
                heard.add(item.peer_id)
                packet = self._admit(item, round_index, gate, rejected)
                if packet is not None:
                    accepted.append((item.peer_id, packet))
                    packet_bytes_in += len(item.data)
                    lagging += not oldest <= item.round <= newest  # a slower or faster peer's newest (max_lag)
            if refused_all or time.monotonic() >= t_end:
                break
            if not got.packets and (t_fair is None or time.monotonic() < slice_end - 0.01):
                break  # the transport expects nothing more in time
        self._note_refusals(fair_for - heard, round_index)
        after = self.counted = self.transport.stats()
        groups_in = [g for _, p in accepted for g in p.groups]
        stats = {M.PEERS: peers, M.PACKETS_RECEIVED: n_received, M.PACKETS_ACCEPTED: len(accepted),
                 M.PACKETS_LAGGING: lagging,
                 M.PACKETS_REJECTED: sum(rejected.values()), M.PACKET_BYTES_IN: packet_bytes_in,
                 M.TOKENS_IN: count_tokens(groups_in), M.COMPLETIONS_IN: sum(len(g.completions) for g in groups_in),
                 M.TIME_EXCHANGE: time.perf_counter() - start}
        for key, stat in ((M.BYTES_OUT, "bytes_out"), (M.BYTES_IN, "bytes_in"), (M.FETCH_TIMEOUTS, "fetch_timeouts"),
                          (M.FETCH_FAILURES, "fetch_failures"), (M.FETCH_RESUMES, "fetch_resumes"),
                          (M.NEIGHBORS_EVICTED, "neighbors_evicted"), (M.STREAMS_OVER_RATE, "streams_over_rate"),
                          (M.PEERS_GRAYLISTED, "peers_graylisted"), (M.KNOCKER_TURNS, "knocker_turns"),
                          (M.SHIELDS, "shields")):
            stats[key] = after.get(stat, 0) - before.get(stat, 0)
        for key, stat in ((M.MESH_OUTBOUND, "mesh_outbound"), (M.MESH_CREDITED, "mesh_credited"),
                          (M.KNOCKERS_PROVEN, "knockers_proven")):  # levels (credits come after the collect)
            if stat in after:
                stats[key] = after[stat]
        stats.update({f"{M.REJECTED_PREFIX}{reason}": n for reason, n in rejected.items()})
        stats.update(gate.take_stats())
        return accepted, stats

    def credit(self, accepted: list[tuple[str, Packet]], taken: set[str], implausible: set[str],
               useful: set[str] | None = None, teaching: set[str] = frozenset(), round_index: int = 0) -> list[str]:
        """Credit the neighbours that delivered admitted packets the step took (`taken`: peers with a
        group in it), except `implausible`: the peers all of whose positives in the step were found
        implausible (see the module docstring); `useful` (default: all taken) marks those with a
        group whose rewards differ. Returns the credited.

        A neighbour whose admitted packet could teach (`teaching`: a group whose rewards differ) but
        found no room in the step (more teaching peers than peer slots) is marked alive, not
        credited: it is not idle. Before, with 3 honest producers for 2 slots, one often went
        untaken 5 rounds in a row and lost its slot (the chaos soak). Not for IMPLAUSIBLE_ROUNDS
        after a step found all its positives implausible: a poisoner is judged whenever it is
        taken, and its untaken packets must not keep the slot it lost by that judgement."""
        for peer in implausible:
            self.implausible_at[peer] = round_index
        self.implausible_at = {p: r for p, r in self.implausible_at.items() if round_index - r < IMPLAUSIBLE_ROUNDS}
        earned = sorted(({peer for peer, _ in accepted} & taken) - implausible)
        for peer in earned:
            self.transport.credit(peer, useful=useful is None or peer in useful)
        for peer in sorted(teaching - taken - self.implausible_at.keys()):
            self.transport.credit(peer, useful=False, taken=False)
        return earned

    def _fair_wait_for(self, oldest: int, newest: int) -> set[str]:
        """Neighbours a fair wait is for: producers whose packets a step of ours took (or had no room
        for, though they could teach) in one of our last FAIR_ROUNDS rounds (`credit`), and new
        neighbours in their first FAIR_ROUNDS rounds (`rounds_idle` counts from whichever is later)
        that offer a packet of the wanted rounds, until a fetch of theirs fails or is refused or a
        wait for them runs out (`refused_at`). So a peer buys at most fair_wait_s of our time per
        packet it delivered, and a new id at most one fair wait, by holding a fetch open.
        Before: every producer not heard from was waited for, and 3 silent live Sybils made every
        round 9x slower (bench/redteam_eclipse.py); one delivering every 4th round kept every round 2 s longer (red
        team 2, `laggard`). Without the newcomer's rounds, Sybils that deliver first every round
        left a new honest peer's first packet out, and it never earned the wait (crowded out). Without
        the offer, 16 silent Sybils cycling through our dialled slots bought 2 s in 2 of every 5 rounds
        (session 16: V's median round 1.5-2.7x the no-attack one); without the refusals, Sybils
        offering packets they answer `busy` still did (session 17)."""
        producers = {p.peer_id: p for p in self.transport.peers() if p.produces}
        scores = self.transport.neighbours() if producers else {}
        return {p for p, info in producers.items() if p in scores and scores[p]["rounds_idle"] < FAIR_ROUNDS
                and (scores[p]["credits"] > 0 or p not in self.refused_at
                     and any(oldest <= o[0] <= newest for o in info.offers))}

    def _wanted(self, oldest: int, newest: int) -> int:
        """Peers whose packets end the wait: `min_peers`, less one for each producer that offered a
        packet of our rounds before and offers none now (at least 1). A peer that left, or that runs far
        ahead or behind (a guard's lockdown lets a node run alone at its own pace), will not deliver in
        time: waiting for it cost every round the whole deadline (session 25's demo: 20 s a round for
        35 rounds). Only a `min_peers` above 1 is changed, and the fair wait still covers every
        neighbour that delivered lately."""
        offering = {p.peer_id for p in self.transport.peers()
                    if p.produces and any(oldest <= o[0] <= newest for o in p.offers)}
        for peer in offering:  # newest last
            self.producing.pop(peer, None)
            self.producing[peer] = None
        while len(self.producing) > MAX_PRODUCERS:
            self.producing.pop(next(iter(self.producing)))
        return max(min(1, self.cfg.min_peers), self.cfg.min_peers - len(self.producing.keys() - offering))

    def _only_refused(self, gate: Gate, round_index: int) -> bool:
        """Every producer we know is refused whatever it sends (train/guard.py): waiting for packets
        we would refuse would cost each round the whole deadline."""
        producers = [p.peer_id for p in self.transport.peers() if p.produces]
        return bool(producers) and all(gate.refuses(p, round_index) for p in producers)

    def _note_refusals(self, waited_in_vain: set[str], round_index: int) -> None:
        """Remember the neighbours a fair wait this round ran out on; forget refusals older than
        REFUSAL_ROUNDS (a peer that returns that much later is new again)."""
        self.refused_at.update(dict.fromkeys(waited_in_vain, round_index))
        self.refused_at = {p: r for p, r in self.refused_at.items() if round_index - r < REFUSAL_ROUNDS}

    def _deadline(self) -> float:
        """The round's wait: `deadline_s`, except for the first node of a new swarm while nobody has
        joined it yet (it would wait for no one): `alone_wait_s`."""
        if self.cfg.alone_wait_s is None or self.seen_peers:
            return self.cfg.deadline_s
        self.seen_peers = bool(self.cfg.peers) or bool(self.transport.peers())
        return self.cfg.deadline_s if self.seen_peers else min(self.cfg.deadline_s, self.cfg.alone_wait_s)

    def _admit(self, item: Received, round_index: int, gate: Gate, rejected: Counter) -> Packet | None:
        """The admitted packet, or None after counting why it was rejected."""
        try:
            return gate.check(item, round_index)
        except Rejected as e:
            rejected[e.reason] += 1
            log.warning("rejected packet %s from %s: %s", item.digest[:19], item.peer_id, e)
            if e.reason in REFUSED_FOR_ITS_SERVER:  # maybe another peer's genuine packet: get it from its sender
                self.transport.distrust(item.peer_id, item.digest)
            elif e.reason == "lockdown" and e.valid and item.peer_id not in self.implausible_at:
                self.transport.credit(item.peer_id, useful=False, taken=False)  # not misbehaviour: it keeps its link
                self.standing_by.add(item.peer_id)
        except Exception:  # a bug reached by a peer's bytes must not take the node down
            rejected["internal_error"] += 1
            log.exception("error while checking packet %s from %s; dropped", item.digest[:19], item.peer_id)
        return None

    def close(self, linger: bool = True) -> None:
        """Leave the swarm; first keep serving for `linger_s` so peers can fetch our last packet."""
        try:
            if linger and self.cfg.linger_s > 0:
                log.info("serving our last packet for %.0f s before leaving", self.cfg.linger_s)
                time.sleep(self.cfg.linger_s)
        finally:
            self.transport.close()

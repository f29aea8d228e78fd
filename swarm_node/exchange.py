"""Exchange: one round of rollout sharing between this node and its peers.

    offer:    encode this round's groups as a packet, serve it, announce its digest in our record
    collect:  pull peers' packets for rounds within the staleness bound, until `min_peers`
              new packets arrived or the deadline passed (never waits forever); per peer at most
              one packet per round and `max_peer_packets` / `max_peer_bytes` per call
    accept:   validate each packet (merge.accept_packet); count rejections by reason
    cap:      at most `max_peer_groups` peer groups, fair across peers

Vertical mode (the paper's default) accepts packets of rounds r - staleness .. r + staleness;
horizontal mode only round r, since only then are the prompts the same. Packets are identified
by their content digest: each is fetched and used at most once. Every offer or packet we do not
use for a peer-caused reason is counted in `swarm/packets_rejected` and `swarm/rejected/<reason>`
(docs/RELIABILITY.md lists the reasons); nothing a peer sends can crash the node.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from swarm_node.codec import PROTOCOL_VERSION, Group, Packet, digest, encode, tokenizer_fingerprint
from swarm_node.config import NodeConfig
from swarm_node.merge import Expectations, Rejected, accept_packet, cap_peer_groups
from swarm_node.swarm import Swarm, SwarmSettings

log = logging.getLogger(__name__)
SEEN_ROUNDS = 8  # digests of packets older than r - staleness - SEEN_ROUNDS are forgotten (stale anyway)
MAX_COLLECTS = 16  # collect calls per round at most (each either brings new packets or ends at the deadline)


class Exchange:
    """The node's side of the swarm: owns the transport, the seen-digest set and reject counters."""

    def __init__(self, cfg: NodeConfig):
        self.cfg, self.swarm, self.seen = cfg, None, set()
        self.seen_round: dict[str, int] = {}  # digest -> round, to forget old digests (bounded memory)
        self.rejected: Counter[str] = Counter()

    def start(self, policy, task) -> None:
        s = self.cfg.swarm
        self.policy, self.task = policy, task
        self.tokenizer = tokenizer_fingerprint(policy.tokenizer)
        settings = SwarmSettings(run_id=s.run_id, initial_peers=list(s.peers), identity_path=s.identity,
                                 host_maddrs=list(s.host_maddrs), announce_maddrs=list(s.announce_maddrs),
                                 fetch_timeout_s=s.fetch_timeout_s)
        self.swarm = Swarm(settings, model_id=policy.model_id, tokenizer=self.tokenizer, protocol=PROTOCOL_VERSION)
        self.swarm.start()
        log.info("peer id %s", self.swarm.peer_id)
        print(f"Others join this swarm with:  --peers {' '.join(self.swarm.visible_maddrs()[:1])}", flush=True)

    def round(self, r: int, policy_version: int, own: list[Group]) -> tuple[list[Group], dict]:
        """Offer our groups for round `r`, collect and validate peers'; returns (peer groups, metrics)."""
        s, start = self.cfg.swarm, time.perf_counter()
        before = dict(self.swarm.stats)
        packet = Packet(run_id=s.run_id, sender=self.swarm.peer_id, model_id=self.policy.model_id,
                        tokenizer=self.tokenizer, policy_version=policy_version, round=r, mode=s.mode, groups=own)
        data = encode(packet)
        key = digest(data)
        self._see(key, r)
        self.swarm.offer(r, policy_version, data, key)

        def wanted(k: int) -> bool:
            return k == r if s.mode == "horizontal" else abs(k - r) <= s.staleness

        self._forget(r - s.staleness - SEEN_ROUNDS)
        peers = self.swarm.peers()
        stale = self._skip_stale(peers, r if s.mode == "horizontal" else r - s.staleness)
        rejected = Counter({"stale": stale}) if stale else Counter()
        expect = Expectations(run_id=s.run_id, tokenizer=self.tokenizer, round=r, staleness=s.staleness,
                              max_tokens=self.cfg.rollout.max_new_tokens)
        accepted: dict[str, list[Group]] = {}
        n_received, n_accepted, tokens_in, completions_in, packet_bytes_in = 0, 0, 0, 0, 0
        checks: dict = {}
        t_end = time.monotonic() + s.deadline_s
        # Collect until `min_peers` distinct peers sent a packet we accept (a rejected packet does not
        # count, so a fast hostile peer cannot end the wait for honest ones), or the deadline.
        for _ in range(MAX_COLLECTS):
            received = self.swarm.collect(wanted, self.seen, min_packets=s.min_peers - len(accepted),
                                          deadline_s=max(0.0, t_end - time.monotonic()), dropped=rejected,
                                          count_peers=True, newest=r if s.mode == "horizontal" else r + s.staleness)
            n_received += len(received)
            for item in received:
                peer_packet = self._accept(item, expect, rejected, checks)
                if peer_packet is None:
                    continue
                accepted.setdefault(item.peer_id, []).extend(peer_packet.groups)
                n_accepted += 1
                packet_bytes_in += len(item.data)
                tokens_in += sum(len(c.tokens) for g in peer_packet.groups for c in g.completions)
                completions_in += sum(len(g.completions) for g in peer_packet.groups)
            if not received or len(accepted) >= s.min_peers or time.monotonic() >= t_end:
                break
        self.rejected.update(rejected)
        peer_groups = cap_peer_groups(accepted, s.max_peer_groups)
        stats = {"swarm/peers": len(peers), "swarm/packets_received": n_received,
                 "swarm/packets_accepted": n_accepted, "swarm/packets_rejected": sum(rejected.values()),
                 "swarm/peer_groups_used": len(peer_groups),
                 "swarm/bytes_out": self.swarm.stats.get("bytes_out", 0) - before.get("bytes_out", 0),
                 "swarm/bytes_in": self.swarm.stats.get("bytes_in", 0) - before.get("bytes_in", 0),
                 "swarm/packet_bytes_out": len(data), "swarm/packet_bytes_in": packet_bytes_in,
                 "swarm/tokens_out": sum(len(c.tokens) for g in own for c in g.completions),
                 "swarm/tokens_in": tokens_in, "swarm/completions_in": completions_in,
                 "swarm/rewards_corrected": checks.get("rewards_corrected", 0),
                 "swarm/fetch_timeouts": self.swarm.stats.get("fetch_timeouts", 0) - before.get("fetch_timeouts", 0),
                 "time/exchange_s": time.perf_counter() - start}
        stats.update({f"swarm/rejected/{reason}": n for reason, n in rejected.items()})
        return peer_groups, stats

    def _accept(self, item, expect: Expectations, rejected: Counter, checks: dict) -> Packet | None:
        """The checked packet, or None after counting why it was rejected."""
        self.seen_round[item.digest] = item.round
        try:
            return accept_packet(item.data, item.peer_id, expect, self.task, self.policy, offered_round=item.round,
                                 stats=checks)
        except Rejected as e:
            rejected[e.reason] += 1
            log.warning("rejected packet %s from %s: %s", item.digest[:19], item.peer_id, e)
            if e.reason == "sender_mismatch":  # maybe another peer's genuine packet: get it from its sender
                self.swarm.distrust(item.peer_id, item.digest)
                self.seen.discard(item.digest)
        except Exception:  # a bug reached by a peer's bytes must not take the node down
            rejected["internal_error"] += 1
            log.exception("error while checking packet %s from %s; dropped", item.digest[:19], item.peer_id)
        return None

    def _see(self, key: str, round_: int) -> None:
        self.seen.add(key)
        self.seen_round[key] = round_

    def _forget(self, oldest: int) -> None:
        """Drop digests of rounds before `oldest`: such offers are stale, so never fetched again anyway."""
        for key in [k for k, r in self.seen_round.items() if r < oldest]:
            del self.seen_round[key]
            self.seen.discard(key)

    def _skip_stale(self, peers, oldest: int) -> int:
        """Mark peers' offers older than round `oldest` as seen, so they are never fetched; count them."""
        count = 0
        for peer in peers:
            for round_, key, _size in peer.offers:
                if round_ < oldest and key not in self.seen:
                    self._see(key, round_)
                    count += 1
        return count

    def close(self, linger: bool = True) -> None:
        """Leave the swarm; first keep serving for `swarm.linger_s` so peers can fetch our last packet."""
        if self.swarm is None:
            return
        try:
            if linger and self.cfg.swarm.linger_s > 0:
                log.info("serving our last packet for %.0f s before leaving", self.cfg.swarm.linger_s)
                time.sleep(self.cfg.swarm.linger_s)
        finally:
            self.swarm.shutdown()
            self.swarm = None

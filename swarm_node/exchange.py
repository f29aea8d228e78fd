"""Exchange: one round of rollout sharing between this node and its peers.

    offer:    encode this round's groups as a packet, serve it, announce its digest in our record
    collect:  pull peers' packets for rounds within the staleness bound, until `min_peers`
              new packets arrived or the deadline passed (never waits forever)
    accept:   validate each packet (merge.accept_packet); count rejections by reason
    cap:      at most `max_peer_groups` peer groups, fair across peers

Vertical mode (the paper's default) accepts packets of rounds r - staleness .. r + staleness;
horizontal mode only round r, since only then are the prompts the same. Packets are identified
by their content digest: each is fetched and used at most once.
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


class Exchange:
    """The node's side of the swarm: owns the transport, the seen-digest set and reject counters."""

    def __init__(self, cfg: NodeConfig):
        self.cfg, self.swarm, self.seen = cfg, None, set()
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
        self.seen.add(key)
        self.swarm.offer(r, policy_version, data, key)

        def wanted(k: int) -> bool:
            return k == r if s.mode == "horizontal" else abs(k - r) <= s.staleness

        stale = self._skip_stale(r if s.mode == "horizontal" else r - s.staleness)
        received = self.swarm.collect(wanted, self.seen, min_packets=s.min_peers, deadline_s=s.deadline_s)
        accepted: dict[str, list[Group]] = {}
        n_accepted, tokens_in, completions_in, packet_bytes_in = 0, 0, 0, 0
        rejected = Counter({"stale": stale}) if stale else Counter()
        expect = Expectations(run_id=s.run_id, tokenizer=self.tokenizer, round=r, staleness=s.staleness)
        for item in received:
            try:
                peer_packet = accept_packet(item.data, item.peer_id, expect, self.task, self.policy)
                accepted.setdefault(item.peer_id, []).extend(peer_packet.groups)
                n_accepted += 1
                packet_bytes_in += len(item.data)
                tokens_in += sum(len(c.tokens) for g in peer_packet.groups for c in g.completions)
                completions_in += sum(len(g.completions) for g in peer_packet.groups)
            except Rejected as e:
                rejected[e.reason] += 1
                log.warning("rejected packet %s from %s: %s", item.digest[:19], item.peer_id, e)
        self.rejected.update(rejected)
        peer_groups = cap_peer_groups(accepted, s.max_peer_groups)
        stats = {"swarm/peers": len(self.swarm.peers()), "swarm/packets_received": len(received),
                 "swarm/packets_accepted": n_accepted, "swarm/packets_rejected": sum(rejected.values()),
                 "swarm/peer_groups_used": len(peer_groups),
                 "swarm/bytes_out": self.swarm.stats.get("bytes_out", 0) - before.get("bytes_out", 0),
                 "swarm/bytes_in": self.swarm.stats.get("bytes_in", 0) - before.get("bytes_in", 0),
                 "swarm/packet_bytes_out": len(data), "swarm/packet_bytes_in": packet_bytes_in,
                 "swarm/tokens_out": sum(len(c.tokens) for g in own for c in g.completions),
                 "swarm/tokens_in": tokens_in, "swarm/completions_in": completions_in, "time/exchange_s": time.perf_counter() - start}
        stats.update({f"swarm/rejected/{reason}": n for reason, n in rejected.items()})
        return peer_groups, stats

    def _skip_stale(self, oldest: int) -> int:
        """Mark peers' offers older than round `oldest` as seen, so they are never fetched; count them."""
        count = 0
        for peer in self.swarm.peers():
            for round_, key, _size in peer.offers:
                if round_ < oldest and key not in self.seen:
                    self.seen.add(key)
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

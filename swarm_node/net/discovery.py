"""Discovery in hivemind's DHT: our signed record, the validator that guards the key, peer lookup.

Each node of a run stores one record under the run's key (`records.record_key`), with subkey
"[owner:<its ssh-rsa public key>]", signed by that key and expiring after `record_ttl_s`; a
lookup returns every live, valid record but our own (protocol/SPEC.md section 11). This module
uses hivemind's public DHT API only; the private-attribute uses live in `hivemind.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections import OrderedDict
from pathlib import Path

import msgpack
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import P2P, PeerID
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr

from swarm_node.net import PeerInfo, SwarmError
from swarm_node.net.announce import Mesh
from swarm_node.net.conn_tags import ConnTags
from swarm_node.net.driver import MeshDriver, OldVersion
from swarm_node.net.fetch import StreamLimits
from swarm_node.net.hivemind_internals import dht_size_estimate, dial, is_old_version, open_stream
from swarm_node.net.identity import check_record_value, owner_key_of, owner_peer_id
from swarm_node.net.lanes import Kind, Lanes
from swarm_node.net.records import (ANNOUNCE_PROTOCOLS, MAX_MEMBER_BYTES, MAX_MEMBER_TTL_S, MAX_SIGNED_RECORD_BYTES,
                                    MEMBER_BUCKETS, STATUS_OK, Member, RecordError, make_member_record, member_bucket,
                                    member_key, parse_member_record, parse_record, record_key, send_announcement,
                                    serve_announcement)
from swarm_node.net.scores import PeerLimiter, TokenBucket, anchor_lanes, best_outbound, save_anchors

logger = logging.getLogger(__name__)
DHT_OP_TIMEOUT_S = 10.0  # one whole DHT get/store traversal (clamped to collect deadlines)
ANNOUNCE_TIMEOUT_S = 5.0  # one announcement exchange (dial + frame + reply) at most
MEMBER_TARGET = 256  # live membership records wanted in all (MEMBER_BUCKETS x half a bucket), whatever N
MAX_STRANGER_ANNOUNCES = 32  # announcement streams of peers we do not favour served at once; more are closed unread
STRANGER_TIMEOUT_S = 2.0  # ... each within this (its frame comes first: a stream held silent must not keep a slot)
MAX_VERDICTS = 8192  # signature verdicts remembered (the newest), so a replayed record costs no RSA operation
# RSA verifications of new records: at most VERIFY_RATE per second in all (burst VERIFY_BURST) and
# OWNER_VERIFY_BURST per owner key, refilled at OWNER_VERIFY_RATE. An honest owner writes one record
# per bucket per republish (every record_ttl_s / 3); past the budget a record is refused unverified.
VERIFY_RATE, VERIFY_BURST = 100.0, 200.0
OWNER_VERIFY_RATE, OWNER_VERIFY_BURST = 0.5, 8.0
MAX_OWNER_BUDGETS = 4096  # owner keys whose budget is remembered (the most recent)


def check_member_value(owner_ssh_key: bytes, value: bytes, expiration_time: float) -> str | None:
    """Checks of a v2 membership record value (signature stripped): schema, peer id bound to the
    owner key, expiry bound. None if valid, else the reason. Cheap: no signature check here."""
    return check_record_value(owner_ssh_key, value, expiration_time, parse=parse_member_record,
                              max_bytes=MAX_MEMBER_BYTES, max_ttl_s=MAX_MEMBER_TTL_S, ttl_name="MAX_MEMBER_TTL_S")


class RecordValidator(RecordValidatorBase):
    """Accepts only records under this run's key(s) whose subkey is ``[owner:<ssh-rsa key>]``, whose
    value matches the schema, whose ``peer_id`` is the libp2p peer id of that same key (a record
    cannot speak for another peer), and which are signed by that key (hivemind's
    RSASignatureValidator). The signature is checked last, so junk costs no RSA operation.

    v1 (`RecordValidator(key, run_id)`): the run's one peers key, v1 record schema.
    v2 (`RecordValidator.members(key, run_id)`): the run's MEMBER_BUCKETS membership keys."""

    def __init__(self, private_key: RSAPrivateKey, run_id: str, stats: dict | None = None, *,
                 keys: list[str] | None = None, check_value=check_record_value, max_bytes: int = MAX_SIGNED_RECORD_BYTES):
        self._rsa = RSASignatureValidator(private_key)
        self._key_ids = {DHTID.generate(source=k).to_bytes() for k in (keys or [record_key(run_id)])}
        self._check_value, self._max_bytes = check_value, max_bytes
        self.stats = stats if stats is not None else {"records_rejected": 0}
        self._verdicts: OrderedDict[bytes, bool] = OrderedDict()  # record fingerprint -> signature valid
        self._budget = TokenBucket(VERIFY_RATE, VERIFY_BURST)  # RSA verifications, all owners together
        self._owner_budgets: OrderedDict[bytes, TokenBucket] = OrderedDict()  # owner key -> its verifications

    @classmethod
    def members(cls, private_key: RSAPrivateKey, run_id: str, stats: dict | None = None) -> RecordValidator:
        return cls(private_key, run_id, stats, keys=[member_key(run_id, b) for b in range(MEMBER_BUCKETS)],
                   check_value=check_member_value, max_bytes=MAX_MEMBER_BYTES + 1024)

    @property
    def local_public_key(self) -> bytes:
        return self._rsa.local_public_key  # b"[owner:ssh-rsa AAAA...]", the subkey of our record

    def check(self, record: DHTRecord) -> str | None:
        """None if valid, else the reason."""
        if record.key not in self._key_ids:
            return "key is not one of this run's discovery keys"
        if record.subkey is None or len(record.value) > self._max_bytes:
            return "missing subkey or oversized value"
        owner = owner_key_of(record.subkey)
        if owner is None:  # checked first: RSASignatureValidator accepts records without an owner
            return "subkey must be exactly [owner:<ssh-rsa public key>]"
        if owner_peer_id(owner) is None:  # before any RSA operation: the key's owner chose its cost
            return "owner key refused: RSA e = 65537 with a 2048..4096-bit modulus only"
        reason = self._check_value(owner, self._rsa.strip_value(record), record.expiration_time)
        if reason is not None:
            return reason
        verdict = self._signature_ok(record, owner)
        return "verification budget spent" if verdict is None else None if verdict else "bad signature"

    def _signature_ok(self, record: DHTRecord, owner: bytes) -> bool | None:
        """The record's signature check, remembered: a replayed record costs no RSA operation. None:
        not checked, the owner's or everyone's verification budget is spent (refused, not remembered)."""
        fingerprint = hashlib.sha256(msgpack.packb(
            [record.key, record.subkey, record.value, record.expiration_time])).digest()
        if fingerprint in self._verdicts:
            self._verdicts.move_to_end(fingerprint)
            return self._verdicts[fingerprint]
        budget = self._owner_budgets.pop(owner, None) or TokenBucket(OWNER_VERIFY_RATE, OWNER_VERIFY_BURST)
        self._owner_budgets[owner] = budget  # most recent last
        while len(self._owner_budgets) > MAX_OWNER_BUDGETS:
            self._owner_budgets.popitem(last=False)
        if not budget.take() or not self._budget.take():
            self.stats["records_over_budget"] = self.stats.get("records_over_budget", 0) + 1
            return None
        try:
            ok = bool(self._rsa.validate(record))
        except Exception:  # hostile bytes must give a reason, never an exception inside a DHT RPC handler
            ok = False
        self._verdicts[fingerprint] = ok
        if len(self._verdicts) > MAX_VERDICTS:
            self._verdicts.popitem(last=False)
        return ok

    def validate(self, record: DHTRecord) -> bool:
        reason = self.check(record)
        if reason is not None:
            self.stats["records_rejected"] = self.stats.get("records_rejected", 0) + 1
            logger.debug("rejected DHT record: %s", reason)
        return reason is None

    def sign_value(self, record: DHTRecord) -> bytes:
        return self._rsa.sign_value(record)

    def strip_value(self, record: DHTRecord) -> bytes:
        return self._rsa.strip_value(record)

    @property
    def priority(self) -> int:
        return 10


def parse_initial_peers(maddrs: list[str]) -> list[tuple[PeerID, Multiaddr]]:
    """(peer id, transport address) of each `--peers` multiaddr; SwarmError names a malformed one."""
    out = []
    for s in maddrs:
        s = s.strip()
        if not s:
            continue
        try:
            m = Multiaddr(s)
            pid = PeerID.from_base58(m["p2p"])
            out.append((pid, m.decapsulate(Multiaddr(f"/p2p/{pid}"))))  # p2pd wants the transport part only
        except Exception:
            raise SwarmError(f"bad initial peer {s!r}: expected a multiaddr like "
                             "/ip4/1.2.3.4/tcp/31337/p2p/<peer id> (copy it from the other node's log)") from None
    return out


class PeerDirectory:
    """This run's records in the DHT: store ours, look up the others'. Runs on the transport's loop."""

    def __init__(self, dht: DHTNode, validator: RecordValidator, run_id: str, own_peer_id: str, stats: dict[str, int]):
        self.dht, self.validator, self.own_peer_id, self.stats = dht, validator, own_peer_id, stats
        self.key = record_key(run_id)
        self.lock = asyncio.Lock()  # one store at a time: a slow older store must not overwrite a newer record

    async def store(self, record: dict, ttl_s: float) -> bool:
        async with self.lock:
            try:
                ok = await asyncio.wait_for(self.dht.store(
                    self.key, record, time.time() + ttl_s, subkey=self.validator.local_public_key), DHT_OP_TIMEOUT_S)
            except Exception as e:
                logger.debug("record store failed: %r", e)
                ok = False
            self.stats["records_published" if ok else "publish_failures"] += 1
            return bool(ok)

    async def lookup(self, timeout: float) -> list[PeerInfo]:
        """Live, valid records of the run's other peers, newest per peer ([] if the lookup fails)."""
        try:
            found = await asyncio.wait_for(self.dht.get(self.key, latest=True), timeout)
        except Exception as e:
            logger.debug("peers lookup failed: %r", e)
            return []
        if found is None or not isinstance(found.value, dict):
            return []
        now, best = time.time(), {}
        for item in found.value.values():
            if item.expiration_time < now:
                continue
            try:
                info = parse_record(item.value)
            except RecordError:
                self.stats["records_rejected"] += 1
                continue
            if info.peer_id != self.own_peer_id and (
                    info.peer_id not in best or best[info.peer_id].updated_at < info.updated_at):
                best[info.peer_id] = info
        return sorted(best.values(), key=lambda p: p.peer_id)


class MemberDirectory:
    """Discovery v2's DHT part: our membership record in bucket H(peer id) mod MEMBER_BUCKETS, and
    reads of one random bucket that stop at the first holder (`DHTNode.get(latest=False)`). Holders
    keep at most MAX_BUCKET_ENTRIES records per bucket (`hivemind.cap_dictionary_values`), so no
    DHT value grows with the number of identities; a read considers at most `max_read` records."""

    def __init__(self, dht: DHTNode, validator: RecordValidator, run_id: str, own_peer_id: str, protocol: int,
                 stats: dict[str, int], max_read: int = 16):
        self.dht, self.validator, self.run_id, self.own_peer_id = dht, validator, run_id, own_peer_id
        self.protocol, self.stats, self.max_read = protocol, stats, max_read
        self.key = member_key(run_id, member_bucket(own_peer_id))

    async def store(self, addrs: list[str], ttl_s: float) -> bool:
        record = make_member_record(self.own_peer_id, self.protocol, addrs, time.time())
        try:
            ok = await asyncio.wait_for(self.dht.store(
                self.key, record, time.time() + ttl_s, subkey=self.validator.local_public_key), DHT_OP_TIMEOUT_S)
        except Exception as e:
            logger.debug("membership store failed: %r", e)
            ok = False
        self.stats["members_published" if ok else "publish_failures"] += 1
        return bool(ok)

    async def read(self, tries: int = 3) -> list[tuple[str, list[str]]]:
        """(peer id, multiaddrs) of up to `max_read` live members of our packet protocol, from the first
        of up to `tries` random buckets that has any ([] if none)."""
        for bucket in random.sample(range(MEMBER_BUCKETS), min(tries, MEMBER_BUCKETS)):
            self.stats["member_reads"] += 1
            try:
                found = await asyncio.wait_for(self.dht.get(member_key(self.run_id, bucket)), DHT_OP_TIMEOUT_S)
            except Exception as e:
                logger.debug("membership read failed: %r", e)
                continue
            members = self.parse(found.value if found is not None else None)
            if members:
                return [(m.peer_id, m.addrs) for m in members]
        return []

    def parse(self, value) -> list[Member]:
        """A random sample of at most `max_read` live entries, parsed; others' protocols left out."""
        if not isinstance(value, dict):
            return []
        now = time.time()
        items = [item for item in value.values() if item.expiration_time >= now]
        out = []
        for item in random.sample(items, min(self.max_read, len(items))):
            try:
                member = parse_member_record(item.value)
            except RecordError:
                self.stats["records_rejected"] += 1
                continue
            if member.peer_id != self.own_peer_id and member.protocol == self.protocol:
                out.append(member)
        return out


class PushDiscovery:
    """Discovery v2 on a running P2P daemon: the announcement mesh (`announce.Mesh`, driven by a
    `MeshDriver`) over `ANNOUNCE_PROTOCOL` streams (a neighbour's on its lane, `lanes.py`), plus our
    membership record. Runs on the transport's loop; `stats` gets announces_* and member_* counters."""

    def __init__(self, p2p: P2P, mesh: Mesh, members: MemberDirectory, stats: dict[str, int],
                 limiter: PeerLimiter | None = None, anchors_path: Path | None = None,
                 kinds: dict[str, Kind] | None = None, lane_secret: bytes | None = None):
        self.p2p, self.mesh, self.members, self.stats = p2p, mesh, members, stats
        self.anchors_path = anchors_path  # where our best outbound neighbours are kept for the next start
        self.anchors: tuple[dict[str, list[str]], dict[str, str]] = ({}, {})  # as last saved: addresses, lanes
        self.limiter = limiter or PeerLimiter()  # per-peer stream rates, graylist (scores.py)
        self.limiter.on_graylist = self._graylisted
        # announcements and `kinds` (fetch): ids per neighbour, the public ones shut during a flood
        self.lanes = Lanes(p2p, {"announce": Kind(ANNOUNCE_PROTOCOLS, self.serve), **(kinds or {})},
                           secret=lane_secret, misused=self._misused)
        self.lanes.remember(anchor_lanes(anchors_path))  # our anchors' lanes for us, from our last run
        self.tags = ConnTags(p2p)  # neighbours are trimmed last by p2pd's connection manager
        self.driver = MeshDriver(mesh, self.contact, members.read)
        # announcements being answered: one per peer, MAX_STRANGER_ANNOUNCES of peers we do not favour
        self.serving = StreamLimits(max_per_peer=1, max_open=MAX_STRANGER_ANNOUNCES)
        self.addrs: list[str] = []
        self.member_ttl_s = MAX_MEMBER_TTL_S

    async def listen(self, addrs: list[str], member_ttl_s: float) -> None:
        self.addrs, self.member_ttl_s = addrs, member_ttl_s
        await self.lanes.listen()  # the versioned id and, during the migration, the legacy one

    async def start(self, own: dict) -> list[asyncio.Task]:
        """Dial the initial peers now; returns the background tasks (mesh upkeep, membership record)."""
        self.mesh.set_own(**own)
        await self.driver.tick()
        loop = asyncio.get_running_loop()
        return [loop.create_task(self.driver.run()), loop.create_task(self._member_loop()),
                loop.create_task(self._lane_loop())]

    def _misused(self, sender: str) -> None:
        """`sender` opened another peer's lane (its id read from identify): misbehaviour, once it is not graylisted
        already (each such stream counted again inflated the graylist count by thousands: red team 23)."""
        if not self.limiter.graylisted(sender):
            self.limiter.misbehaved(sender)

    def _graylisted(self, peer: str, seconds: float) -> None:
        self.mesh.graylist(peer, time.time() + seconds, time.time())
        self.lanes.close_soon(peer)  # its streams die in p2pd from now on

    async def _lane_loop(self) -> None:
        """Every second: only neighbours and the peers being dialled keep a lane; the public ids are back after a shield;
        p2pd's connection manager tags the neighbours."""
        while True:
            await asyncio.sleep(1.0)
            await self.tags.keep(set(self.mesh.neighbors))  # a failure is logged there, and tried again next time
            try:
                await self.lanes.keep(lambda: set(self.mesh.neighbors) | set(self.driver.in_flight))
                await self.lanes.reconcile()
            except Exception as e:  # p2pd gone: the transport is closing
                logger.debug("lanes: %r", e)

    def credit(self, peer: str, useful: bool, taken: bool = True) -> None:
        """`peer` delivered a packet we took (`Mesh.credit`); the anchors file follows the best outbound neighbours."""
        self.mesh.credit(peer, time.time(), useful, taken)
        best = best_outbound(self.mesh.neighbors, self.mesh.params.out_quota)
        lanes = {p: self.lanes.theirs[p] for p in best if p in self.lanes.theirs}
        if self.anchors_path is not None and best and (best, lanes) != self.anchors:
            try:
                save_anchors(self.anchors_path, best, lanes)
                self.anchors = (best, lanes)
            except OSError as e:
                logger.warning("cannot save the anchor neighbours to %s: %s", self.anchors_path, e)

    def publish(self, own: dict) -> None:
        self.mesh.set_own(**own)
        self.driver.push()

    async def close(self) -> None:
        await self.driver.leave()  # neighbors drop us at once instead of after ttl_s
        await self.driver.close()
        self.lanes.shield.cancel()

    async def contact(self, peer: str, addrs: list[str], announcement: dict) -> tuple[dict, str]:
        """One announcement exchange with `peer` (dialling `addrs` if not connected): its reply, and the
        remote address of the connection it came over (what the per-subnet limit reads, `scores.crowded`).
        Raises OldVersion if it does not speak discovery v2, anything else if unreachable."""
        pid = PeerID.from_base58(peer)
        try:  # a candidate is told its lane, registered once it answers ok (`want`): dials to made-up ones cost p2pd
            #     nothing then (each id changed is an identify push to every connected peer: red team 24)
            announcement = announcement if announcement.get("leaving") else {**announcement, **(
                await self.lanes.give(peer) if peer in self.mesh.neighbors else {"lane": self.lanes.token(peer)})}
        except Exception as e:  # p2pd refused the lane: the peer reaches us on the public ids
            logger.debug("no lane for %s: %r", peer, e)
        protos = self.lanes.protocols(peer, "announce")

        async def exchange() -> dict:
            try:
                info, reader, writer = await open_stream(self.p2p, pid, protos)
            except Exception as e:
                if is_old_version(e) and peer not in self.mesh.neighbors:  # a neighbour spoke v2: shielded, not old
                    raise OldVersion(peer) from None
                if not addrs:
                    raise
                await dial(self.p2p, pid, [Multiaddr(a) for a in addrs])
                info, reader, writer = await open_stream(self.p2p, pid, protos)
            try:
                if info.peer_id != pid:
                    raise SwarmError(f"stream to {peer} reached {info.peer_id}")
                reply, sent, received = await send_announcement(reader, writer, announcement)
            finally:
                writer.close()
            self._count(sent, received, "announces_sent")
            ok = isinstance(reply, dict) and reply.get("status") == STATUS_OK
            self.lanes.heard(peer, reply if ok else {})
            if ok and not announcement.get("leaving"):
                self.lanes.want(peer)  # our neighbour now, unless we are full: `keep` then drops the lane
            return reply, str(info.addr)

        try:
            return await asyncio.wait_for(exchange(), ANNOUNCE_TIMEOUT_S)
        except OldVersion:
            raise
        except (Exception, asyncio.TimeoutError):
            self.stats["announce_failures"] += 1
            raise

    async def serve(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one announcement; one stream per peer at a time, within the peer's rate (`scores.PeerLimiter`).
        Peers we favour (`favoured`) are always served; others share MAX_STRANGER_ANNOUNCES slots and the
        newcomer budget, and get STRANGER_TIMEOUT_S: 64 cheap ids holding silent streams filled one shared
        cap and shut our neighbours' pushes out (red team 7). Any stream refused is closed before anything is read."""
        peer = str(info.peer_id)
        favoured = self.favoured(peer)
        if not self.limiter.allow(peer, "announce") or not self.serving.admit(peer, favoured):  # over_rate counted
            writer.close()
            return
        if not favoured and not self.limiter.allow_newcomer(str(info.addr)):
            self.serving.release(peer, favoured)
            writer.close()
            return
        refused = self.mesh.refused.total()
        try:
            received, sent = await asyncio.wait_for(serve_announcement(reader, writer, lambda obj: self.answer(
                peer, obj, str(info.addr))), ANNOUNCE_TIMEOUT_S if favoured else STRANGER_TIMEOUT_S)
            self._count(sent, received, "announces_received")
        except Exception as e:
            logger.debug("serving an announcement to %s failed: %r", peer, e)
        finally:
            self.stats["announces_refused"] += self.mesh.refused.total() - refused
            self.serving.release(peer, favoured)
            writer.close()

    def answer(self, peer: str, obj: dict, addr: str) -> dict:
        """The mesh's reply to `peer`'s announcement; a neighbour's tells it its lane."""
        reply = self.mesh.receive(peer, obj, time.time(), addr)
        ours = reply.get("status") == STATUS_OK and peer in self.mesh.neighbors
        self.lanes.heard(peer, obj if ours else {})
        return {**reply, **self.lanes.want(peer)} if ours else reply

    def favoured(self, peer: str) -> bool:
        """Whether `peer` is served outside the strangers' shared slots: a neighbour, an initial peer or an
        anchor (each one stream at a time: D + 2 neighbours and the peers the user named)."""
        mesh = self.mesh
        return peer in mesh.neighbors or peer in mesh.initial or peer in mesh.anchors

    def gauges(self) -> dict[str, int]:
        """Neighbors lost (idle or graylisted), neighbors we dialled, neighbors that delivered lately, knockers
        fetched from while starving and those whose packets we took; plain ints and a copy: safe to read
        from another thread."""
        scores = list(self.mesh.scores().values())
        return {"neighbors_evicted": self.mesh.evicted_total, "mesh_outbound": sum(s["outbound"] for s in scores),
                "knocker_turns": self.mesh.knockers.tried, "knockers_proven": self.mesh.knockers.delivered_total,
                "mesh_credited": sum(s["credits"] > 0 and s["rounds_idle"] < self.mesh.params.idle_rounds
                                     for s in scores)}

    def _count(self, sent: int, received: int, what: str) -> None:
        self.stats[what] += 1
        self.stats["announce_bytes_out"] += sent
        self.stats["announce_bytes_in"] += received

    async def _member_loop(self) -> None:
        """Every member_ttl_s / 3, store our membership record with probability min(1, MEMBER_TARGET / N),
        N the DHT's estimated size: about MEMBER_TARGET live records in all, so the load on the buckets'
        holders stays flat however large the swarm (the records only seed joiners' candidates)."""
        while True:
            if random.random() < write_probability(dht_size_estimate(self.members.dht)):
                await self.members.store(self.addrs, self.member_ttl_s)
            await asyncio.sleep(self.member_ttl_s / 3)


def write_probability(swarm_size: float) -> float:
    """Chance that a node refreshes its membership record in one interval: with 3 intervals per TTL,
    about 3 p N = MEMBER_TARGET records are live. Every node writes while N <= MEMBER_TARGET / 3."""
    return min(1.0, MEMBER_TARGET / (3 * max(1.0, swarm_size)))
